// conveyor/stage/detail/reorder_buffer.hpp: restores input order behind parallel workers
// (an ordered map's, the GPU segment's lanes, a sink's).
//
//   detail::reorder_buffer<out> rb{window, out_link, ctl};
//   if (!rb.admit(pos)) return;                // worker: wait until pos fits the window
//   rb.deposit(pos, std::move(result));        // emits every consecutive ready result
//   rb.skip(pos);                              // pos has no result (failed alone, expired)
//
// Thread-safety: admit() and deposit() from any worker; one emitter at a time, chosen by
// the emitting_ flag (see emit()). discard() after every worker has joined.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/link.hpp"

namespace conveyor::detail {

// @throws config_error unless window is a power of two >= 2 (an internal error).
void check_reorder_window(std::size_t window);

// Restores input order behind parallel workers. Worker with input position p deposits
// its result in slot p % window; whoever deposits the oldest missing position becomes
// the emitter and pushes every consecutive ready result downstream. A worker may start
// position p only when p < emitted + window, so the buffer never overflows and the
// oldest item can always be deposited (no deadlock).
template <class T>
class reorder_buffer {
 public:
  // window: a power of two (a slot is found with a mask, not a division per item).
  reorder_buffer(std::size_t window, link<T>* out, control& ctl)
      : window_(window), mask_(window - 1), slots_(window), out_(out), ctl_(ctl) {
    check_reorder_window(window);
  }

  // Blocks until position p may be deposited; false if the pipeline is stopping. A wait
  // runs through wait_via(w), which must call w(timing) (timing may be null): the
  // caller's metrics measure it (worker_probe::wait_as).
  template <class WaitVia>
  bool admit(std::size_t p, WaitVia&& wait_via) noexcept {
    auto ok = [&] {
      // acquire: pairs with the release store of emitted_ in emit().
      return p < emitted_.load(std::memory_order_acquire) + window_ || ctl_.is_stopping();
    };
    if (!ok()) {
      wait_via([&](wait_timing* timing) noexcept {
        room_.wait(ok, timing);
        return true;
      });
    }
    return !ctl_.is_stopping();
  }
  bool admit(std::size_t p) noexcept {
    return admit(p, [](auto&& wait) noexcept { return wait(nullptr); });
  }

  // Stores the result for position p (admitted) and emits whatever became consecutive,
  // through push(envelope<T>&&) -> bool: a push downstream that blocks while there is no
  // room, false once the ring is closed (the caller's, so its metrics see the wait).
  template <class Push>
  void deposit(std::size_t p, envelope<T>&& v, Push&& push) noexcept {
    slot& s = slots_[p & mask_];
    s.value.emplace(std::move(v));
    // seq_cst: Dekker with the emitter's release of emitting_ and its re-check of this
    // slot in emit(): either it sees this store, or our exchange below sees it gone.
    s.ready.store(p + 1, std::memory_order_seq_cst);
    emit(push);
  }
  void deposit(std::size_t p, envelope<T>&& v) noexcept {
    deposit(p, std::move(v), [this](envelope<T>&& e) noexcept { return out_->push(std::move(e)); });
  }

  // Position p (admitted) leaves nothing: its item failed alone or expired. The
  // positions after it do not wait for it.
  template <class Push>
  void skip(std::size_t p, Push&& push) noexcept {
    slot& s = slots_[p & mask_];
    // seq_cst: as in deposit(); the slot's value stays empty.
    s.ready.store(p + 1, std::memory_order_seq_cst);
    emit(push);
  }
  void skip(std::size_t p) noexcept {
    skip(p, [this](envelope<T>&& e) noexcept { return out_->push(std::move(e)); });
  }

  // Wakes admit() waiters after a stop.
  void wake() noexcept { room_.notify(); }

  void close_output() noexcept { out_->close(); }

  // After every thread has joined: drops what is still held back (a stop left a gap
  // before it) and returns how many items that was, for the cancelled count.
  std::uint64_t discard() noexcept {
    std::uint64_t n = 0;
    for (slot& s : slots_) {
      if (s.value) n += s.value->items();
      s.value.reset();
      s.ready.store(0, std::memory_order_relaxed);  // relaxed: no other thread is left
    }
    return n;
  }

 private:
  struct slot {
    std::atomic<std::size_t> ready{0};  // position + 1 of the value held, 0 if none
    std::optional<envelope<T>> value;
  };

  template <class Push>
  void emit(Push& push) noexcept {
    for (;;) {
      // acquire: pairs with the release store of emitting_ below by the previous
      // emitter; its writes to next_ and the slots are visible to us.
      if (emitting_.exchange(true, std::memory_order_seq_cst)) return;  // someone emits
      std::size_t next = next_;
      for (;;) {
        slot& s = slots_[next & mask_];
        // acquire: pairs with the store of ready in deposit(); the value is written.
        if (s.ready.load(std::memory_order_acquire) != next + 1) break;
        if (!s.value) {                                 // a skipped position: nothing to push
          s.ready.store(0, std::memory_order_relaxed);  // relaxed: as below
          advance(++next);
          continue;
        }
        envelope<T> v = std::move(*s.value);
        s.value.reset();
        s.ready.store(0, std::memory_order_relaxed);  // relaxed: only the emitter reads it next
        advance(++next);
        const std::uint64_t n = v.items();
        if (!push(std::move(v))) ctl_.cancel(n);  // stopping: the rest is drained later
      }
      // seq_cst: see deposit(); after releasing, re-check the slot we stopped at, since
      // its depositor may have found emitting_ still set and left it to us.
      emitting_.store(false, std::memory_order_seq_cst);
      if (slots_[next & mask_].ready.load(std::memory_order_seq_cst) != next + 1) return;
    }
  }

  // The emitter, past position next - 1: the slots before next are free for reuse.
  void advance(std::size_t next) noexcept {
    next_ = next;
    // release: pairs with the acquire in admit(); the slot is free for reuse.
    emitted_.store(next, std::memory_order_release);
    room_.notify();
  }

  const std::size_t window_;
  const std::size_t mask_;  // window_ - 1
  std::vector<slot> slots_;
  link<T>* out_;
  control& ctl_;
  std::size_t next_ = 0;  // emitter only (guarded by emitting_)
  alignas(cache_line_size) std::atomic<bool> emitting_{false};
  alignas(cache_line_size) std::atomic<std::size_t> emitted_{0};
  detail::wait_point room_;
};

}  // namespace conveyor::detail
