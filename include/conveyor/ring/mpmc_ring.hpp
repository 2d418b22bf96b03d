// conveyor/ring/mpmc_ring.hpp: bounded multi-producer/multi-consumer lock-free ring.
//
//   conveyor::mpmc_ring<job> ring{1024};     // capacity: a power of two >= 2
//   ring.push(std::move(j));                 // any thread: blocks while full; false once closed
//   if (!ring.try_emplace(a, b)) ...         // never blocks: job{a, b} built in place
//   while (auto j = ring.pop()) use(*j);     // any thread: nullopt once closed *and* drained
//   ring.close();                            // no push succeeds after this returns
//
// Dmitry Vyukov's bounded MPMC queue: each slot carries a sequence number that says whose
// turn it is (producer of lap k: seq == pos, consumer: seq == pos + 1), so producers and
// consumers claim positions with one CAS and hand elements over through the slot.
// Deviation from Vyukov: the closed flag lives in the top bit of the enqueue position, so
// close() and every claim are ordered on one atomic. After close() no position can be
// claimed, the final enqueue position is fixed, and a consumer knows exactly when the
// ring is drained even while a claimed element is still being written.
//
// Exception guarantees (T's destructor may not throw). A position is claimed before its
// element is built, and a claimed position must be handed over, so:
// - try_push / push of a const T& whose copy may throw copy first, when T's move cannot
//   throw, and claim only then: a throw adds nothing and claims nothing (strong guarantee).
// - Any other construction that throws (try_emplace's, a move that may throw) has already
//   claimed its position: it leaves it as a hole that consumers skip. Nothing is added,
//   the ring stays usable, and that one position is never returned by a pop.
// - try_pop / pop whose move throws destroy the element, free its slot and rethrow: the
//   ring stays usable and nothing leaks, but that element is lost (basic guarantee).
// Each popped element is moved exactly once, from its slot into the value returned.
//
// Thread-safety: any number of producers and consumers; every member from any thread but
// batch_wakeups(), which is called before the ring is shared.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/ring/detail/storage.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/ring/wait_timing.hpp"

namespace conveyor {

template <class T>
class mpmc_ring {
  static_assert(std::is_nothrow_destructible_v<T>, "mpmc_ring: T must be nothrow destructible");
  static_assert(std::is_move_constructible_v<T>, "mpmc_ring: T must be move constructible");

  static constexpr bool by_value = detail::push_by_value<T>;  // see detail::push_by_value
  // A const T& whose copy may throw is copied before a position is claimed (see above).
  static constexpr bool copy_first =
      !std::is_nothrow_copy_constructible_v<T> && std::is_nothrow_move_constructible_v<T>;

 public:
  using value_type = T;

  // @throws config_error unless capacity is a power of two in [2, 2^30].
  explicit mpmc_ring(std::size_t capacity)
      : capacity_((detail::check_ring_capacity("mpmc_ring", capacity), capacity)),
        mask_(capacity - 1),
        slots_(capacity) {
    for (std::size_t i = 0; i < capacity_; ++i)
      ::new (static_cast<void*>(slots_.data() + i)) slot{};
    for (std::size_t i = 0; i < capacity_; ++i)
      slots_.data()[i].seq.store(i, std::memory_order_relaxed);  // published by the ctor's end
  }

  ~mpmc_ring() {
    const std::size_t end = enqueue_pos_.load(std::memory_order_relaxed) & ~closed_bit;
    for (std::size_t i = dequeue_pos_.load(std::memory_order_relaxed); i != end; ++i) {
      slot& s = slots_.data()[i & mask_];
      // Only fully written elements are destroyed; no thread may still be inside.
      if (s.seq.load(std::memory_order_relaxed) == i + 1 && !s.hole) std::destroy_at(s.element());
    }
    for (std::size_t i = 0; i < capacity_; ++i) std::destroy_at(slots_.data() + i);
  }

  mpmc_ring(const mpmc_ring&) = delete;
  mpmc_ring& operator=(const mpmc_ring&) = delete;

