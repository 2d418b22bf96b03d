// spsc_ring, in every layout (and the default one): single-thread semantics, lifetimes,
// close/drain, wake-ups, a 10M-item in-order stress test and the consumer's view of the size.
#include "conveyor/ring/spsc_ring.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "conveyor/base/cpu_relax.hpp"
#include "ring_tests.hpp"

using conveyor::spsc_layout;
namespace t = conveyor::test;

// The layouts, as types for TEMPLATE_TEST_CASE: TestType::ring<T> is the ring.
struct cached_head {
  template <class T>
  using ring = conveyor::spsc_ring<T, spsc_layout::cached_head>;
};
struct slot_turns {
  template <class T>
  using ring = conveyor::spsc_ring<T, spsc_layout::slot_turns>;
};
// The default: line_turns for elements of up to 28 bytes (most cases here), cached_head
// for larger ones.
struct default_layout {
  template <class T>
  using ring = conveyor::spsc_ring<T>;
};
// line_turns named explicitly: also for elements whose default is cached_head (one to a
// line, over-aligned ones behind a padded turn word).
struct line_turns {
  template <class T>
  using ring = conveyor::spsc_ring<T, spsc_layout::line_turns>;
};
static_assert(conveyor::default_spsc_layout<std::uint64_t> == spsc_layout::line_turns);
static_assert(conveyor::default_spsc_layout<std::array<char, 24>> == spsc_layout::line_turns);
static_assert(conveyor::default_spsc_layout<std::array<char, 32>> == spsc_layout::cached_head);

TEMPLATE_TEST_CASE("spsc_ring: noexcept follows the element type", "", cached_head, slot_turns,
                   default_layout) {
  t::check_noexcept_follows_element<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: bad capacities throw config_error naming the fix", "", cached_head,
                   slot_turns, default_layout) {
  t::check_capacity_errors<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: random single-thread operations match a deque", "", cached_head,
                   slot_turns, default_layout) {
  t::check_against_model<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: constructions balance destructions", "", cached_head, slot_turns,
                   default_layout) {
  t::check_lifetimes<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: small, large and over-aligned elements survive laps", "",
                   cached_head, slot_turns, default_layout, line_turns) {
  t::check_element_layouts<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: move-only elements", "", cached_head, slot_turns, default_layout) {
  t::check_move_only<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: try_emplace builds in the slot and leaves its arguments on failure",
                   "", cached_head, slot_turns, default_layout) {
  t::check_try_emplace<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: close refuses pushes and drains to nullopt", "", cached_head,
                   slot_turns, default_layout) {
  t::check_close_and_drain<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: blocked threads wake on push, pop and close", "", cached_head,
                   slot_turns, default_layout) {
  t::check_blocking_wakeups<TestType::template ring>();
}
TEMPLATE_TEST_CASE("spsc_ring: lost-wakeup hunt, asymmetric barrier", "", cached_head, slot_turns,
                   default_layout) {
  t::hunt_lost_wakeups<TestType::template ring>(false);
}
TEMPLATE_TEST_CASE("spsc_ring: lost-wakeup hunt, portable barrier", "", cached_head, slot_turns,
                   default_layout) {
  t::hunt_lost_wakeups<TestType::template ring>(true);
}

TEMPLATE_TEST_CASE("spsc_ring: lost-wakeup hunt, batched wake-ups under load", "", cached_head,
                   slot_turns, default_layout) {
  t::hunt_lost_wakeups_batched<TestType::template ring>();
}

TEMPLATE_TEST_CASE("spsc_ring: 10M items arrive complete and in order", "", cached_head, slot_turns,
                   default_layout) {
  const bool blocking = GENERATE(true, false);
  const std::size_t capacity = GENERATE(2u, 1024u);
  const std::uint64_t n = t::scaled(10'000'000);
  CAPTURE(blocking, capacity, n);
  typename TestType::template ring<std::uint64_t> ring{capacity};
  std::thread producer{[&] {
    for (std::uint64_t i = 0; i < n; ++i) {
      if (blocking) {
        if (!ring.push(std::uint64_t{i})) return;
      } else {
        while (!ring.try_push(i)) std::this_thread::yield();
      }
    }
    ring.close();
  }};
  std::uint64_t expected = 0;
  bool in_order = true;
  if (blocking) {
    while (auto v = ring.pop()) in_order &= (*v == expected++);
  } else {
    while (expected < n) {
      if (auto v = ring.try_pop())
        in_order &= (*v == expected++);
      else
        std::this_thread::yield();
    }
  }
  producer.join();
  REQUIRE(in_order);
  REQUIRE(expected == n);
  REQUIRE_FALSE(ring.try_pop().has_value());
}

