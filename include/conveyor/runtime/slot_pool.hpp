// conveyor/runtime/slot_pool.hpp: a fixed set of staging slots (pinned in, device in,
// device out, pinned out), each handed out again only after the stream work behind its
// last use has completed.
//
//   conveyor::slot_pool<R, float> pool{4, batch * features, batch * classes};
//   while (auto* s = pool.acquire()) {                // blocks; nullptr once close()d
//     fill(s->pinned_in);                             // safe: no stream still reads it
//     copy_async(s->device_in, s->pinned_in, lane);  ... copy_async(s->pinned_out, s->device_out, lane);
//     pool.release(s, lane);                          // reusable once lane passes this point
//   }
//
// acquire() takes a slot off the free list, then waits for the event recorded at its last
// release(slot, stream): query first, then block on it. So no host write can land in a
// slot that a stream may still read, and no stream write in one the host reads (DESIGN
// invariant 1). All memory (four buffers, one event per slot, the free list) is allocated
// at construction; acquire and release allocate nothing. Per-slot regions start on
// 256-byte boundaries when the element size divides 256.
// Thread-safety: acquire / try_acquire / release / close from any number of threads. A
// slot belongs to whoever acquired it until release(). close() cancels blocked acquire()s
// (they return nullptr); a thread already waiting for a slot's event finishes that wait.
// The destructor closes the pool and waits for every slot's last event, so no stream is
// still copying into memory being freed.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "conveyor/base/config.hpp"
#include "conveyor/base/power_of_two.hpp"
#include "conveyor/ring/mpmc_ring.hpp"
#include "conveyor/runtime/concepts.hpp"
#include "conveyor/runtime/event_timing.hpp"

namespace conveyor {

template <runtime R, class In, class Out = In>
class slot_pool {
 public:
  template <class T>
  using pinned_span = typename R::template pinned_span<T>;
  template <class T>
  using device_span = typename R::template device_span<T>;
  using stream_ref = typename R::stream_ref;

  // Most slots a pool holds: far above any useful pipeline depth.
  static constexpr std::size_t max_slots = std::size_t{1} << 16;

  struct slot {
    pinned_span<In> pinned_in;
    device_span<In> device_in;
    device_span<Out> device_out;
    pinned_span<Out> pinned_out;
    std::size_t index = 0;

   private:
    friend class slot_pool;
    typename R::event done_{event_timing::disabled};  // recorded at the last release
    // relaxed everywhere: a misuse detector (double release, foreign slot); the free
    // list's release/acquire already orders the slot's data between owners.
    std::atomic<bool> in_use_{false};
  };

  // @throws config_error on 0 slots, 0 elements, more than max_slots slots, or a region
  // above 1 TiB; the runtime's allocation error (bytes and pool label) when memory runs out.
  // wait: how acquire() and the destructor wait for a slot's last use (see event_wait).
  slot_pool(std::size_t slots, std::size_t in_elems, std::size_t out_elems,
            event_wait wait = event_wait::block)
      : count_(check(slots, in_elems, out_elems)),
        in_stride_(stride<In>(in_elems)),
        out_stride_(stride<Out>(out_elems)),
        pinned_in_(count_ * in_stride_, "slot_pool pinned in"),
        device_in_(count_ * in_stride_, "slot_pool device in"),
        device_out_(count_ * out_stride_, "slot_pool device out"),
        pinned_out_(count_ * out_stride_, "slot_pool pinned out"),
        slots_(std::make_unique<slot[]>(count_)),
        free_(detail::next_power_of_two(2 * count_)) {
    for (std::size_t i = 0; i < count_; ++i) {
      slot& s = slots_[i];
      s.pinned_in = pinned_in_.span().subspan(i * in_stride_, in_elems);
      s.device_in = device_in_.span().subspan(i * in_stride_, in_elems);
      s.device_out = device_out_.span().subspan(i * out_stride_, out_elems);
      s.pinned_out = pinned_out_.span().subspan(i * out_stride_, out_elems);
      s.index = i;
      if (wait != event_wait::block) s.done_ = typename R::event{event_timing::disabled, wait};
      push_free(&s);
    }
  }

  slot_pool(const slot_pool&) = delete;
  slot_pool& operator=(const slot_pool&) = delete;

  ~slot_pool() {
    close();
    for (std::size_t i = 0; i < count_; ++i) {
      try {
        slots_[i].done_.synchronize();
      } catch (...) {  // the stream failed; its error is reported where it is waited on
      }
    }
  }

