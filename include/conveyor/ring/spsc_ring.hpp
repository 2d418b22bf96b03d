// conveyor/ring/spsc_ring.hpp: bounded single-producer/single-consumer lock-free ring.
//
//   conveyor::spsc_ring<job> ring{1024};     // capacity: a power of two >= 2
//   if (!ring.try_push(std::move(j))) ...    // producer: never blocks; false if full/closed
//   if (!ring.try_emplace(a, b)) ...         //   the same, constructing job{a, b} in its slot
//   ring.push(std::move(j));                 // producer: blocks while full; false once closed
//   while (auto j = ring.pop()) use(*j);     // consumer: blocks while empty; nullopt once
//                                            //   closed *and* drained
//   ring.drain([&](job&& j) noexcept { use(j); return true; }, 32);  // a burst, in order
//   ring.close();                            // any thread: wakes both sides
//   conveyor::spsc_ring<job, conveyor::spsc_layout::slot_turns> hop{1024};  // the other layout
//
// Two layouts, the same calls and guarantees. Which one moves more items depends on the
// host, the element size and which side catches up (benchmarks/RESULTS.md, "Rings"):
// - cached_head (the default): what follows.
// - slot_turns: the producer, too, looks at the slot it is about to fill instead of the
//   consumer's index (the consumer hands each slot back by writing its next turn), so the
//   only lines that travel are the slots'. A pipeline's links use it: its chains of small
//   stages move more items over it.
//
// cached_head: Lamport's ring with a cached index on the producer's side (as rigtorp's
// SPSCQueue) and a turn number in each slot on the consumer's. The producer owns the tail
// and keeps a private copy of the consumer's head, which it reads only when its copy says
// the ring is full. Each slot holds an element and the 32-bit position it was written for
// (plus 1): the consumer finds its next element by looking at that slot alone, and never
// reads the producer's index. Each index shares its cache line with nothing the other side
// writes in the steady state. So the only lines that travel between the cores are the
// slots' own, once each, from the producer to the consumer (the consumer writes nothing
// into a slot), and the head's line when the producer has caught up with the consumer; a
// consumer that has caught up waits on the slot it will read, not on the producer's index
// line, which the producer then keeps. The turn numbers cost 4 bytes a slot (more where
// T's alignment pads them). Blocking calls spin briefly, then sleep (detail::wait_point).
// A consumer that sleeps registers in the producer's line, which each push looks at
// anyway; a producer sleeps only on a full ring, so each pop first looks at the slot just
// behind its own (a line it has just read) and at the producer's sleeper word only when
// that slot says the ring was full. The closed flag, written once, sits with the read-only
// fields.
//
// Exception guarantees (T's constructor and move constructor may throw; its destructor
// may not): a try_push / try_emplace / push whose construction throws adds nothing and
// leaves the ring as it was (the element never counted as pushed); a try_pop / pop /
// drain whose move throws leaves that element in the ring, in its place (strong
// guarantee), and rethrows. Each popped element is moved exactly once, from its slot
// into the value returned (or the value drain() hands over).
//
// Thread-safety: exactly one producer thread (try_push/try_emplace/push) and one consumer
// thread (try_pop/pop/pop_until/pop_unless/drain) at a time; close(), closed(),
// capacity(), size_approx(), wake_consumer() from any thread; batch_wakeups() before the
// ring is shared. A push racing with a close() from a third thread may still be
// accepted; such an element is either popped or destroyed with the ring.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/ring/detail/storage.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/ring/wait_timing.hpp"