// drain: f on each element there, in order, up to the bound, stopping where f says so;
// each slot is the producer's again before f runs, as after a pop.
TEMPLATE_TEST_CASE("spsc_ring: a drain takes what is there, in order, up to its bound", "",
                   cached_head, slot_turns, default_layout) {
  typename TestType::template ring<std::unique_ptr<int>> ring{8};
  for (int i = 0; i < 8; ++i) REQUIRE(ring.try_push(std::make_unique<int>(i)));
  std::vector<int> seen;
  int stop_at = -1;  // f says false after this element
  auto f = [&](std::unique_ptr<int>&& p) noexcept {
    seen.push_back(*p);
    return *p != stop_at;
  };
  CHECK(ring.drain(f, 3) == 3);
  CHECK(seen == std::vector<int>{0, 1, 2});
  stop_at = 4;
  CHECK(ring.drain(f, 100) == 2);  // 3, and 4, where f said stop
  CHECK(seen == std::vector<int>{0, 1, 2, 3, 4});
  for (int i = 8; i < 13; ++i) REQUIRE(ring.try_push(std::make_unique<int>(i)));  // the freed slots
  CHECK_FALSE(ring.try_push(std::make_unique<int>(99)));                          // full again
  CHECK(ring.drain(f, 100) == 8);
  CHECK(seen.size() == 13);
  CHECK(std::is_sorted(seen.begin(), seen.end()));
  CHECK(seen.back() == 12);
  CHECK(ring.drain(f, 100) == 0);  // empty
  CHECK(ring.size_approx() == 0);
  REQUIRE(ring.try_push(std::make_unique<int>(13)));
  CHECK(ring.drain(f, 0) == 0);  // a bound of 0 takes nothing
  CHECK(ring.drain(f, 100) == 1);
  CHECK(seen.back() == 13);
  // f may refill the slot its element left (full before the burst).
  for (int i = 0; i < 8; ++i) REQUIRE(ring.try_push(std::make_unique<int>(20 + i)));
  bool refilled = true;
  auto refill = [&](std::unique_ptr<int>&& p) noexcept {
    refilled &= ring.try_push(std::move(p));
    return false;
  };
  CHECK(ring.drain(refill, 8) == 1);
  CHECK(refilled);
  CHECK(ring.size_approx() == 8);
}

TEMPLATE_TEST_CASE("spsc_ring: 10M items taken in bursts arrive complete and in order", "",
                   cached_head, slot_turns, default_layout) {
  const std::size_t capacity = GENERATE(2u, 1024u);
  const std::uint64_t n = t::scaled(10'000'000);
  CAPTURE(capacity, n);
  typename TestType::template ring<std::uint64_t> ring{capacity};
  std::thread producer{[&] {
    for (std::uint64_t i = 0; i < n; ++i)
      if (!ring.push(std::uint64_t{i})) return;
    ring.close();
  }};
  std::uint64_t expected = 0;
  bool in_order = true;
  auto f = [&](std::uint64_t&& v) noexcept {
    in_order &= (v == expected++);
    return expected % 97 != 0;  // now and then a burst cut short
  };
  for (;;) {
    if (ring.drain(f, 1 + expected % 64) != 0) continue;
    auto v = ring.pop();  // none there: wait for one, as a stage does
    if (!v) break;
    in_order &= (*v == expected++);
  }
  producer.join();
  REQUIRE(in_order);
  REQUIRE(expected == n);
}

TEMPLATE_TEST_CASE("spsc_ring: pop_until times out, delivers, and sees close", "", cached_head,
                   slot_turns, default_layout) {
  t::check_pop_until<TestType::template ring>();
}

