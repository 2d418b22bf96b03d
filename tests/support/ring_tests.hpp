// Behaviour every conveyor ring shares, written once as templates and instantiated by
// test_spsc_ring.cpp and test_mpmc_ring.cpp with their own ring type.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "test_support.hpp"

namespace conveyor::test {

template <template <class> class Ring>
void check_noexcept_follows_element() {
  static_assert(noexcept(std::declval<Ring<int>&>().try_push(1)));
  static_assert(noexcept(std::declval<Ring<int>&>().try_pop()));
  static_assert(noexcept(std::declval<Ring<int>&>().push(1)));
  static_assert(noexcept(std::declval<Ring<int>&>().pop()));
  static_assert(noexcept(std::declval<Ring<int>&>().close()));
  static_assert(!noexcept(
      std::declval<Ring<throwing_move_only>&>().try_push(std::declval<throwing_move_only&&>())));
  static_assert(!noexcept(
      std::declval<Ring<throwing_move_only>&>().push(std::declval<throwing_move_only&&>())));
  static_assert(!noexcept(std::declval<Ring<throwing_move_only>&>().try_pop()));
  static_assert(!noexcept(std::declval<Ring<throwing_move_only>&>().pop()));
}

template <template <class> class Ring>
void check_capacity_errors() {
  const auto [bad, suggestion] =
      GENERATE(table<std::size_t, std::string>({{0, "pass 2"},
                                                {1, "pass 2"},
                                                {3, "pass 4"},
                                                {1000, "pass 1024"},
                                                {(std::size_t{1} << 30) + 1, "pass 1073741824"},
                                                {~std::size_t{0}, "pass 1073741824"}}));
  CAPTURE(bad);
  try {
    Ring<int> r{bad};
    FAIL("constructed a ring with capacity " << bad);
  } catch (const config_error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("power of two"));
    CHECK_THAT(what, Catch::Contains(suggestion));
  }
}

// One thread, random operations against a std::deque model.
template <template <class> class Ring>
void check_against_model() {
  const std::size_t capacity = GENERATE(2u, 4u, 64u, 1024u);
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  CAPTURE(capacity, seed);
  Ring<std::uint64_t> ring{capacity};
  std::deque<std::uint64_t> model;
  std::mt19937 rng{seed};
  std::uint64_t next = 0;
  REQUIRE(ring.capacity() == capacity);
  for (int op = 0; op < 20000; ++op) {
    if (rng() % 2 == 0) {
      const bool ok = ring.try_push(next);
      REQUIRE(ok == (model.size() < capacity));
      if (ok) model.push_back(next);
      ++next;
    } else {
      const auto v = ring.try_pop();
      REQUIRE(v.has_value() == !model.empty());
      if (v) {
        REQUIRE(*v == model.front());
        model.pop_front();
      }
    }
    REQUIRE(ring.size_approx() == model.size());
  }
}

template <template <class> class Ring>
void check_lifetimes() {
  REQUIRE(counted::live.load() == 0);
  {
    Ring<counted> ring{8};
    for (std::uint64_t i = 0; i < 8; ++i) REQUIRE(ring.try_push(counted{i}));
    REQUIRE_FALSE(ring.try_push(counted{99}));
    CHECK(counted::live.load() == 8);
    for (std::uint64_t i = 0; i < 5; ++i) REQUIRE(ring.try_pop()->value == i);
    CHECK(counted::live.load() == 3);
    const counted c{42};
    REQUIRE(ring.try_push(c));  // copy overload
    CHECK(counted::live.load() == 5);
    // The ring wraps here: 4 live elements spanning the end of the slot array.
    for (std::uint64_t i = 0; i < 3; ++i) REQUIRE(ring.push(counted{100 + i}));
  }
  CHECK(counted::live.load() == 0);  // elements left inside died with the ring
}

// An element whose next copy, move or construction from an int can be told to throw,
// counting the objects alive and every move made: what the rings' exception guarantees
// and their one move per pop are checked with.
struct fragile {
  static inline std::atomic<long> live{0};
  static inline std::atomic<long> moves{0};
  // The next operation of that kind throws (and clears its flag).
  static inline bool throw_on_make = false, throw_on_copy = false, throw_on_move = false;

  explicit fragile(int v) : value(v) {
    fail_if(throw_on_make);
    ++live;
  }
  fragile(const fragile& o) : value(o.value) {
    fail_if(throw_on_copy);
    ++live;
  }
  fragile(fragile&& o) noexcept(false) : value(o.value) {
    fail_if(throw_on_move);
    ++moves;
    ++live;
  }
  fragile& operator=(const fragile&) = delete;
  ~fragile() { --live; }