namespace conveyor {

// How an spsc_ring's producer learns that a slot is free again (see the header comment).
enum class spsc_layout { cached_head, slot_turns };

template <class T, spsc_layout Layout = spsc_layout::cached_head>
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
    // Slot i holds turn i: free for position i (slot_turns), and a turn the consumer,
    // which asks slot i for i + 1, i + 1 + capacity, ..., never reads as an element.
    // Published with the ring itself.
    for (std::size_t i = 0; i < capacity; ++i)
      ::new (static_cast<void*>(slots_.data() + i)) slot(free_turn(i));
  }

  ~spsc_ring() {
    // The threads are done: positions [head, tail) hold elements.
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);
    for (std::size_t i = consumer_.head.load(std::memory_order_relaxed); i != tail; ++i)
      std::destroy_at(element(i));
  }

  spsc_ring(const spsc_ring&) = delete;
  spsc_ring& operator=(const spsc_ring&) = delete;

  // ---- producer ---------------------------------------------------------------------

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

  // Blocks while full. Returns false, and drops v, once the ring is closed. With timing:
  // adds what its waits cost to *timing.
  // @note blocks the calling (producer) thread.
  bool push(T v, wait_timing* timing = nullptr) noexcept(std::is_nothrow_move_constructible_v<T>) {
    for (;;) {
      // NOLINTNEXTLINE(bugprone-use-after-move): emplace() moves v only when it succeeds
      if (emplace(std::move(v))) return true;
      if (closed()) return false;
      not_full_.wait([this] { return has_room() || closed(); }, timing);
    }
  }

  // ---- consumer ---------------------------------------------------------------------

  // The next element, or nullopt when there is none now.
  CONVEYOR_HOT_INLINE std::optional<T> try_pop() noexcept(std::is_nothrow_move_constructible_v<T>) {
    return try_pop(nullptr);
  }
  // As try_pop(); also stores the element's position: how many elements were pushed
  // before it (the same contract as mpmc_ring's, so code that restores order after a
  // ring works over either).
  CONVEYOR_HOT_INLINE std::optional<T> try_pop(std::size_t* position) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    if (!takable(head)) return std::nullopt;
    if (position) *position = head;
    return take(head);
  }

  // As try_pop(), into an element the caller has (move-assigned): for a consumer that
  // reuses its own storage. false when there is none now. A throwing assignment leaves
  // the element in the ring.
  CONVEYOR_HOT_INLINE bool try_pop(T& out) noexcept(std::is_nothrow_move_assignable_v<T>)
    requires std::is_move_assignable_v<T>
  {
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    if (!takable(head)) return false;
    T* p = element(head);
    out = std::move(*p);  // a throw leaves the element in place
    release(head);
    return true;
  }

  // Blocks while empty. Returns nullopt only when the ring is closed and drained. With
  // position: the element's position (see try_pop(std::size_t*)); with timing: adds what
  // its waits cost to *timing.
  // @note blocks the calling (consumer) thread.
  std::optional<T> pop(std::size_t* position = nullptr, wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return pop_unless([] { return false; }, position, timing);
  }

  // As pop(), but gives up at the deadline: nullopt then means timed out, or closed and
  // drained (closed() tells which).
  // @note blocks the calling (consumer) thread until the deadline at most.
  std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    const auto ready = [&] { return takable(head) || closed(); };
    if (!ready() && !not_empty_.wait_until(ready, deadline)) return std::nullopt;  // timed out
    if (!takable(head)) return std::nullopt;  // closed and drained
    return take(head);
  }

  // As pop(), but also returns nullopt, without an element, once give_up() is true when
  // none is there: a consumer that waits for an element or for something else. Whoever
  // makes give_up() true then calls wake_consumer(), so that a consumer asleep here looks
  // again.
  // @note blocks the calling (consumer) thread.
  template <class GiveUp>
  std::optional<T> pop_unless(
      GiveUp&& give_up, std::size_t* position = nullptr,
      wait_timing* timing = nullptr) noexcept(std::is_nothrow_move_constructible_v<T>) {
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    for (;;) {
      if (takable(head)) break;
      // Elements pushed before close() are visible once closed() is seen (acquire).
      if (closed() || give_up()) {
        if (takable(head)) break;
        return std::nullopt;
      }
      not_empty_.wait([&] { return takable(head) || closed() || give_up(); }, timing);
    }
    if (position) *position = head;
    return take(head);  // the one move: into the value returned
  }

  // Wakes a consumer asleep in pop_unless() to look at its give_up() again.
  void wake_consumer() noexcept { not_empty_.notify_now(); }

  // The consumer takes the elements there now, up to max, in order, and hands each to
  // f(T&&): a burst. f returns false to stop after the element it was given. Each
  // element leaves its slot, and the slot goes back to the producer (notified), before f
  // runs, as with a pop: f may block, even on the producer, and the ring has the room a
  // pop would have left. Per burst instead of per element: the optional each pop returns
  // and the calls through the caller's code. Returns how many elements f was given.
  template <class F>
  CONVEYOR_HOT_INLINE std::size_t drain(F&& f, std::size_t max) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    static_assert(std::is_nothrow_invocable_r_v<bool, F&, T&&>,
                  "spsc_ring::drain: f(T&&) must be noexcept and return bool");
    const std::size_t first = consumer_.head.load(std::memory_order_relaxed);  // we own head
    std::size_t head = first;
    while (head - first < max && takable(head)) {
      T v{std::move(*element(head))};  // the one move; a throw leaves the element in place
      release(head++);
      if (!f(std::move(v))) break;
    }
    return head - first;
  }

  // ---- any thread -------------------------------------------------------------------

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
    // relaxed: an estimate. From a third thread, and from the consumer (the tail is
    // published with no order of its own), the loads may see the producer run ahead in
    // between (more than capacity: clamped) or a tail older than the head (negative:
    // empty).
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);
    const auto n = static_cast<std::ptrdiff_t>(tail - head);
    if (n <= 0) return 0;
    return static_cast<std::size_t>(n) > capacity_ ? capacity_ : static_cast<std::size_t>(n);
  }

  // Lets the ring's sleepers accept a wake-up put off by up to `batch` notifies while
  // other processes hold the cores (see detail::wait_point::batch_wakes): only a thread
  // inside a detail::wake_batching scope puts its wake-ups off, and it must leave that
  // scope before the ring is destroyed. For a pipeline's rings, whose stage threads do.
  // Call before the ring is shared.
  void batch_wakeups(std::uint32_t batch) noexcept {
    not_empty_.batch_wakes(batch);
    not_full_.batch_wakes(batch);
  }

 private:
  template <class... Args>
  CONVEYOR_HOT_INLINE bool emplace(Args&&... args) {
    // relaxed: an advisory refusal (see close()).
    if (closed_.load(std::memory_order_relaxed)) return false;
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);  // we own tail
    slot& s = slots_.data()[tail & mask_];
    if constexpr (Layout == spsc_layout::slot_turns) {
      // acquire: pairs with the release store of the free turn in release(); the
      // consumer's move-out and destruction of that slot happen-before we fill it.
      if (s.turn.load(std::memory_order_acquire) != free_turn(tail)) return false;  // full
    } else if (tail - producer_.head_cache == capacity_) {
      // acquire: pairs with the release store of head in release(); as above.
      producer_.head_cache = consumer_.head.load(std::memory_order_acquire);
      if (tail - producer_.head_cache == capacity_) return false;  // full
    }
    ::new (static_cast<void*>(s.bytes)) T(std::forward<Args>(args)...);  // may throw:
    // nothing is published then.
    // release: pairs with the acquire load of the turn in takable(); the construction
    // above happens-before the consumer reads the element.
    s.turn.store(turn_of(tail), std::memory_order_release);
    // relaxed: our own index, read by size_approx() (an estimate) and the destructor.
    producer_.tail.store(tail + 1, std::memory_order_relaxed);
    not_empty_.notify();
    return true;
  }

  // The producer: room for one more (for a blocked push's wait).
  bool has_room() const noexcept {
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);
    // acquire: as in emplace().
    if constexpr (Layout == spsc_layout::slot_turns)
      return slots_.data()[tail & mask_].turn.load(std::memory_order_acquire) == free_turn(tail);
    return tail - consumer_.head.load(std::memory_order_acquire) < capacity_;
  }

  // The consumer: whether the element at position head (its own) is there.
  CONVEYOR_HOT_INLINE bool takable(std::size_t head) const noexcept {
    // acquire: pairs with the release store of the turn in emplace(); the element is
    // constructed before we see its turn.
    return slots_.data()[head & mask_].turn.load(std::memory_order_acquire) == turn_of(head);
  }
  // The turn a slot holds while it holds position pos's element. 32 bits: positions a lap
  // apart (capacity <= 2^30) never share one, and a slot's turn is rewritten every lap.
  static std::uint32_t turn_of(std::size_t pos) noexcept {
    return static_cast<std::uint32_t>(pos + 1);
  }
  // The turn a slot holds while it is free for position pos (slot_turns; cached_head
  // writes it only at construction). pos and pos + 1 never meet a lap apart (capacity
  // >= 2).
  static std::uint32_t free_turn(std::size_t pos) noexcept {
    return static_cast<std::uint32_t>(pos);
  }

  // The consumer takes the element at position head (takable): moved once, straight into
  // the value returned (a prvalue: no further move). After the move, the element is
  // destroyed and its slot goes back to the producer; if the move throws, neither.
  CONVEYOR_HOT_INLINE std::optional<T> take(std::size_t head) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    struct release_slot {
      spsc_ring& ring;
      std::size_t head;
      int exceptions = std::is_nothrow_move_constructible_v<T> ? 0 : std::uncaught_exceptions();
      ~release_slot() {
        if constexpr (!std::is_nothrow_move_constructible_v<T>)
          if (std::uncaught_exceptions() != exceptions) return;  // the move threw
        ring.release(head);
      }
    } release{*this, head};
    return std::optional<T>(std::in_place, std::move(*element(head)));
  }

  // The consumer is done with the element at position head (moved out): it is destroyed
  // and its slot goes back to the producer.
  CONVEYOR_HOT_INLINE void release(std::size_t head) noexcept {
    std::destroy_at(element(head));
    if constexpr (Layout == spsc_layout::slot_turns) {
      // release: pairs with the acquire load of the turn in emplace() / has_room(); the
      // move-out and the destruction happen-before the producer fills the slot again.
      slots_.data()[head & mask_].turn.store(free_turn(head + capacity_),
                                             std::memory_order_release);
      // relaxed: read only by size_approx() (an estimate) and the destructor.
      consumer_.head.store(head + 1, std::memory_order_relaxed);
      // The consumer's own line: notify() costs a load of a line it holds.
      not_full_.notify();
      return;
    }
    // release: pairs with the acquire load of head in emplace() / has_room(); the move-out
    // and the destruction happen-before the producer fills the slot again.
    consumer_.head.store(head + 1, std::memory_order_release);
    // A producer sleeps only on a full ring, after it wrote position head - 1 + capacity
    // into the slot just behind this one: the consumer looks there (a line it has just
    // read) and at the producer's sleeper word only when that slot says the ring was full.
    not_full_.notify_if([&] { return full_behind(head); });
  }

  // The consumer, having taken position head: whether the producer had then filled the
  // ring (written position head - 1 + capacity, the slot just behind head's). relaxed:
  // notify_if()'s fence orders it after our release of head; the producer wrote that
  // turn before it registered to sleep.
  CONVEYOR_HOT_INLINE bool full_behind(std::size_t head) const noexcept {
    return slots_.data()[(head - 1) & mask_].turn.load(std::memory_order_relaxed) ==
           turn_of(head - 1 + capacity_);
  }

  T* element(std::size_t i) const noexcept {
    return std::launder(reinterpret_cast<T*>(slots_.data()[i & mask_].bytes));
  }

  struct slot {
    explicit slot(std::uint32_t t) noexcept : turn(t) {}
    std::atomic<std::uint32_t> turn;
    alignas(T) unsigned char bytes[sizeof(T)];  // the element, while it holds one
  };

  // The producer's line: how many elements it has pushed and its copy of the consumer's
  // head (cached_head; both written by the producer only), and where a sleeping consumer
  // registers (not_empty_'s waiting word, written when it sleeps). The producer reads all three on
  // every push.
  struct alignas(cache_line_size) producer_side {
    std::atomic<std::size_t> tail{0};
    std::size_t head_cache = 0;
    std::atomic<std::uint32_t> consumer_sleeps{0};
  };
  // The consumer's line: how many elements it has taken (written by the consumer only),
  // and where a sleeping producer registers.
  struct alignas(cache_line_size) consumer_side {
    std::atomic<std::size_t> head{0};
    std::atomic<std::uint32_t> producer_sleeps{0};
  };
  struct alignas(cache_line_size) aligned_wait_point : detail::wait_point {
    using detail::wait_point::wait_point;
  };
  static_assert(sizeof(producer_side) == cache_line_size &&
                    sizeof(consumer_side) == cache_line_size,
                "spsc_ring: each side's index and cache must own exactly one cache line");

  // Read-only after construction, but for the closed flag, written once: both sides read
  // this line on every call (the flag each time they find nothing to do) and keep it.
  alignas(cache_line_size) const std::size_t capacity_;
  const std::size_t mask_;
  detail::aligned_slots<slot> slots_;
  std::atomic<bool> closed_{false};
  producer_side producer_;
  consumer_side consumer_;
  aligned_wait_point not_empty_{producer_.consumer_sleeps};  // consumer sleeps; producer notifies
  aligned_wait_point not_full_{consumer_.producer_sleeps};   // producer sleeps; consumer notifies
};

}  // namespace conveyor