TEMPLATE_TEST_CASE("spsc_ring: pop reports each element's position in push order", "", cached_head,
                   slot_turns, default_layout) {
  t::check_positions<TestType::template ring>();
}

TEMPLATE_TEST_CASE("spsc_ring: measured pop and push report what their waits cost", "", cached_head,
                   slot_turns, default_layout) {
  t::check_measured_waits<TestType::template ring>();
}

TEST_CASE("wait_point: a measured wait counts its spin rounds and reports its slow path") {
  using namespace std::chrono_literals;
  conveyor::detail::wait_point wp;
  // Ready at once: nothing spun, no slow path.
  conveyor::detail::wait_timing t;
  wp.wait([] { return true; }, &t);
  CHECK(t.rounds == 0);
  CHECK(t.slow_ns == 0);
  CHECK(t.end_ns == 0);
  // Ready at the 4th look: the first look, then 3 rounds of the spin.
  int looks = 0;
  wp.wait([&] { return ++looks == 4; }, &t);
  CHECK(t.rounds == 3);
  CHECK(t.slow_ns == 0);
  CHECK(t.end_ns == 0);
  // A deadline that passes: the spin runs out, the slow path ends at the deadline or
  // after it, and the costs add to what the timing already holds. (A thread preempted
  // past the deadline inside its spin gives up with no time in the slow path: up to 5
  // tries.)
  const auto ns = [](std::chrono::steady_clock::time_point p) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(p.time_since_epoch()).count();
  };
  bool slow_path = false;
  for (int attempt = 0; attempt < 5 && !slow_path; ++attempt) {
    conveyor::detail::wait_timing d = t;
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE_FALSE(wp.wait_until([] { return false; }, t0 + 5ms, &d));
    const auto t1 = std::chrono::steady_clock::now();
    CAPTURE(attempt, d.rounds, d.slow_ns, d.end_ns);
    CHECK(d.rounds > t.rounds);
    CHECK(d.slow_ns <= ns(t1) - ns(t0));
    if (d.end_ns != 0) {
      CHECK(d.end_ns >= ns(t0 + 5ms));
      CHECK(d.end_ns <= ns(t1));
    }
    slow_path = d.slow_ns > 0;  // 0: the deadline passed in the spin, or as it ended
  }
  CHECK(slow_path);
}

// Behind a partner that streams, a spin looks later: each wait whose first look finds a
// run (more than the step waited for) doubles the delay before the next spins' first
// look; one that finds that step alone keeps it; one whose first look finds nothing (a
// partner that answers later, or a spin that runs out) halves it. Judged unloaded, so
// that the spin learns whatever the machine does; the looks are counted, not timed.
TEST_CASE("wait_point: a spin looks later behind a partner that streams, sooner otherwise") {
  using conveyor::detail::wait_point;
  t::judged_load unloaded{conveyor::detail::load_judgement::unloaded};
  wait_point wp;
  REQUIRE(wp.first_look() == 0);
  const auto run = [] { return true; };
  const auto one = [] { return false; };
  // A waiter without run() never delays.
  int looks = 0;
  wp.wait([&] { return ++looks == 2; });  // the inline look, then the spin's first
  CHECK(wp.first_look() == 0);
  std::uint32_t first = 0;
  for (int k = 0; k < 10; ++k) {
    looks = 0;
    conveyor::detail::wait_timing t;
    wp.wait([&] { return ++looks == 2; }, run, &t);
    CAPTURE(k, first);
    CHECK(looks == 2);
    CHECK(t.rounds == first + 1);  // that look came after `first` pauses
    first = std::min(2 * first + 1, wait_point::max_first_look);
    CHECK(wp.first_look() == first);
  }
  REQUIRE(first == wait_point::max_first_look);
  // The step waited for and no more (a ping-pong): kept.
  looks = 0;
  wp.wait([&] { return ++looks == 2; }, one);
  CHECK(wp.first_look() == first);
  // Over at the spin's second look: the delay found nothing.
  looks = 0;
  conveyor::detail::wait_timing t;
  wp.wait([&] { return ++looks == 3; }, run, &t);
  CHECK(t.rounds == first + 2);
  first /= 2;
  CHECK(wp.first_look() == first);
  // A spin that runs out (the deadline passes): halved again.
  REQUIRE_FALSE(wp.wait_until([] { return false; },
                              std::chrono::steady_clock::now() + std::chrono::milliseconds(1)));
  first /= 2;
  CHECK(wp.first_look() == first);
  // Partners that answer later bring it back to 0.
  for (int k = 0; k < 10; ++k) {
    looks = 0;
    wp.wait([&] { return ++looks == 3; }, run);
  }
  CHECK(wp.first_look() == 0);
}

