// conveyor/ring/spsc_ring.hpp: bounded single-producer/single-consumer lock-free ring.
//
//   conveyor::spsc_ring<job> ring{1024};     // capacity: a power of two >= 2
//   if (!ring.try_push(std::move(j))) ...    // producer: never blocks; false if full/closed
//   if (!ring.try_emplace(a, b)) ...         //   the same, constructing job{a, b} in its slot
//   ring.push(std::move(j));                 // producer: blocks while full; false once closed
//   while (auto j = ring.pop()) use(*j);     // consumer: blocks while empty; nullopt once
//                                            //   closed *and* drained
//   ring.close();                            // any thread: wakes both sides
//
// Each slot carries a sequence number that says whose turn it is (lap k of position p:
// seq == p when the producer may fill it, p + 1 when the consumer may take it; taking
// sets p + capacity, the next lap's turn), so neither side ever reads the other's index:
// the producer looks at the slot it is about to fill, the consumer at the slot it is
// about to take, and the only lines that travel between the cores are the slots' own.
// A Lamport ring (even with index caches) also ships the other side's index line on
// every item once one side catches up with the other, which it does whenever the ring
// runs nearly full or nearly empty - the common state of a pipeline hop. Against the
// Lamport ring this replaced, in alternating runs (benchmarks/RESULTS.md, "Slot sequence
// numbers"): round trips 2x as fast, throughput at capacity 65536 4x, at 1024 the same,
// the trivial pipeline 1.1-1.7x. The price: a std::size_t per slot (more where T is
// aligned beyond it). Each side's index lives on its own cache line, written only by its
// owner; the other side reads it only in size_approx(). Blocking calls spin briefly,
// then sleep (detail::wait_point).
//
// Marks (internal, detail::ring_access, for a pipeline link that grows by moving to a
// deeper ring: stage/detail/link.hpp): the producer may leave a mark instead of an
// element, a slot whose turn reads position + 2 (never a turn of that slot otherwise,
// at capacity >= 4), which says "the rest follows elsewhere". The consumer finds it where
// the next element would be: try_pop() and pop() return nullopt there (pop() without
// waiting), and only ring_access::take_mark() takes it. The public calls never make one.
//
// Thread-safety: exactly one producer thread (try_push/push) and one consumer thread
// (try_pop/pop) at a time; close(), closed(), capacity() and size_approx() from any thread.
// A push racing with a close() from a third thread may still be accepted; such an
// element is either popped or destroyed with the ring.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/ring/detail/access.hpp"
#include "conveyor/ring/detail/storage.hpp"
#include "conveyor/ring/detail/wait.hpp"

namespace conveyor {

template <class T>
class spsc_ring {
  static_assert(std::is_nothrow_destructible_v<T>, "spsc_ring: T must be nothrow destructible");
  static_assert(std::is_move_constructible_v<T>, "spsc_ring: T must be move constructible");

 public:
  using value_type = T;

  // @throws config_error unless capacity is a power of two in [2, 2^30].
  explicit spsc_ring(std::size_t capacity)
      : capacity_((detail::check_ring_capacity("spsc_ring", capacity), capacity)),
        mask_(capacity - 1),
        slots_(capacity) {
    // Slot i is the producer's for position i first. Published with the ring itself:
    // whatever hands the ring to the producer and consumer threads orders these stores.
    for (std::size_t i = 0; i < capacity; ++i) ::new (static_cast<void*>(slots_.data() + i)) cell(i);
  }

  ~spsc_ring() {
    // The threads are done: their own indices say which positions hold an element or a
    // mark; the turns tell the two apart.
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);
    for (std::size_t i = consumer_.head.load(std::memory_order_relaxed); i != tail; ++i)
      if (slot(i)->seq.load(std::memory_order_relaxed) == i + 1) std::destroy_at(slot(i)->element());
  }

