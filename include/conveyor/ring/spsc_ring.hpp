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
//   conveyor::spsc_ring<job, conveyor::spsc_layout::slot_turns> hop{1024};  // another layout
//
// Three layouts, the same calls and guarantees; which one moves more items depends on the
// element size, the host and which side catches up (benchmarks/RESULTS.md, "Rings"). In
// all three the consumer never reads the producer's index: a turn number next to the
// elements says which are there. line_turns and cached_head share Lamport's producer
// side: the producer owns the tail and keeps a private copy of the consumer's head, which
// it reads only when its copy says the ring is full (as rigtorp's SPSCQueue).
// - line_turns, the default for elements of up to 28 bytes (two or more fit in a 64-byte
//   line beside an 8-byte turn word): each cache line holds one turn word and as many
//   elements as fit (seven of 8 bytes). The producer fills a line in order and stores its
//   turn after each element; the consumer reads the turn of the line it takes from. One
//   line carries several elements across, with one turn word between them.
// - cached_head, the default for larger elements: each slot holds an element followed by
//   the 32-bit position it was written for (plus 1); the consumer looks at that slot alone.
// - slot_turns: as cached_head, and the producer, too, looks at the slot it is about to
//   fill instead of the consumer's index (the consumer hands each slot back by writing
//   its next turn), so the only lines that travel are the slots'.
// Each index shares its cache line with nothing the other side writes in the steady
// state: the lines that travel between the cores are the elements' own, from the
// producer to the consumer, and the head's line when the producer has caught up with the
// consumer. A consumer that has caught up waits on the line it will read, not on the
// producer's index line, which the producer then keeps.
//
// Blocking calls try once inline, then spin briefly and sleep (detail::wait_point). A
// consumer that sleeps registers in the producer's line, which each push looks at anyway.
// A producer sleeps only on a full ring: cached_head's pop looks at the slot just behind
// its own (a line it has just read) and at the producer's sleeper word only when that
// slot says the ring was full; slot_turns keeps that word on the consumer's own line
// (its producer never reads the head), line_turns on a line of its own. The closed flag,
// written once, sits with the read-only fields.
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

// Where an spsc_ring keeps its elements and how each side learns of the other's progress
// (see the header comment).
enum class spsc_layout { cached_head, slot_turns, line_turns };

namespace detail {
// line_turns' unit: one cache line, what moves between cores (cache_line_size, 128, is the
// distance that keeps two written words apart, prefetch included).
inline constexpr std::size_t turn_line_size = 64;
// How many T fit in such a line after its 8-byte turn word.
template <class T>
inline constexpr std::size_t line_items =
    alignof(T) >= turn_line_size ? 0
                                 : (turn_line_size - (alignof(T) > 8 ? alignof(T) : 8)) / sizeof(T);
}  // namespace detail

// The default: line_turns where a line holds two elements or more, else cached_head.
template <class T>
inline constexpr spsc_layout default_spsc_layout =
    detail::line_items<T> >= 2 ? spsc_layout::line_turns : spsc_layout::cached_head;

template <class T, spsc_layout Layout = default_spsc_layout<T>>
class spsc_ring {
  static_assert(std::is_nothrow_destructible_v<T>, "spsc_ring: T must be nothrow destructible");
  static_assert(std::is_move_constructible_v<T>, "spsc_ring: T must be move constructible");
  static_assert(Layout != spsc_layout::line_turns || detail::line_items<T> >= 1,
                "spsc_ring: line_turns needs an element that fits in a cache line beside an "
                "8-byte turn word; use cached_head (the default for larger elements)");

  static constexpr bool by_value = detail::push_by_value<T>;  // see detail::push_by_value

 public:
  using value_type = T;