// The wait points' yields stop while they hand whole time slices to another process, and
// come back when that stops. Fed synthetic yields: what a yield took, and how much CPU
// time the process got meanwhile (negative: not watched).
TEST_CASE("yield_policy: lost yields pause yielding, progress and quiet bring it back") {
  using namespace std::chrono_literals;
  using conveyor::detail::yield_policy;
  yield_policy p;
  auto t = std::chrono::steady_clock::time_point{} + 1h;  // "now", moved by hand
  const auto yield = [&](std::chrono::microseconds took, std::int64_t cpu_ns) {
    p.yielded(t, t + took, p.watch() ? cpu_ns : -1);
    t += took;
  };
  const std::int64_t ms = 1'000'000;
  REQUIRE(p.may_yield(t));
  REQUIRE_FALSE(p.watch());
  // Short yields change nothing, whatever the CPU time.
  for (int i = 0; i < 100; ++i) yield(20us, 0);
  CHECK(p.may_yield(t));
  CHECK_FALSE(p.watch());
  // A long yield, not watched: the next ones are, and only they can pause the yields.
  yield(4ms, 0);
  CHECK(p.may_yield(t));
  CHECK(p.watch());
  // Long, but the process ran meanwhile (its own threads had the cores): progress.
  yield(3ms, 6 * ms);
  CHECK(p.may_yield(t));
  // Long, and the process got less than the yield lasted: lost. Paused for min_quiet.
  yield(4ms, ms / 2);
  CHECK_FALSE(p.may_yield(t));
  CHECK_FALSE(p.may_yield(t + yield_policy::min_quiet - 1us));
  CHECK(p.may_yield(t + yield_policy::min_quiet));
  // Lost again right after the pause: the pause doubles, up to max_quiet.
  auto pause = yield_policy::min_quiet;
  for (int i = 0; i < 10; ++i) {
    t += pause;
    REQUIRE(p.may_yield(t));
    yield(4ms, 0);
    pause = std::min<std::chrono::milliseconds>(2 * pause, yield_policy::max_quiet);
    CAPTURE(i, pause.count());
    CHECK_FALSE(p.may_yield(t + pause - 1us));
    CHECK(p.may_yield(t + pause));
  }
  CHECK(pause == yield_policy::max_quiet);
  // Long after the last lost yield, one more starts again from min_quiet.
  t += yield_policy::forget_after_quiets * yield_policy::max_quiet + 1ms;
  yield(4ms, 0);
  CHECK_FALSE(p.may_yield(t + yield_policy::min_quiet - 1us));
  CHECK(p.may_yield(t + yield_policy::min_quiet));
  // The watch ends after a few short yields: they no longer pay for a syscall each.
  t += yield_policy::min_quiet;
  int watched = 0;
  while (p.watch() && watched < 1000) {
    yield(20us, 0);
    ++watched;
  }
  CHECK(watched > 0);
  CHECK(watched < 1000);
  CHECK(p.may_yield(t));
}