  static void fail_if(bool& flag) {
    if (!flag) return;
    flag = false;
    throw std::runtime_error("fragile: told to throw");
  }
  int value;

 protected:
  struct never_throws {};
  fragile(int v, never_throws) noexcept : value(v) { ++live; }
};

// The same with a move that never throws: only its copies and constructions can.
struct fragile_copy : fragile {
  using fragile::fragile;
  fragile_copy(const fragile_copy&) = default;
  fragile_copy(fragile_copy&& o) noexcept : fragile(o.value, never_throws{}) { ++moves; }
};

// push() of an element that is not small and trivially copyable takes it by reference:
// a temporary is moved into its slot once, an lvalue copied there with no move, and a
// push that finds the ring full moves its element in once, after a pop makes room.
template <template <class> class Ring>
void check_push_moves_once() {
  static_assert(!std::is_trivially_copyable_v<fragile>);
  fragile::live.store(0);
  {
    Ring<fragile> ring{2};
    fragile::moves.store(0);
    REQUIRE(ring.push(fragile{1}));
    CHECK(fragile::moves.load() == 1);  // the temporary into the slot
    const fragile two{2};
    fragile::moves.store(0);
    REQUIRE(ring.push(two));  // copied into the slot, no move on the way
    CHECK(fragile::moves.load() == 0);
    fragile::moves.store(0);
    bool pushed = false;
    std::thread producer{[&] { pushed = ring.push(fragile{3}); }};
    auto first = ring.pop();
    producer.join();
    CHECK(pushed);
    REQUIRE(first);
    CHECK(first->value == 1);
    CHECK(fragile::moves.load() == 2);  // the popped element out, the pushed one in
    auto second = ring.pop();
    auto third = ring.pop();
    REQUIRE(second);
    REQUIRE(third);
    CHECK(second->value == 2);
    CHECK(third->value == 3);
  }
  CHECK(fragile::live.load() == 0);
}

// try_emplace builds the element in its slot from the arguments, and leaves them alone
// when it fails (full or closed), so the caller can still push them another way.
template <template <class> class Ring>
void check_try_emplace() {
  REQUIRE(counted::live.load() == 0);
  {
    Ring<counted> ring{4};
    for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(ring.try_emplace(i));
    CHECK(counted::live.load() == 4);  // no temporary was made and destroyed on the way
    REQUIRE_FALSE(ring.try_emplace(std::uint64_t{99}));
    CHECK(counted::live.load() == 4);
    for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(ring.try_pop()->value == i);
  }
  CHECK(counted::live.load() == 0);

  using element = std::pair<std::unique_ptr<int>, int>;
  Ring<element> ring{2};
  auto p = std::make_unique<int>(1);
  REQUIRE(ring.try_emplace(std::move(p), 10));
  CHECK(p == nullptr);  // taken on success
  REQUIRE(ring.try_emplace(std::make_unique<int>(2), 20));
  p = std::make_unique<int>(3);
  REQUIRE_FALSE(ring.try_emplace(std::move(p), 30));  // full
  REQUIRE(p != nullptr);
  CHECK(*p == 3);
  auto first = ring.try_pop();
  REQUIRE(first);
  CHECK(*first->first == 1);
  CHECK(first->second == 10);
  ring.close();
  REQUIRE_FALSE(ring.try_emplace(std::move(p), 30));  // closed
  REQUIRE(p != nullptr);
  CHECK(*ring.try_pop()->first == 2);
  CHECK_FALSE(ring.try_pop().has_value());
}

template <template <class> class Ring>
void check_move_only() {
  Ring<std::unique_ptr<int>> ring{4};
  REQUIRE(ring.try_push(std::make_unique<int>(1)));
  REQUIRE(ring.push(std::make_unique<int>(2)));
  REQUIRE(**ring.try_pop() == 1);
  REQUIRE(**ring.pop() == 2);
  REQUIRE_FALSE(ring.try_pop().has_value());
}

// An element over-aligned for its size, that checks where it is built.
struct alignas(32) over_aligned {
  explicit over_aligned(std::uint64_t v) noexcept : value(v) { check(); }
  over_aligned(over_aligned&& o) noexcept : value(o.value) { check(); }
  over_aligned& operator=(over_aligned&&) = delete;
  void check() const noexcept {
    if (reinterpret_cast<std::uintptr_t>(this) % alignof(over_aligned) != 0) misplaced = true;
  }
  std::uint64_t value;
  static inline bool misplaced = false;
};