  // @throws config_error unless capacity is a power of two in [2, 2^30].
  explicit spsc_ring(std::size_t capacity)
      : capacity_((detail::check_ring_capacity("spsc_ring", capacity), capacity)),
        mask_(units(capacity) - 1),
        slots_(units(capacity)) {
    // Published with the ring itself.
    if constexpr (Layout == spsc_layout::line_turns) {
      // Turn 0: below every position's line_turn().
      for (std::size_t i = 0; i < units(capacity); ++i)
        ::new (static_cast<void*>(slots_.data() + i)) unit(0);
    } else {
      // Slot i holds turn i: free for position i (slot_turns), and a turn the consumer,
      // which asks slot i for i + 1, i + 1 + capacity, ..., never reads as an element.
      for (std::size_t i = 0; i < capacity; ++i)
        ::new (static_cast<void*>(slots_.data() + i)) unit(free_turn(i));
    }
  }

  ~spsc_ring() {
    // The threads are done: positions [head, tail) hold elements.
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);
    for (std::size_t i = consumer_.head.load(std::memory_order_relaxed); i != tail; ++i)
      std::destroy_at(at(i).element);
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
  // adds what its waits cost to *timing. A small trivially copyable T (two words at most)
  // is taken by value, which a caller's loop keeps in registers; any other T by
  // reference, copied or moved once, into its slot.
  // @note blocks the calling (producer) thread.
  CONVEYOR_HOT_INLINE bool push(T v, wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>)
    requires by_value
  {
    // NOLINTNEXTLINE(bugprone-use-after-move): emplace() moves v only when it succeeds
    if (emplace(std::move(v))) return true;
    // NOLINTNEXTLINE(bugprone-use-after-move): as above
    return push_slow<T>(v, timing);
  }
  CONVEYOR_HOT_INLINE bool push(T&& v, wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>)
    requires(!by_value)
  {
    // NOLINTNEXTLINE(bugprone-use-after-move): emplace() moves v only when it succeeds
    if (emplace(std::move(v))) return true;
    // NOLINTNEXTLINE(bugprone-use-after-move): as above
    return push_slow<T&&>(std::move(v), timing);
  }
  CONVEYOR_HOT_INLINE bool push(const T& v, wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_copy_constructible_v<T>)
    requires(!by_value)
  {
    if (emplace(v)) return true;
    return push_slow<const T&>(v, timing);
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
    const place p = at(head);
    if (!takable(p, head)) return std::nullopt;
    if (position) *position = head;
    return take(p, head);
  }

  // As try_pop(), into an element the caller has (move-assigned): for a consumer that
  // reuses its own storage. false when there is none now. A throwing assignment leaves
  // the element in the ring.
  CONVEYOR_HOT_INLINE bool try_pop(T& out) noexcept(std::is_nothrow_move_assignable_v<T>)
    requires std::is_move_assignable_v<T>
  {
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    const place p = at(head);
    if (!takable(p, head)) return false;
    out = std::move(*p.element);  // a throw leaves the element in place
    release(p, head);
    return true;
  }

  // Blocks while empty. Returns nullopt only when the ring is closed and drained. With
  // position: the element's position (see try_pop(std::size_t*)); with timing: adds what
  // its waits cost to *timing.
  // @note blocks the calling (consumer) thread.
  CONVEYOR_HOT_INLINE std::optional<T> pop(
      std::size_t* position = nullptr,
      wait_timing* timing = nullptr) noexcept(std::is_nothrow_move_constructible_v<T>) {
    // cached_head: the wait inline too (pop_unless()); through pop_slow() its blocking
    // consumer moved fewer elements (benchmarks/RESULTS.md, "Rings").
    if constexpr (Layout == spsc_layout::cached_head) {
      return pop_unless([] { return false; }, position, timing);
    } else {
      const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
      if (const place p = at(head); takable(p, head)) {
        if (position) *position = head;
        return take(p, head);
      }
      return pop_slow(position, timing);
    }
  }