// Under load a sleeper accepts a batched wake-up: a notifier inside a wake_batching scope
// puts it off until batch notifies have come, until it waits itself, or until its scope
// ends; a notifier outside one, a close (notify_now), and a sleeper not under load are
// woken at once. Counted in wake-ups (wakes()), which a backstop timeout does not change.
TEST_CASE("wait_point: batched wake-ups under load, and when they come") {
  using conveyor::detail::wait_point;
  using conveyor::detail::wake_batching;
  if (!conveyor::detail::asymmetric_barrier_enabled()) {
    WARN("no membarrier here: wake-ups are never put off, nothing to test");
    return;
  }
  wait_point w;
  w.batch_wakes(4);
  std::atomic<bool> done{false};
  std::atomic<int> returned{0};
  std::optional<t::judged_load> judged;
  judged.emplace(conveyor::detail::load_judgement::loaded);
  std::thread waiter{[&] {
    w.wait([&] { return done.load(); });
    returned.fetch_add(1);
  }};
  // Registered as a sleeper of that kind (a batched one's flag stays set across backstops).
  const auto asleep_at = [](const wait_point& p, std::uint32_t how) {
    // Up to 30 s: on a loaded machine the waiter may not run for a while.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (p.sleepers() != how && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    REQUIRE(p.sleepers() == how);
  };
  const auto asleep = [&](std::uint32_t how) { asleep_at(w, how); };
  asleep(wait_point::batch_waiter);
  std::uint32_t wakes = w.wakes();
  {
    wake_batching batching;
    for (int i = 0; i < 3; ++i) w.notify();  // put off: 3 < 4
    CHECK(w.wakes() == wakes);
    w.notify();  // the 4th: now
    CHECK(w.wakes() == ++wakes);
    asleep(wait_point::batch_waiter);
    w.notify();
    CHECK(w.wakes() == wakes);
  }  // the scope's end wakes what it put off
  CHECK(w.wakes() == ++wakes);
  asleep(wait_point::batch_waiter);
  {
    wake_batching batching;
    w.notify();
    CHECK(w.wakes() == wakes);
    // This thread waits elsewhere (past the spin): what it put off is due first.
    wait_point other;
    CHECK_FALSE(other.wait_until(
        [] { return false; }, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
    CHECK(w.wakes() == ++wakes);
    asleep(wait_point::batch_waiter);
    w.notify_now();  // never put off
    CHECK(w.wakes() == ++wakes);
  }
  asleep(wait_point::batch_waiter);
  w.notify();  // outside a wake_batching scope: at once
  CHECK(w.wakes() == ++wakes);
  asleep(wait_point::batch_waiter);
  CHECK(returned.load() == 0);
  done.store(true);
  w.notify_now();
  waiter.join();
  CHECK(returned.load() == 1);

  // A plain sleeper, woken at once even by a batching notifier: where the wait point is
  // not under load, and where it does not batch (a ring the user made).
  for (const bool loaded : {false, true}) {
    wait_point plain;
    judged.reset();
    if (loaded) {
      judged.emplace(conveyor::detail::load_judgement::loaded);
    } else {
      plain.batch_wakes(4);
      judged.emplace(conveyor::detail::load_judgement::unloaded);
    }
    done.store(false);
    std::thread plain_waiter{[&] { plain.wait([&] { return done.load(); }); }};
    CAPTURE(loaded);
    asleep_at(plain, wait_point::plain_waiter);
    {
      wake_batching batching;
      done.store(true);
      const std::uint32_t before = plain.wakes();
      plain.notify();
      CHECK(plain.wakes() == before + 1);
    }
    plain_waiter.join();
  }
}

// The consumer samples its input ring's size (a stage's occupancy counter). Right after
// it has taken the only element there is, the size it reads must be 0: it must never see
// its own head run past the producer's tail (which, unsigned, would read as full).
TEMPLATE_TEST_CASE("spsc_ring: the consumer never reads a size below what it has taken", "",
                   cached_head, slot_turns, default_layout) {
  const std::uint64_t rounds = t::scaled(200'000);
  typename TestType::template ring<std::uint64_t> ring{8};
  std::atomic<std::uint64_t> taken{0};
  // Spin, and now and then give the core away: the two threads may share one.
  const auto pause = [](unsigned& spins) {
    if (++spins % 64 == 0)
      std::this_thread::yield();
    else
      conveyor::detail::cpu_relax();
  };
  std::thread producer{[&] {
    unsigned spins = 0;
    for (std::uint64_t i = 0; i < rounds; ++i) {
      while (!ring.try_push(i)) pause(spins);  // (the ring is empty here)
      // acquire: pairs with the consumer's release below; push the next only after it
      // has been taken and measured, so the ring then holds nothing.
      while (taken.load(std::memory_order_acquire) == i) pause(spins);
    }
  }};
  std::uint64_t nonzero = 0;
  unsigned spins = 0;
  for (std::uint64_t i = 0; i < rounds; ++i) {
    std::optional<std::uint64_t> v;
    while (!(v = ring.try_pop())) pause(spins);
    nonzero += ring.size_approx() != 0;
    taken.store(i + 1, std::memory_order_release);  // release: pairs with the acquire above
  }
  producer.join();
  CHECK(nonzero == 0);
}

// The exception guarantees in spsc_ring.hpp: a push whose construction throws adds
// nothing; a pop whose move throws leaves the element where it was; every pop moves its
// element once; nothing leaks, across laps and with elements left at destruction.
TEMPLATE_TEST_CASE("spsc_ring: throwing copies, moves and constructions keep the ring whole", "",
                   cached_head, slot_turns, default_layout) {
  using t::fragile;
  fragile::live.store(0);
  {
    typename TestType::template ring<fragile> ring{4};
    const fragile one{1};
    REQUIRE(ring.try_push(fragile{0}));
    fragile::throw_on_copy = true;
    REQUIRE_THROWS_AS(ring.try_push(one), std::runtime_error);  // the copy threw
    fragile::throw_on_make = true;
    REQUIRE_THROWS_AS(ring.try_emplace(9), std::runtime_error);
    CHECK(ring.size_approx() == 1);
    REQUIRE(ring.try_push(one));
    REQUIRE(ring.try_emplace(2));
    // A pop whose move throws: the element stays, and comes out next time.
    fragile::throw_on_move = true;
    REQUIRE_THROWS_AS(ring.try_pop(), std::runtime_error);
    CHECK(ring.size_approx() == 3);
    fragile::moves.store(0);
    auto v = ring.try_pop();
    REQUIRE(v);
    CHECK(v->value == 0);
    CHECK(fragile::moves.load() == 1);  // from the slot into the optional, once
    fragile::throw_on_move = true;
    REQUIRE_THROWS_AS(ring.pop(), std::runtime_error);
    fragile::moves.store(0);
    auto w = ring.pop();
    REQUIRE(w);
    CHECK(w->value == 1);
    CHECK(fragile::moves.load() == 1);  // from the slot into the optional, once
    // A burst whose move throws: the elements before it were handed over, it stays.
    REQUIRE(ring.try_emplace(3));
    REQUIRE(ring.try_emplace(4));
    std::vector<int> seen;
    bool arm = true;  // f makes the next element's move throw
    const auto f = [&](fragile&& e) noexcept {
      seen.push_back(e.value);
      fragile::throw_on_move = std::exchange(arm, false);
      return true;
    };
    REQUIRE_THROWS_AS(ring.drain(f, 8), std::runtime_error);
    CHECK(seen == std::vector<int>{2});
    CHECK(ring.drain(f, 8) == 2);
    CHECK(seen == std::vector<int>{2, 3, 4});
    // Laps, then elements left inside when the ring goes.
    for (int i = 0; i < 9; ++i) {
      REQUIRE(ring.try_emplace(10 + i));
      if (i % 3 != 2) REQUIRE(ring.try_pop());
    }
    CHECK(ring.size_approx() == 3);
  }
  CHECK(fragile::live.load() == 0);
}

// push() takes an element that is not small and trivially copyable by reference: moved or
// copied once, straight into its slot; a copy that throws adds nothing.
TEMPLATE_TEST_CASE("spsc_ring: push moves or copies a larger element once, into its slot", "",
                   cached_head, slot_turns, default_layout) {
  using t::fragile;
  t::check_push_moves_once<TestType::template ring>();
  {
    typename TestType::template ring<fragile> ring{2};
    const fragile two{2};
    fragile::throw_on_copy = true;
    REQUIRE_THROWS_AS(ring.push(two), std::runtime_error);
    CHECK(ring.size_approx() == 0);
    REQUIRE(ring.push(two));
    CHECK(ring.pop()->value == 2);
  }
  CHECK(fragile::live.load() == 0);
}