// Elements smaller and larger than the slot's bookkeeping, and over-aligned ones, come
// back intact through several laps of the slot array, and are built where they belong.
template <template <class> class Ring>
void check_element_layouts() {
  Ring<char> chars{4};
  Ring<std::string> strings{4};
  Ring<over_aligned> aligned{4};
  for (std::uint64_t i = 0; i < 20; ++i) {  // 5 laps, each ring one to three full
    const std::size_t burst = 1 + i % 4;
    for (std::size_t k = 0; k < burst; ++k) {
      REQUIRE(chars.try_push(static_cast<char>('a' + (i + k) % 26)));
      REQUIRE(strings.try_push(std::string(40 + k, static_cast<char>('a' + i % 26))));
      REQUIRE(aligned.try_emplace(i * 10 + k));
    }
    for (std::size_t k = 0; k < burst; ++k) {
      REQUIRE(*chars.try_pop() == static_cast<char>('a' + (i + k) % 26));
      REQUIRE(*strings.try_pop() == std::string(40 + k, static_cast<char>('a' + i % 26)));
      REQUIRE(aligned.try_pop()->value == i * 10 + k);
    }
  }
  CHECK_FALSE(over_aligned::misplaced);
  CHECK(chars.size_approx() == 0);
}

template <template <class> class Ring>
void check_close_and_drain() {
  Ring<int> ring{4};
  REQUIRE(ring.try_push(1));
  REQUIRE(ring.push(2));
  REQUIRE_FALSE(ring.closed());
  ring.close();
  REQUIRE(ring.closed());
  REQUIRE_FALSE(ring.try_push(3));
  REQUIRE_FALSE(ring.push(4));
  REQUIRE(ring.pop() == std::optional<int>{1});
  REQUIRE(ring.try_pop() == std::optional<int>{2});
  REQUIRE_FALSE(ring.pop().has_value());
  REQUIRE_FALSE(ring.pop().has_value());  // stays closed and drained
}

// A blocked consumer wakes on a push, and on close(); a blocked producer wakes on a
// pop, and on close(). The waits are ordered by flags, not sleeps: the sleep only gives
// the blocked thread time to really go to sleep, the outcome does not depend on it.
template <template <class> class Ring>
void check_blocking_wakeups() {
  using namespace std::chrono_literals;
  {
    Ring<int> ring{2};
    std::optional<int> got;
    std::thread consumer{[&] { got = ring.pop(); }};
    std::this_thread::sleep_for(20ms);
    REQUIRE(ring.push(7));
    consumer.join();
    REQUIRE(got == std::optional<int>{7});
  }
  {
    Ring<int> ring{2};
    std::optional<int> got{1};
    std::thread consumer{[&] { got = ring.pop(); }};
    std::this_thread::sleep_for(20ms);
    ring.close();
    consumer.join();
    REQUIRE_FALSE(got.has_value());
  }
  {
    Ring<int> ring{2};
    REQUIRE(ring.try_push(1));
    REQUIRE(ring.try_push(2));
    bool pushed = false;
    std::thread producer{[&] { pushed = ring.push(3); }};
    std::this_thread::sleep_for(20ms);
    REQUIRE(ring.pop() == std::optional<int>{1});
    producer.join();
    REQUIRE(pushed);
    REQUIRE(ring.size_approx() == 2);
  }
  {
    Ring<int> ring{2};
    REQUIRE(ring.try_push(1));
    REQUIRE(ring.try_push(2));
    bool pushed = true;
    std::thread producer{[&] { pushed = ring.push(3); }};
    std::this_thread::sleep_for(20ms);
    ring.close();
    producer.join();
    REQUIRE_FALSE(pushed);
  }
}