  // A free slot whose last use has completed; nullptr once close() was called.
  // @note blocks while no slot is free, then while the slot's last event is pending.
  // @throws the runtime's error if the stream behind the slot's last use failed (the slot
  // goes back to the free list first).
  slot* acquire() {
    if (closed()) return nullptr;
    std::optional<slot*> s = free_.pop();
    if (!s || closed()) return nullptr;  // a slot popped after close() stays out: pool is done
    try {
      if (!(*s)->done_.query()) (*s)->done_.synchronize();
    } catch (...) {
      push_free(*s);
      throw;
    }
    take(**s);
    return *s;
  }

  // As acquire(), but never waits for a slot or an event: nullptr when the slot at the
  // head of the free list is still in use by its stream (it goes to the back).
  // @throws as acquire().
  slot* try_acquire() {
    if (closed()) return nullptr;
    std::optional<slot*> s = free_.try_pop();
    if (!s) return nullptr;
    bool ready = false;
    try {
      ready = (*s)->done_.query();
    } catch (...) {
      push_free(*s);
      throw;
    }
    if (!ready) {
      push_free(*s);  // back to the end of the list; still pending
      return nullptr;
    }
    take(**s);
    return *s;
  }

  // Records the slot's event on s, behind the work that uses it; the slot is handed out
  // again once s passes that point. Never blocks (unless s's queue is full, host runtime).
  // @throws config_error for a slot not acquired from this pool, or released twice.
  void release(slot* s, stream_ref st) {
    give_back_check(s);
    s->done_.record(st);
    push_free(s);
  }

  // For a slot with no stream work pending on it (for example acquired, then unused).
  // @throws config_error for a slot not acquired from this pool, or released twice.
  void release(slot* s) {
    give_back_check(s);
    push_free(s);
  }

  // Cancels blocked acquire() calls; later ones return nullptr. Idempotent.
  void close() noexcept {
    // release: pairs with the acquire load in closed().
    closed_.store(true, std::memory_order_release);
    free_.close();
  }

  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }
  std::size_t size() const noexcept { return count_; }

 private:
  static std::size_t check(std::size_t slots, std::size_t in_elems, std::size_t out_elems) {
    CONVEYOR_EXPECTS(slots >= 1 && slots <= max_slots,
                     "slot_pool: slots must be in [1, 65536], got " + std::to_string(slots) +
                         "; 2-4 per lane is enough to overlap copies and compute");
    CONVEYOR_EXPECTS(in_elems >= 1 && out_elems >= 1,
                     "slot_pool: in_elems and out_elems must be >= 1 (got " +
                         std::to_string(in_elems) + ", " + std::to_string(out_elems) +
                         "); size them for the largest batch");
    constexpr std::size_t limit = std::size_t{1} << 40;
    CONVEYOR_EXPECTS(
        in_elems <= limit / sizeof(In) / slots && out_elems <= limit / sizeof(Out) / slots,
        "slot_pool: " + std::to_string(slots) + " slots of " + std::to_string(in_elems) + " in / " +
            std::to_string(out_elems) +
            " out elements exceed 1 TiB per region; check the units "
            "(elements per slot, not bytes)");
    return slots;
  }

  // Elements between slot starts: rounded up so each slot starts on a 256-byte boundary
  // when the element size divides 256 (coalesced kernels, full-speed DMA).
  template <class T>
  static std::size_t stride(std::size_t elems) noexcept {
    if (256 % sizeof(T) != 0) return elems;
    const std::size_t per_line = 256 / sizeof(T);
    return (elems + per_line - 1) / per_line * per_line;
  }

  void take(slot& s) noexcept { s.in_use_.store(true, std::memory_order_relaxed); }

  void give_back_check(slot* s) {
    CONVEYOR_EXPECTS(s != nullptr && s->index < count_ && s == &slots_[s->index],
                     "slot_pool::release: the slot does not belong to this pool");
    CONVEYOR_EXPECTS(s->in_use_.exchange(false, std::memory_order_relaxed),
                     "slot_pool::release: slot " + std::to_string(s->index) +
                         " released twice (or never acquired)");
  }

  void push_free(slot* s) noexcept {
    // The list never holds more than count_ of its 2 * count_ cells, but a Vyukov ring's
    // try_push() can still fail for a moment while a concurrent pop of the cell it needs
    // is finishing. push() waits that out instead of losing the slot. It fails only after
    // close(): the slot then stays out, and the destructor still waits for its event.
    (void)free_.push(s);
  }

  const std::size_t count_;
  const std::size_t in_stride_;
  const std::size_t out_stride_;
  typename R::template pinned_buffer<In> pinned_in_;
  typename R::template device_buffer<In> device_in_;
  typename R::template device_buffer<Out> device_out_;
  typename R::template pinned_buffer<Out> pinned_out_;
  std::unique_ptr<slot[]> slots_;
  mpmc_ring<slot*> free_;
  std::atomic<bool> closed_{false};
};

}  // namespace conveyor