  // As pop(), but gives up at the deadline: nullopt then means timed out, or closed and
  // drained (closed() tells which).
  // @note blocks the calling (consumer) thread until the deadline at most.
  std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    const std::size_t head = consumer_.head.load(std::memory_order_relaxed);  // we own head
    const place p = at(head);
    const auto ready = [&] { return takable(p, head) || closed(); };
    if (!ready() && !not_empty_.wait_until(ready, deadline)) return std::nullopt;  // timed out
    if (!takable(p, head)) return std::nullopt;  // closed and drained
    return take(p, head);
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
    const place p = at(head);
    for (;;) {
      if (takable(p, head)) break;
      // Elements pushed before close() are visible once closed() is seen (acquire).
      if (closed() || give_up()) {
        if (takable(p, head)) break;
        return std::nullopt;
      }
      // run: the element after it is there too (the producer streams; see wait_point).
      not_empty_.wait([&] { return takable(p, head) || closed() || give_up(); },
                      [&] { return takable(at(head + 1), head + 1); }, timing);
    }
    if (position) *position = head;
    return take(p, head);  // the one move: into the value returned
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
    for (; head - first < max; ++head) {
      const place p = at(head);
      if (!takable(p, head)) break;
      T v{std::move(*p.element)};  // the one move; a throw leaves the element in place
      release(p, head);
      if (!f(std::move(v))) {
        ++head;
        break;
      }
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
  struct place;  // where a position lives (see at())

  // pop() once the ring was empty (line_turns, slot_turns): wait for an element, out of
  // line (as push_slow()), so that a caller's loop inlines pop()'s fast path alone.
  [[gnu::noinline]] std::optional<T> pop_slow(std::size_t* position, wait_timing* timing) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return pop_unless([] { return false; }, position, timing);
  }

  // push() once the ring was full: wait for room, out of line. V: T (by_value: in
  // registers), T&& or const T& (as push() took it).
  template <class V>
  [[gnu::noinline]] bool push_slow(V v, wait_timing* timing) noexcept(
      std::is_nothrow_constructible_v<T, V&&>) {
    for (;;) {
      if (closed()) return false;
      // run: room for a second element too (the consumer streams; see wait_point).
      not_full_.wait([this] { return has_room() || closed(); }, [this] { return has_room(2); },
                     timing);
      // NOLINTNEXTLINE(bugprone-use-after-move): emplace() moves v only when it succeeds
      if (emplace(std::forward<V>(v))) return true;
    }
  }

  template <class... Args>
  CONVEYOR_HOT_INLINE bool emplace(Args&&... args) {
    // relaxed: an advisory refusal (see close()).
    if (closed_.load(std::memory_order_relaxed)) return false;
    const std::size_t tail = producer_.tail.load(std::memory_order_relaxed);  // we own tail
    const place p = at(tail);
    if constexpr (Layout == spsc_layout::slot_turns) {
      // acquire: pairs with the release store of the free turn in release(); the
      // consumer's move-out and destruction of that slot happen-before we fill it.
      if (p.holder->turn.load(std::memory_order_acquire) != free_turn(tail)) return false;  // full
    } else if (tail - producer_.head_cache == capacity_) {
      // acquire: pairs with the release store of head in release(); as above.
      producer_.head_cache = consumer_.head.load(std::memory_order_acquire);
      if (tail - producer_.head_cache == capacity_) return false;  // full
    }
    ::new (static_cast<void*>(p.element)) T(std::forward<Args>(args)...);  // may throw:
    // nothing is published then.
    // release: pairs with the acquire load of the turn in takable(); the construction
    // above (line_turns: and every earlier one in its line) happens-before the consumer
    // reads the element.
    if constexpr (Layout == spsc_layout::line_turns)
      p.holder->turn.store(line_turn(tail), std::memory_order_release);
    else
      p.holder->turn.store(turn_of(tail), std::memory_order_release);
    // relaxed: our own index, read by size_approx() (an estimate) and the destructor.
    producer_.tail.store(tail + 1, std::memory_order_relaxed);
    not_empty_.notify(producer_.consumer_sleeps);  // a word on our own line
    return true;
  }

  // The producer: room for n more (for a blocked push's wait; n <= capacity).
  bool has_room(std::size_t n = 1) const noexcept {
    const std::size_t last = producer_.tail.load(std::memory_order_relaxed) + n - 1;
    // acquire: as in emplace(). slot_turns: the consumer frees slots in order, so the
    // last one free means the ones before it are too.
    if constexpr (Layout == spsc_layout::slot_turns)
      return at(last).holder->turn.load(std::memory_order_acquire) == free_turn(last);
    return last - consumer_.head.load(std::memory_order_acquire) < capacity_;
  }