// Many short rounds with random pauses on both sides, so that the consumer goes to
// sleep at every possible moment relative to the producer's push and close. A lost
// wake-up hangs a round, and the CTest TIMEOUT turns that into a failure.
template <template <class> class Ring>
void hunt_lost_wakeups(bool symmetric_barrier) {
  detail::force_symmetric_barrier().store(symmetric_barrier);
  const std::size_t rounds = scaled(2000);
  std::mt19937 rng{12345};
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t capacity = std::size_t{2} << (rng() % 3);
    const int items = static_cast<int>(rng() % 16);
    const unsigned pause_p = rng() % 4, pause_c = rng() % 4;
    Ring<int> ring{capacity};
    long sum = 0;
    int count = 0;
    std::thread consumer{[&] {
      std::minstd_rand r{static_cast<unsigned>(round)};
      while (auto v = ring.pop()) {
        sum += *v;
        ++count;
        if (pause_c && r() % pause_c == 0) std::this_thread::yield();
      }
    }};
    std::minstd_rand r{static_cast<unsigned>(round) + 1};
    for (int i = 1; i <= items; ++i) {
      REQUIRE(ring.push(int{i}));
      if (pause_p && r() % pause_p == 0) std::this_thread::yield();
    }
    ring.close();
    consumer.join();
    REQUIRE(count == items);
    REQUIRE(sum == static_cast<long>(items) * (items + 1) / 2);
  }
  detail::force_symmetric_barrier().store(false);
}

// While it lives, every wait point judges the machine as `judged` (see
// detail::load_judgement): loaded, its sleepers accept batched wake-ups; unloaded, they
// never do, whatever the machine's real load (CI: two cores, sanitizers, ctest in
// parallel, where a waiter could otherwise judge the load real).
class judged_load {
 public:
  explicit judged_load(detail::load_judgement judged) { detail::judged_load().store(judged); }
  ~judged_load() { detail::judged_load().store(detail::load_judgement::measured); }
  judged_load(const judged_load&) = delete;
  judged_load& operator=(const judged_load&) = delete;
};

// The hunt above with batched wake-ups (what a ring does under load): both sides' sleepers
// accept them and both threads put theirs off. Items must still all arrive, and a wake-up
// put off by a thread that then neither pushes nor waits (a stage stuck in its own code)
// must still reach the sleeper: the producer here, after a few pushes, waits for the
// consumer to have taken them without touching the ring. A lost one hangs the round:
// the CTest TIMEOUT turns that into a failure.
template <template <class> class Ring>
void hunt_lost_wakeups_batched() {
  const std::size_t rounds = scaled(1000);
  std::mt19937 rng{4242};
  for (std::size_t round = 0; round < rounds; ++round) {
    const std::size_t capacity = std::size_t{2} << (rng() % 4);
    const int items = static_cast<int>(rng() % 40);
    const unsigned pause_p = rng() % 4, pause_c = rng() % 4;
    const int stall_at = items > 0 ? static_cast<int>(rng() % static_cast<unsigned>(items)) + 1 : 0;
    Ring<int> ring{capacity};
    ring.batch_wakeups(static_cast<std::uint32_t>(capacity / 2));  // as a pipeline's rings
    const judged_load loaded{detail::load_judgement::loaded};
    long sum = 0;
    std::atomic<int> count{0};
    std::thread consumer{[&] {
      detail::wake_batching batching;
      std::minstd_rand r{static_cast<unsigned>(round)};
      while (auto v = ring.pop()) {
        sum += *v;
        count.fetch_add(1, std::memory_order_relaxed);
        if (pause_c && r() % pause_c == 0) std::this_thread::yield();
      }
    }};
    {
      detail::wake_batching batching;
      std::minstd_rand r{static_cast<unsigned>(round) + 1};
      for (int i = 1; i <= items; ++i) {
        REQUIRE(ring.push(int{i}));
        if (pause_p && r() % pause_p == 0) std::this_thread::yield();
        if (i == stall_at) {  // "in its own code": no push, no wait on a wait point
          while (count.load(std::memory_order_relaxed) < i) std::this_thread::yield();
        }
      }
      ring.close();
    }
    consumer.join();
    REQUIRE(count.load() == items);
    REQUIRE(sum == static_cast<long>(items) * (items + 1) / 2);
  }
}

}  // namespace conveyor::test