  // ---- producers --------------------------------------------------------------------

  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_push(T&& v) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return emplace(std::move(v));
  }
  [[nodiscard]] bool try_push(const T& v) noexcept(std::is_nothrow_copy_constructible_v<T>) {
    if constexpr (copy_first) {
      if (closed()) return false;
      T copy(v);
      return emplace(std::move(copy));
    } else {
      return emplace(v);
    }
  }
  // As try_push(T(args...)), but constructs the element in its slot where that cannot
  // throw (see the exception guarantees above). The arguments are used only when it
  // succeeds (false: full or closed).
  template <class... Args>
    requires std::is_constructible_v<T, Args&&...>
  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_emplace(Args&&... args) noexcept(
      std::is_nothrow_constructible_v<T, Args&&...>) {
    return emplace(std::forward<Args>(args)...);
  }

  // Blocks while full. Returns false, and drops v, once the ring is closed. With timing:
  // adds what its waits cost to *timing. A small trivially copyable T (two words at most)
  // is taken by value; any other T by reference, copied or moved once, into its slot.
  // @note blocks the calling thread.
  bool push(T v, wait_timing* timing = nullptr) noexcept(std::is_nothrow_move_constructible_v<T>)
    requires by_value
  {
    return push_impl<T>(v, timing);
  }
  bool push(T&& v, wait_timing* timing = nullptr) noexcept(std::is_nothrow_move_constructible_v<T>)
    requires(!by_value)
  {
    return push_impl<T&&>(std::move(v), timing);
  }
  bool push(const T& v,
            wait_timing* timing = nullptr) noexcept(std::is_nothrow_copy_constructible_v<T>)
    requires(!by_value)
  {
    if constexpr (copy_first) {
      if (closed()) return false;
      T copy(v);
      return push_impl<T&&>(std::move(copy), timing);
    } else {
      return push_impl<const T&>(v, timing);
    }
  }

  // ---- consumers --------------------------------------------------------------------

  std::optional<T> try_pop() noexcept(std::is_nothrow_move_constructible_v<T>) {
    return try_pop(nullptr);
  }