  // The consumer: whether the element at position head (its own, at p) is there.
  CONVEYOR_HOT_INLINE bool takable(const place& p, std::size_t head) const noexcept {
    // acquire: pairs with the release store of the turn in emplace(); the element is
    // constructed before we see its turn.
    if constexpr (Layout == spsc_layout::line_turns)
      return p.holder->turn.load(std::memory_order_acquire) >= line_turn(head);
    return p.holder->turn.load(std::memory_order_acquire) == turn_of(head);
  }
  // line_turns: the turn a line holds once position pos's element is in it, and every
  // earlier one of its lap: its lap's count of lines, times 64, plus how many of the
  // line's elements are there. A line's turn only grows (within a lap, element by
  // element; from lap to lap, by 64 x lines), so a turn at least pos's says pos is there:
  // the producer writes in order, and cannot reuse pos's place before the consumer has
  // taken pos (capacity <= lines x line_items). 64-bit: wraps after 2^58 positions.
  static std::uint64_t line_turn(std::size_t pos) noexcept {
    const std::uint64_t lap_line = pos / per_line;
    return lap_line * 64 + (pos - lap_line * per_line) + 1;
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
  CONVEYOR_HOT_INLINE std::optional<T> take(const place& p, std::size_t head) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    struct release_slot {
      spsc_ring& ring;
      const place& p;
      std::size_t head;
      int exceptions = std::is_nothrow_move_constructible_v<T> ? 0 : std::uncaught_exceptions();
      CONVEYOR_HOT_INLINE ~release_slot() {
        if constexpr (!std::is_nothrow_move_constructible_v<T>)
          if (std::uncaught_exceptions() != exceptions) return;  // the move threw
        ring.release(p, head);
      }
    } release{*this, p, head};
    return std::optional<T>(std::in_place, std::move(*p.element));
  }

  // The consumer is done with the element at position head, at p (moved out): it is
  // destroyed and its slot goes back to the producer.
  CONVEYOR_HOT_INLINE void release(const place& p, std::size_t head) noexcept {
    std::destroy_at(p.element);
    if constexpr (Layout == spsc_layout::slot_turns) {
      // release: pairs with the acquire load of the turn in emplace() / has_room(); the
      // move-out and the destruction happen-before the producer fills the slot again.
      p.holder->turn.store(free_turn(head + capacity_), std::memory_order_release);
      // relaxed: read only by size_approx() (an estimate) and the destructor.
      consumer_.head.store(head + 1, std::memory_order_relaxed);
      // The consumer's own line: notify() costs a load of a line it holds.
      not_full_.notify(consumer_.producer_sleeps);
    } else {
      // release: pairs with the acquire load of head in emplace() / has_room(); the
      // move-out and the destruction happen-before the producer fills the place again.
      consumer_.head.store(head + 1, std::memory_order_release);
      if constexpr (Layout == spsc_layout::line_turns) {
        // The producer's sleeper word has a line of its own (producer_sleeps_apart_):
        // a load from a line nobody writes until a producer sleeps.
        not_full_.notify(producer_sleeps_apart_.word);
      } else {
        // A producer sleeps only on a full ring, after it wrote position head - 1 +
        // capacity into the slot just behind this one: the consumer looks there (a line
        // it has just read) and at the producer's sleeper word only when that slot says
        // the ring was full.
        not_full_.notify_if([&] { return full_behind(head); });
      }
    }
  }

  // The consumer, having taken position head: whether the producer had then filled the
  // ring (written position head - 1 + capacity, the slot just behind head's). relaxed:
  // notify_if()'s fence orders it after our release of head; the producer wrote that
  // turn before it registered to sleep.
  CONVEYOR_HOT_INLINE bool full_behind(std::size_t head) const noexcept {
    return at(head - 1).holder->turn.load(std::memory_order_relaxed) ==
           turn_of(head - 1 + capacity_);
  }