  spsc_ring(const spsc_ring&) = delete;
  spsc_ring& operator=(const spsc_ring&) = delete;

  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_push(T&& v) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return emplace(std::move(v));
  }
  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_push(const T& v) noexcept(
      std::is_nothrow_copy_constructible_v<T>) {
    return emplace(v);
  }
  // As try_push(T(args...)), but constructs the element in its slot: no temporary to
  // copy. The arguments are used only when it succeeds (false: full or closed).
  template <class... Args>
    requires std::is_constructible_v<T, Args&&...>
  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_emplace(Args&&... args) noexcept(
      std::is_nothrow_constructible_v<T, Args&&...>) {
    return emplace(std::forward<Args>(args)...);
  }

  std::optional<T> try_pop() noexcept(std::is_nothrow_move_constructible_v<T>) {
    return try_pop(nullptr);
  }

  // As try_pop(); also stores the element's position: how many elements were pushed
  // before it (the same contract as mpmc_ring's, so code that restores order after a
  // ring works over either).
  std::optional<T> try_pop(std::size_t* position) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return take(position);
  }

  // Blocks while full. Returns false, and drops v, once the ring is closed.
  // @note blocks the calling (producer) thread.
  bool push(T v) noexcept(std::is_nothrow_move_constructible_v<T>) {
    return push_impl(std::move(v), nullptr);
  }

  // Blocks while empty. Returns nullopt only when the ring is closed and drained.
  // @note blocks the calling (consumer) thread.
  std::optional<T> pop() noexcept(std::is_nothrow_move_constructible_v<T>) {
    return pop_impl(nullptr, nullptr);
  }
  // As pop(); also stores the element's position (see try_pop(std::size_t*)).
  std::optional<T> pop(std::size_t* position) noexcept(std::is_nothrow_move_constructible_v<T>) {
    return pop_impl(position, nullptr);
  }

  // As pop(), but gives up at the deadline: nullopt then means timed out, or closed and
  // drained (closed() tells which).
  // @note blocks the calling (consumer) thread until the deadline at most.
  std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return pop_impl(nullptr, &deadline);
  }

  void close() noexcept {
    // release: pairs with the acquire load in closed(); everything the closing thread
    // pushed before close() is visible to a consumer that sees the flag.
    closed_.store(true, std::memory_order_release);
    not_empty_.notify_now();
    not_full_.notify_now();
  }

  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }
  std::size_t capacity() const noexcept { return capacity_; }

  // A snapshot that may be stale by the time it returns; never above capacity().
  std::size_t size_approx() const noexcept {
    // relaxed: an estimate. From a third thread the two loads may see the producer run
    // ahead in between (more than capacity: clamped) or, as nothing orders them for it,
    // a tail older than the head (negative: empty). The consumer itself always reads a
    // tail at least as far as its head (see emplace()).
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);
    const auto n = static_cast<std::ptrdiff_t>(tail - head);
    if (n <= 0) return 0;
    return static_cast<std::size_t>(n) > capacity_ ? capacity_ : static_cast<std::size_t>(n);
  }

 private:
  friend struct detail::ring_access;

  // try_pop(position), always inlined: for a caller that uses the element where it
  // pops it (a pipeline stage's loop, through detail::ring_access). try_pop() itself,
  // and pop() through it, keep the compiler's choice: inlined into pop(), g++ returned
  // the optional through the stack, a byte store for its flag read back by an 8-byte
  // load after the head store, and a blocking pop waited out that store's cache miss
  // every time (6x slower in bench_rings).
  CONVEYOR_HOT_INLINE std::optional<T> take(std::size_t* position) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    cell* c = slot(head);
    if (!c->takable(head)) return std::nullopt;
    if (position) *position = head;
    T* p = c->element();
    std::optional<T> out{std::move(*p)};
    std::destroy_at(p);
    // release: pairs with the acquire load of seq in emplace() and in push()'s wait; the
    // move-out and the destruction above happen-before the producer fills the slot again.
    c->seq.store(head + capacity_, std::memory_order_release);
    // relaxed: our own index, read by size_approx() (an estimate) and the destructor.
    consumer_.head.store(head + 1, std::memory_order_relaxed);
    not_full_.notify();
    return out;
  }

  // The consumer takes the elements there now, up to max, in order, and hands each to
  // f(T&&): a burst. f returns false to stop after the element it was given. Each
  // element leaves its slot, and the slot goes back to the producer (notified), before f
  // runs, as with a pop: f may block, even on the producer, and the ring has the room a
  // pop would have left. Once per burst instead of per element: the consumer's index
  // store, and for a pipeline stage the optional each pop returns and the calls through
  // its link. Stops before a mark. Returns how many elements f was given (0: none there).
  template <class F>
  CONVEYOR_HOT_INLINE std::size_t drain(F& f, std::size_t max) noexcept {
    static_assert(std::is_nothrow_invocable_r_v<bool, F&, T&&>,
                  "spsc_ring::drain: f(T&&) must be noexcept and return bool");
    const std::size_t first = consumer_.head.load(std::memory_order_relaxed);  // we own head
    cell* const slots = slots_.data();
    const std::size_t mask = mask_, capacity = capacity_;  // in registers across notify()
    std::size_t head = first;
    while (head - first < max) {
      cell* c = slots + (head & mask);
      if (!c->takable(head)) break;  // acquire: as in take()
      T* p = c->element();
      T v{std::move(*p)};
      std::destroy_at(p);
      // release: as in take(): the move-out and the destruction happen-before the
      // producer fills the slot again.
      c->seq.store(head + capacity, std::memory_order_release);
      not_full_.notify();
      ++head;
      if (!f(std::move(v))) break;
    }
    // relaxed: as in take().
    if (head != first) consumer_.head.store(head, std::memory_order_relaxed);
    return head - first;
  }

  bool push_impl(T&& v, detail::wait_timing* timing) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    for (;;) {
      if (closed()) return false;
      if (emplace(std::move(v))) return true;
      not_full_.wait([this] {
        const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);  // we own tail
        return slot(tail)->fillable(tail) || closed();
      }, timing);
    }
  }

  std::optional<T> pop_impl(std::size_t* position,
                            const std::chrono::steady_clock::time_point* deadline,
                            detail::wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    for (;;) {
      if (auto v = try_pop(position)) return v;
      if (at_mark()) return std::nullopt;  // the rest follows elsewhere (see "Marks")
      if (closed()) return try_pop(position);  // elements pushed before close() are visible now
      auto ready = [this] {
        const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
        return slot(head)->takable_or_marked(head) || closed();
      };
      if (!deadline) {
        not_empty_.wait(ready, timing);
      } else if (!not_empty_.wait_until(ready, *deadline, timing)) {
        return try_pop(position);  // deadline passed
      }
    }
  }

  // The producer leaves a mark (see "Marks"); false when full or closed. Woken at once:
  // the producer goes on elsewhere and may not wait here again, so a wake-up it put off
  // (detail::wait_point's batches) might not come before the backstop.
  bool try_mark() noexcept {
    if (closed_.load(std::memory_order_relaxed)) return false;  // relaxed: advisory refusal
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);  // we own tail
    cell* c = slot(tail);
    if (!c->fillable(tail)) return false;
    producer_.tail.store(tail + 1, std::memory_order_relaxed);  // as in emplace()
    // release: pairs with the acquire load of seq in at_mark() / take_mark(): every
    // element pushed before the mark is visible to a consumer that sees it.
    c->seq.store(tail + 2, std::memory_order_release);
    not_empty_.notify_now();
    return true;
  }
  // The consumer: whether the next slot holds a mark.
  bool at_mark() const noexcept {
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    // acquire: pairs with the release store in try_mark().
    return slot(head)->seq.load(std::memory_order_acquire) == head + 2;
  }
  // The consumer takes the mark in the next slot; false when there is none.
  bool take_mark() noexcept {
    if (!at_mark()) return false;
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    // release: pairs with the producer's acquire in fillable(), as in take().
    slot(head)->seq.store(head + capacity_, std::memory_order_release);
    consumer_.head.store(head + 1, std::memory_order_relaxed);
    not_full_.notify();
    return true;
  }
  // The producer: blocks until the next slot is free (true) or the ring is closed.
  bool wait_room(detail::wait_timing* timing) noexcept {
    for (;;) {
      if (closed()) return false;
      const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);  // we own tail
      if (slot(tail)->fillable(tail)) return true;
      not_full_.wait([this] {
        const std::size_t t = producer_.tail.load(std::memory_order_relaxed);
        return slot(t)->fillable(t) || closed();
      }, timing);
    }
  }

  template <class... Args>
  CONVEYOR_HOT_INLINE bool emplace(Args&&... args) {
    if (closed_.load(std::memory_order_relaxed)) return false;  // relaxed: advisory refusal
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);  // we own tail
    cell* c = slot(tail);
    if (!c->fillable(tail)) return false;  // full: the last lap's element is still there
    ::new (static_cast<void*>(c->storage)) T(std::forward<Args>(args)...);
    // relaxed: our own index, read by size_approx() (an estimate) and the destructor.
    // Stored before seq, so the release below also publishes it: a consumer that has
    // taken this element reads a tail at least as far, and its own size_approx() does
    // not see its head run past our tail.
    producer_.tail.store(tail + 1, std::memory_order_relaxed);
    // release: pairs with the acquire load of seq in take() and in pop()'s wait.
    c->seq.store(tail + 1, std::memory_order_release);
    not_empty_.notify();
    return true;
  }

  // One element and its turn. Slots are packed (16 bytes around a 64-bit element): when
  // the two sides work on neighbouring slots they share a line, which padding every slot
  // to a line would avoid at 4-8x the memory for small elements.
  struct cell {
    explicit cell(std::size_t turn) noexcept : seq(turn) {}
    std::atomic<std::size_t> seq;
    alignas(T) unsigned char storage[sizeof(T)];
    T* element() noexcept { return std::launder(reinterpret_cast<T*>(storage)); }
    // The producer's turn at position pos: the consumer is done with the last lap's
    // element. acquire: pairs with the release store of seq in take(), so its move-out
    // and destruction happen-before we construct here.
    CONVEYOR_HOT_INLINE bool fillable(std::size_t pos) const noexcept {
      return seq.load(std::memory_order_acquire) == pos;
    }
    // The consumer's turn at position pos: the element is there. acquire: pairs with the
    // release store of seq in emplace(), so its construction happens-before we read it.
    CONVEYOR_HOT_INLINE bool takable(std::size_t pos) const noexcept {
      return seq.load(std::memory_order_acquire) == pos + 1;
    }
    // The consumer's turn at pos, an element or a mark (see "Marks"): what a blocked
    // pop() waits for. acquire: as takable(), and pairs with try_mark()'s release.
    bool takable_or_marked(std::size_t pos) const noexcept {
      return seq.load(std::memory_order_acquire) - pos - 1 < 2;
    }
  };
  cell* slot(std::size_t i) const noexcept { return slots_.data() + (i & mask_); }

  // Written only by the producer: how many elements it has pushed.
  struct alignas(cache_line_size) producer_side {
    std::atomic<std::size_t> tail{0};
  };
  // Written only by the consumer: how many elements it has taken.
  struct alignas(cache_line_size) consumer_side {
    std::atomic<std::size_t> head{0};
  };
  struct alignas(cache_line_size) aligned_wait_point : detail::wait_point {};
  static_assert(sizeof(producer_side) == cache_line_size && sizeof(consumer_side) == cache_line_size,
                "spsc_ring: each index must own exactly one cache line");

  // Read-only after construction; shares a line with nothing that is written.
  alignas(cache_line_size) const std::size_t capacity_;
  const std::size_t mask_;
  detail::aligned_slots<cell> slots_;
  producer_side producer_;
  consumer_side consumer_;
  aligned_wait_point not_empty_;  // consumer sleeps here; producer notifies
  aligned_wait_point not_full_;   // producer sleeps here; consumer notifies
  alignas(cache_line_size) std::atomic<bool> closed_{false};
};

}  // namespace conveyor
