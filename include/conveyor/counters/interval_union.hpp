// conveyor/counters/interval_union.hpp: total length of a union of time intervals that
// arrive almost, but not exactly, in start order, in fixed memory.
//
//   metrics::interval_union u{64};                  // window: how far out of order
//   u.add(start_ns, end_ns);                        // O(log window), no allocation
//   std::int64_t busy = u.total_ns();               // length of the union so far
//
//   metrics::concurrent_interval_union gpu{64};     // the same, fed from many threads
//   gpu.add(t.compute.start_ns, t.compute.end_ns);  // any thread: lock-free, never waits
//   double busy = conveyor::ns_to_s(gpu.total_ns()); // any thread
//
// Used for the GPU busy fraction: the compute intervals of all lanes, whose union is
// the time at least one kernel ran. Lanes finish batches roughly in batch order, so the
// intervals arrive nearly sorted by start. interval_union keeps the last `window`
// intervals in a min-heap on start and sweeps them in start order: when the heap
// overflows, the earliest-starting one is merged into the current run [a, b) (extends
// it if it starts at or before b, else closes the run and starts a new one).
//
// Exactness: the result is exact when no interval arrives after more than `window`
// intervals that start later than it. (Proof: an interval swept at some moment was the
// minimum of window+1 held intervals; anything arriving later with an earlier start
// would follow all window+1 of them.) With L lanes and at most k batches in flight per
// lane, arrivals are out of order by < L*k, so window >= L*k is exact. An interval that
// arrives later than that ("late") starting before the current run is clipped to the run
// (its earlier part is dropped, counted by late()): the total then under-estimates by at
// most the dropped lengths, it never over-counts.
//
// Thread-safety: interval_union is a plain value: one thread at a time.
// concurrent_interval_union: add() and total_ns() from any threads. add() is lock-free
// and never waits for another thread: it claims a slot in a bounded MPSC queue (Vyukov's
// bounded queue, one consumer at a time), then folds the queue into the union if no
// other thread is folding (a try-acquire of a flag that it never waits for). Arrival
// order = queue order. An interval queued while another thread folds waits in the queue
// until the next add() or total_ns(); total_ns() sees every add() that happened-before
// it. If the queue is full the interval is dropped and counted (dropped()): size the
// queue above the number of adds that can happen during one fold. total_ns() waits
// (yielding) for a fold in progress, folds, and reads: for reporting threads only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"

namespace conveyor::metrics {

class interval_union {
 public:
  static constexpr std::size_t default_window = 64;

  // @throws config_error unless 1 <= window <= 65536. Allocates the window once here.
  explicit interval_union(std::size_t window = default_window) : window_(check(window)) {
    heap_.reserve(window_ + 1);
    scratch_.reserve(window_ + 1);
  }

  // Adds [start_ns, end_ns). Empty or reversed intervals are ignored. No allocation.
  void add(std::int64_t start_ns, std::int64_t end_ns) noexcept;
  void add(interval iv) noexcept { add(iv.start_ns, iv.end_ns); }

  // Length of the union of everything added so far (including the held window).
  // No allocation (a scratch copy reserved at construction).
  std::int64_t total_ns() const noexcept;

  std::uint64_t count() const noexcept { return count_; }  // non-empty intervals added
  std::uint64_t late() const noexcept { return late_; }    // arrived beyond the window
  std::size_t window() const noexcept { return window_; }

  void reset() noexcept {
    heap_.clear();
    closed_ = 0;
    run_ = {};
    has_run_ = false;
    count_ = late_ = 0;
  }

 private:
  static std::size_t check(std::size_t window) {
    CONVEYOR_EXPECTS(window >= 1 && window <= 65536,
                     "interval_union: window must be in [1, 65536]; use at least lanes x "
                     "batches in flight per lane");
    return window;
  }

  void sweep(interval iv) noexcept;

  std::size_t window_;
  std::vector<interval> heap_;             // min-heap on start_ns, at most window_ (+1 transiently)
  mutable std::vector<interval> scratch_;  // total_ns()'s sorted copy of heap_
  std::int64_t closed_ = 0;                // total length of runs that ended
  interval run_{};                         // the run being extended
  bool has_run_ = false;
  std::uint64_t count_ = 0;
  std::uint64_t late_ = 0;
};

class concurrent_interval_union {
 public:
  static constexpr std::size_t default_queue_capacity = 1024;

  // @throws config_error for a bad window (see interval_union) or a queue_capacity that
  // is not a power of two in [2, 2^20].
  explicit concurrent_interval_union(std::size_t window = interval_union::default_window,
                                     std::size_t queue_capacity = default_queue_capacity)
      : union_(window),
        mask_(check_capacity(queue_capacity) - 1),
        slots_(std::make_unique<slot[]>(queue_capacity)) {
    for (std::size_t i = 0; i < queue_capacity; ++i)
      slots_[i].seq.store(i, std::memory_order_relaxed);  // before any sharing
  }