  // As try_pop(); also stores the element's position: how many positions were claimed
  // by pushes before it (the elements pushed before it, unless a push threw: see above).
  // Parallel consumers use it to restore the input order.
  std::optional<T> try_pop(std::size_t* position) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    for (;;) {
      std::size_t pos = 0;
      slot* s = claim(pos);
      if (s == nullptr) return std::nullopt;
      if (s->hole) {
        skip(*s, pos);
        continue;
      }
      if (position) *position = pos;
      return take(*s, pos);  // the one move: into the value returned
    }
  }

  // Blocks while empty. Returns nullopt only when the ring is closed and drained. With
  // position: the element's position (see try_pop(std::size_t*)); with timing: adds what
  // its waits cost to *timing.
  // @note blocks the calling thread.
  std::optional<T> pop(std::size_t* position = nullptr, wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return pop_impl(position, nullptr, timing);
  }
  // As pop(), but gives up at the deadline: nullopt then means timed out, or closed and
  // drained (closed() tells which).
  // @note blocks the calling thread until the deadline at most.
  std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return pop_impl(nullptr, &deadline, nullptr);
  }

  // ---- any thread -------------------------------------------------------------------

  void close() noexcept {
    // acq_rel: the RMW joins the modification order of enqueue_pos_ after every claim
    // that succeeded, so no claim can follow it; pairs with the acquire in closed().
    enqueue_pos_.fetch_or(closed_bit, std::memory_order_acq_rel);
    not_empty_.notify_now();
    not_full_.notify_now();
  }

  bool closed() const noexcept {
    return (enqueue_pos_.load(std::memory_order_acquire) & closed_bit) != 0;
  }
  std::size_t capacity() const noexcept { return capacity_; }

  // A snapshot that may be stale by the time it returns; never above capacity().
  std::size_t size_approx() const noexcept {
    // relaxed: an estimate. Dequeue first: both only grow, so the difference is >= 0
    // unless a consumer claimed an element still being written, which the check absorbs.
    const std::size_t head = dequeue_pos_.load(std::memory_order_relaxed);
    const std::size_t tail = enqueue_pos_.load(std::memory_order_relaxed) & ~closed_bit;
    if (tail <= head) return 0;
    return tail - head > capacity_ ? capacity_ : tail - head;
  }

  // Lets the ring's sleepers accept a wake-up put off by up to `batch` notifies while
  // other processes hold the cores; see spsc_ring::batch_wakeups.
  void batch_wakeups(std::uint32_t batch) noexcept {
    not_empty_.batch_wakes(batch);
    not_full_.batch_wakes(batch);
  }

 private:
  static constexpr std::size_t closed_bit = std::size_t{1} << (sizeof(std::size_t) * 8 - 1);

  struct alignas(cache_line_size) slot {
    std::atomic<std::size_t> seq{0};
    bool hole = false;  // its push's construction threw: no element, skip it
    alignas(T) unsigned char storage[sizeof(T)];
    T* element() noexcept { return std::launder(reinterpret_cast<T*>(storage)); }
  };

  template <class... Args>
  CONVEYOR_HOT_INLINE bool emplace(Args&&... args) {
    std::size_t pos = enqueue_pos_.load(std::memory_order_relaxed);
    slot* s;
    for (;;) {
      if ((pos & closed_bit) != 0) return false;
      s = &slots_.data()[pos & mask_];
      // acquire: pairs with the release store of seq in free_slot(); the previous lap's
      // element has been moved out and destroyed.
      const std::size_t seq = s->seq.load(std::memory_order_acquire);
      const auto dif = static_cast<std::intptr_t>(seq - pos);
      if (dif == 0) {
        // relaxed: the claim transfers no data. It fails if close() set the top bit,
        // and the reloaded pos then carries the bit.
        if (enqueue_pos_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (dif < 0) {
        return false;  // full
      } else {
        pos = enqueue_pos_.load(std::memory_order_relaxed);
      }
    }
    if constexpr (std::is_nothrow_constructible_v<T, Args&&...>) {
      ::new (static_cast<void*>(s->storage)) T(std::forward<Args>(args)...);
    } else {
      try {
        ::new (static_cast<void*>(s->storage)) T(std::forward<Args>(args)...);
      } catch (...) {
        // The position is claimed and consumers wait for it in order: hand it over
        // as a hole, which they skip.
        s->hole = true;
        publish(*s, pos);
        throw;
      }
    }
    publish(*s, pos);
    return true;
  }

  // push(): V is T (by_value), T&& or const T&, as push() took it.
  template <class V>
  bool push_impl(V v, wait_timing* timing) noexcept(std::is_nothrow_constructible_v<T, V&&>) {
    for (;;) {
      // NOLINTNEXTLINE(bugprone-use-after-move): emplace() moves v only when it succeeds
      if (emplace(std::forward<V>(v))) return true;
      if (closed()) return false;
      not_full_.wait(
          [this] {
            const std::size_t pos = enqueue_pos_.load(std::memory_order_relaxed);
            if ((pos & closed_bit) != 0) return true;
            // acquire: pairs with the release store of seq in free_slot(). Room at pos
            // (dif == 0), or pos is already stale (dif > 0: another producer has claimed it
            // since): either way emplace() may succeed now. Only dif < 0 — the slot at the
            // current enqueue position still holds the previous lap's element — is full,
            // and then the consumer that frees it notifies after this read (see pop()).
            const std::size_t seq = slots_.data()[pos & mask_].seq.load(std::memory_order_acquire);
            return static_cast<std::intptr_t>(seq - pos) >= 0;
          },
          timing);
    }
  }

  void publish(slot& s, std::size_t pos) noexcept {
    // release: pairs with the acquire load of seq in claim() and pop()'s wait; the
    // element (or the hole flag) is written before a consumer sees the slot's turn.
    s.seq.store(pos + 1, std::memory_order_release);
    not_empty_.notify();
  }

  // A consumer claims the next filled position; null when there is none now.
  slot* claim(std::size_t& pos) noexcept {
    // relaxed: the position is only a claim ticket; the slot's seq carries the data.
    pos = dequeue_pos_.load(std::memory_order_relaxed);
    for (;;) {
      slot* s = &slots_.data()[pos & mask_];
      // acquire: pairs with the release store of seq in publish(); the element is fully
      // constructed when seq says so.
      const std::size_t seq = s->seq.load(std::memory_order_acquire);
      const auto dif = static_cast<std::intptr_t>(seq - (pos + 1));
      if (dif == 0) {
        // relaxed: claiming the position transfers no data (seq above did).
        if (dequeue_pos_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) return s;
      } else if (dif < 0) {
        return nullptr;  // empty, or the element at pos is still being written
      } else {
        pos = dequeue_pos_.load(std::memory_order_relaxed);  // lost a race; try again
      }
    }
  }

  // The slot at claimed position pos goes back to the producers of the next lap.
  void free_slot(slot& s, std::size_t pos) noexcept {
    // release: pairs with the acquire load of seq in emplace() and push()'s wait; the
    // move-out and destruction (or the hole's reset) happen-before a producer reuses it.
    s.seq.store(pos + capacity_, std::memory_order_release);
    not_full_.notify();
  }

  void skip(slot& s, std::size_t pos) noexcept {
    s.hole = false;
    free_slot(s, pos);
  }

  // Moves the element at claimed position pos straight into the value returned (a
  // prvalue: no further move), then destroys it and frees the slot, also when the move
  // throws (the element is then lost; see the exception guarantees).
  std::optional<T> take(slot& s,
                        std::size_t pos) noexcept(std::is_nothrow_move_constructible_v<T>) {
    struct release_slot {
      mpmc_ring& ring;
      slot& s;
      std::size_t pos;
      ~release_slot() {
        std::destroy_at(s.element());
        ring.free_slot(s, pos);
      }
    } release{*this, s, pos};
    return std::optional<T>(std::in_place, std::move(*s.element()));
  }

  std::optional<T> pop_impl(std::size_t* position,
                            const std::chrono::steady_clock::time_point* deadline,
                            wait_timing* timing) noexcept(std::is_nothrow_move_constructible_v<T>) {
    auto ready = [this] {
      const std::size_t pos = dequeue_pos_.load(std::memory_order_relaxed);
      // acquire: pairs with the release store of seq in publish() (and in free_slot()).
      // Ready when the element at pos is there (dif == 0) *or pos is stale* (dif > 0:
      // another consumer claimed it between the two loads). Treating a stale pos as "not
      // ready" loses wake-ups: with elements left behind pos, this consumer would sleep
      // while the others drained the ring, and a consumer's claim notifies nobody on
      // not_empty_, so after close() it would sleep forever. With dif < 0 the slot at the
      // current dequeue position is not written yet: truly empty there, and the producer
      // that writes it (or close()) notifies after this read.
      const std::size_t seq = slots_.data()[pos & mask_].seq.load(std::memory_order_acquire);
      return static_cast<std::intptr_t>(seq - (pos + 1)) >= 0 || drained();
    };
    for (;;) {
      std::size_t pos = 0;
      if (slot* s = claim(pos)) {
        if (s->hole) {
          skip(*s, pos);
          continue;
        }
        if (position) *position = pos;
        return take(*s, pos);  // the one move: into the value returned
      }
      if (drained()) return std::nullopt;
      if (!deadline) {
        not_empty_.wait(ready, timing);
      } else if (!not_empty_.wait_until(ready, *deadline, timing)) {
        return try_pop(position);  // deadline passed
      }
    }
  }

  // Closed, and every position claimed before close() has been claimed by a consumer.
  bool drained() const noexcept {
    // acquire: pairs with close(); the final enqueue position is fixed once the bit is set.
    const std::size_t end = enqueue_pos_.load(std::memory_order_acquire);
    if ((end & closed_bit) == 0) return false;
    return dequeue_pos_.load(std::memory_order_relaxed) >= (end & ~closed_bit);
  }

  struct alignas(cache_line_size) aligned_wait_point : detail::wait_point {};

  alignas(cache_line_size) const std::size_t capacity_;
  const std::size_t mask_;
  detail::aligned_slots<slot> slots_;
  alignas(cache_line_size) std::atomic<std::size_t> enqueue_pos_{0};  // top bit: closed
  alignas(cache_line_size) std::atomic<std::size_t> dequeue_pos_{0};
  aligned_wait_point not_empty_;
  aligned_wait_point not_full_;
  static_assert(sizeof(slot) % cache_line_size == 0, "mpmc_ring: slots must not share lines");
};

}  // namespace conveyor