namespace conveyor::test {

// pop_until: times out on an empty ring, returns an element pushed in time, and
// reports closed-and-drained as nullopt with closed() set.
template <template <class> class Ring>
void check_pop_until() {
  using namespace std::chrono_literals;
  Ring<int> ring{4};
  REQUIRE_FALSE(ring.pop_until(std::chrono::steady_clock::now() + 2ms).has_value());
  REQUIRE_FALSE(ring.closed());
  REQUIRE(ring.try_push(5));
  REQUIRE(ring.pop_until(std::chrono::steady_clock::now() + 1h) == std::optional<int>{5});
  std::optional<int> got;
  std::thread consumer{[&] { got = ring.pop_until(std::chrono::steady_clock::now() + 1h); }};
  REQUIRE(ring.push(6));
  consumer.join();
  REQUIRE(got == std::optional<int>{6});
  ring.close();
  REQUIRE_FALSE(ring.pop_until(std::chrono::steady_clock::now() + 1h).has_value());
  REQUIRE(ring.closed());
}

// try_pop(&pos) / pop(&pos) report each element's position: how many were pushed
// before it (what ordered stages restore the order from), across laps of the ring.
template <template <class> class Ring>
void check_positions() {
  Ring<int> ring{8};
  for (int i = 0; i < 20; ++i) {
    REQUIRE(ring.try_push(i * 10));
    std::size_t pos = 999;
    const auto v = (i % 2) ? ring.pop(&pos) : ring.try_pop(&pos);
    REQUIRE(v == std::optional<int>{i * 10});
    REQUIRE(pos == static_cast<std::size_t>(i));
  }
  for (int i = 0; i < 8; ++i) REQUIRE(ring.try_push(i));
  for (int i = 0; i < 8; ++i) {
    std::size_t pos = 999;
    REQUIRE(ring.try_pop(&pos) == std::optional<int>{i});
    REQUIRE(pos == static_cast<std::size_t>(20 + i));
  }
}

// The measured blocking pop and push (what a pipeline stage with metrics on uses): the same semantics as pop() and push(), plus what the waits cost. A
// wait of ~20 ms for the other side reaches the slow path, whose time is reported (all
// but the spin) and whose end is a reading taken inside the call; no wait, no cost.
template <template <class> class Ring>
void check_measured_waits() {
  using namespace std::chrono_literals;
  Ring<int> ring{2};
  wait_timing none;
  REQUIRE(ring.try_push(1));
  REQUIRE(ring.pop(nullptr, &none) == std::optional<int>{1});
  REQUIRE(ring.push(2, &none));
  CHECK(none.rounds == 0);
  CHECK(none.slow_ns == 0);
  CHECK(none.end_ns == 0);
  REQUIRE(ring.try_pop() == std::optional<int>{2});
  for (const bool popping : {false, true}) {
    CAPTURE(popping);
    // A wait that went as planned: the spin ran out, the slow path took most of it. The
    // other thread may come first when this one is preempted for 20 ms before it waits
    // (a loaded CI machine), so up to 5 attempts; every one must be consistent.
    bool as_planned = false;
    for (int attempt = 0; attempt < 5 && !as_planned; ++attempt) {
      if (!popping) {
        REQUIRE(ring.try_push(3));
        REQUIRE(ring.try_push(3));  // full: the push below waits for the other's pop
      }
      wait_timing t;
      bool other_ok = false;  // Catch's assertions belong to the test's thread
      std::thread other{[&] {
        std::this_thread::sleep_for(20ms);
        other_ok = popping ? ring.push(9) : ring.pop().has_value();
      }};
      const std::int64_t t0 = conveyor::now_ns();
      if (popping) {
        std::size_t pos = 0;
        REQUIRE(ring.pop(&pos, &t) == std::optional<int>{9});
      } else {
        REQUIRE(ring.push(4, &t));
        REQUIRE(ring.try_pop() == std::optional<int>{3});
        REQUIRE(ring.try_pop() == std::optional<int>{4});
      }
      const std::int64_t t1 = conveyor::now_ns();
      other.join();
      REQUIRE(other_ok);
      CAPTURE(attempt, t.rounds, t.slow_ns, t.end_ns, t1 - t0);
      CHECK(t.slow_ns >= 0);
      CHECK(t.slow_ns <= t1 - t0);
      if (t.end_ns == 0) {  // no slow path: nothing to report past the spin
        CHECK(t.slow_ns == 0);
        continue;
      }
      CHECK(t.end_ns <= t1);
      CHECK(t.end_ns - t.slow_ns >= t0);  // the slow path began inside the call
      // The spin before the slow path is 1024 rounds at most: far less than 20 ms.
      as_planned = t.rounds >= 1 && t1 - t0 >= 10'000'000 && t.slow_ns >= (t1 - t0) / 2;
    }
    CHECK(as_planned);
  }
  ring.close();
  wait_timing closed;
  REQUIRE_FALSE(ring.pop(nullptr, &closed).has_value());
  REQUIRE_FALSE(ring.push(5, &closed));
}

}  // namespace conveyor::test