  // The turn follows the element. A slot that spans two cache lines is then written in
  // address order, the turn last, into the last line the element touches: the producer
  // never goes back to a line it has left. A consumer that looks at the turn right behind
  // the producer (a try_pop loop) would take that line from it in between, once more per
  // element (benchmarks/RESULTS.md, "Rings": 64-byte elements on epyc-zen5).
  struct slot {
    explicit slot(std::uint32_t t) noexcept : turn(t) {}
    alignas(T) unsigned char bytes[sizeof(T)];  // the element, while it holds one
    std::atomic<std::uint32_t> turn;
  };
  // line_turns: a cache line of elements (positions lap_line x per_line onwards) behind
  // one turn word.
  static constexpr std::size_t per_line = detail::line_items<T> >= 1 ? detail::line_items<T> : 1;
  struct alignas(detail::turn_line_size) line {
    explicit line(std::uint64_t t) noexcept : turn(t) {}
    std::atomic<std::uint64_t> turn;
    alignas(T) unsigned char bytes[per_line][sizeof(T)];  // the elements, while there
  };
  using unit = std::conditional_t<Layout == spsc_layout::line_turns, line, slot>;
  // How many slots (or lines) a ring of this capacity has: line_turns, enough lines for
  // capacity elements, a power of two of them.
  static std::size_t units(std::size_t capacity) noexcept {
    if constexpr (Layout == spsc_layout::line_turns) {
      std::size_t lines = 1;
      while (lines * per_line < capacity) lines *= 2;
      return lines;
    } else {
      return capacity;
    }
  }

  // Where position pos lives: the unit that holds it (a slot or a line, with the turn)
  // and its element. Each call takes it once: an atomic access between two uses would
  // have the compiler read slots_ and mask_ again.
  struct place {
    unit* holder;
    T* element;
  };
  CONVEYOR_HOT_INLINE place at(std::size_t pos) const noexcept {
    if constexpr (Layout == spsc_layout::line_turns) {
      const std::size_t lap_line = pos / per_line;
      unit* const u = slots_.data() + (lap_line & mask_);
      return {u, std::launder(reinterpret_cast<T*>(u->bytes[pos - lap_line * per_line]))};
    } else {
      unit* const u = slots_.data() + (pos & mask_);
      return {u, std::launder(reinterpret_cast<T*>(u->bytes))};
    }
  }

  // The producer's line: how many elements it has pushed and its copy of the consumer's
  // head (cached_head, line_turns; both written by the producer only), and where a
  // sleeping consumer registers (not_empty_'s waiting word, written when it sleeps). The
  // producer reads all three on every push.
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
  static_assert(Layout != spsc_layout::line_turns || sizeof(line) == detail::turn_line_size,
                "spsc_ring: a line_turns unit must be exactly one cache line");
  static_assert(sizeof(producer_side) == cache_line_size &&
                    sizeof(consumer_side) == cache_line_size,
                "spsc_ring: each side's index and cache must own exactly one cache line");

  // Read-only after construction, but for the closed flag, written once: both sides read
  // this line on every call (the flag each time they find nothing to do) and keep it.
  alignas(cache_line_size) const std::size_t capacity_;
  const std::size_t mask_;
  detail::aligned_slots<unit> slots_;
  std::atomic<bool> closed_{false};
  producer_side producer_;
  consumer_side consumer_;
  aligned_wait_point not_empty_{producer_.consumer_sleeps};  // consumer sleeps; producer notifies
  // line_turns: where a sleeping producer registers, on a line of its own. The consumer
  // looks there on every pop, and its own line (the head) travels to the producer
  // whenever the producer refreshes its cache: a load there after the head's store would
  // wait for that line to come back.
  struct alignas(cache_line_size) apart_word {
    std::atomic<std::uint32_t> word{0};
  } producer_sleeps_apart_;
  aligned_wait_point not_full_{
      Layout == spsc_layout::line_turns
          ? producer_sleeps_apart_.word
          : consumer_.producer_sleeps};  // producer sleeps; consumer notifies
};

}  // namespace conveyor