  // Any thread. Returns false when the interval was dropped because the queue was full.
  bool add(std::int64_t start_ns, std::int64_t end_ns) noexcept {
    if (end_ns <= start_ns) return true;
    if (!try_enqueue(interval{start_ns, end_ns})) {
      // relaxed: a statistic; nothing is published through it.
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    // acquire: pairs with the release store of folding_ in fold_and_release(); the
    // previous folder's writes to union_ and head_ happen-before ours.
    if (!folding_.exchange(true, std::memory_order_acquire)) fold_and_release();
    return true;
  }
  bool add(interval iv) noexcept { return add(iv.start_ns, iv.end_ns); }

  // Any thread; waits for a fold in progress. Not for hot paths.
  std::int64_t total_ns() noexcept {
    return with_union([](const interval_union& u) { return u.total_ns(); });
  }
  std::uint64_t late() noexcept {
    return with_union([](const interval_union& u) { return u.late(); });
  }
  std::uint64_t count() noexcept {
    return with_union([](const interval_union& u) { return u.count(); });
  }
  std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct slot {  // not padded: producers serialize on tail_ anyway
    std::atomic<std::uint64_t> seq{0};
    interval value{};
  };

  static std::size_t check_capacity(std::size_t c) {
    CONVEYOR_EXPECTS(c >= 2 && c <= (std::size_t{1} << 20) && (c & (c - 1)) == 0,
                     "concurrent_interval_union: queue_capacity must be a power of two in "
                     "[2, 2^20]");
    return c;
  }

  // Vyukov's bounded MPMC enqueue (used here with a single consumer at a time): slot
  // seq == position means free for that position; position + 1 means filled.
  bool try_enqueue(interval iv) noexcept {
    // relaxed: only a starting guess; the CAS below validates it.
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      slot& s = slots_[pos & mask_];
      // acquire: pairs with the release store of seq in fold_and_release() (the consumer
      // has read the slot's previous value before we overwrite it).
      const std::uint64_t seq = s.seq.load(std::memory_order_acquire);
      const auto dif = static_cast<std::int64_t>(seq - pos);
      if (dif == 0) {
        // relaxed: the CAS only claims the position; the slot's contents are published
        // by the release store of seq below, not by tail_.
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          s.value = iv;
          // release: pairs with the acquire load of seq in fold_and_release(); the
          // value written above is visible to the consumer that sees pos + 1.
          s.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        return false;  // full: the slot still holds an unconsumed value
      } else {
        pos = tail_.load(std::memory_order_relaxed);  // relaxed: a new guess, see above
      }
    }
  }

  // Precondition: this thread holds folding_ (set by its acquire exchange). Moves every
  // published slot, in queue order, into union_.
  void drain() noexcept {
    for (;;) {
      slot& s = slots_[head_ & mask_];
      // acquire: pairs with the release store of seq in try_enqueue(); the value is
      // visible once we see head_ + 1.
      if (s.seq.load(std::memory_order_acquire) != head_ + 1) return;  // empty/unpublished
      union_.add(s.value);
      // release: pairs with the acquire load of seq in try_enqueue(); we are done
      // reading the slot before a producer can claim it for position head_ + capacity.
      s.seq.store(head_ + mask_ + 1, std::memory_order_release);
      ++head_;
    }
  }

  void fold_and_release() noexcept {
    drain();
    // release: pairs with the acquire exchange in add() and with_union(); union_ and
    // head_ as left here are what the next folder starts from.
    folding_.store(false, std::memory_order_release);
  }

  template <class F>
  std::invoke_result_t<F, const interval_union&> with_union(F&& f) noexcept {
    // acquire: pairs with the release store in fold_and_release().
    while (folding_.exchange(true, std::memory_order_acquire)) std::this_thread::yield();
    drain();
    auto result = std::invoke(std::forward<F>(f), std::as_const(union_));
    // release: as in fold_and_release().
    folding_.store(false, std::memory_order_release);
    return result;
  }

  // Guarded by folding_ (whoever holds it owns union_ and head_).
  interval_union union_;
  std::uint64_t head_ = 0;
  const std::uint64_t mask_;
  std::unique_ptr<slot[]> slots_;
  alignas(cache_line_size) std::atomic<std::uint64_t> tail_{0};
  alignas(cache_line_size) std::atomic<bool> folding_{false};
  alignas(cache_line_size) std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace conveyor::metrics
