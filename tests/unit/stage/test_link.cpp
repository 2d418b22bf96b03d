// The ring between two stages (stage/detail/link.hpp) and how the pipeline picks it
// (pipeline/detail/wiring.hpp): SPSC where one thread pushes and one pops, lanes for
// ordered maps between in-order neighbours, and a link that grows.
#include "conveyor/pipeline.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;

TEST_CASE("pipeline: a hop is an SPSC ring exactly when one thread pushes and one pops") {
  auto id = [](int x) { return x; };
  // Who pushes into a stage's output ring at the same time: an ordered map's workers
  // take turns under the reorder buffer's emitter, so they count as one.
  CHECK(detail::output_pushers(source([]() -> std::optional<int> { return {}; })) == 1);
  CHECK(detail::output_pushers(input<int>()) == detail::any_threads);
  CHECK(detail::output_pushers(map(id)) == 1);
  CHECK(detail::output_pushers(map(id).workers(3)) == 3);
  CHECK(detail::output_pushers(map(id).workers(3).ordered()) == 1);
  CHECK(detail::output_pushers(batch(4)) == 1);
  CHECK(detail::output_pushers(unbatch()) == 1);
  // Who pops from a stage's input ring at the same time.
  CHECK(detail::input_poppers(map(id).workers(3).ordered()) == 3);
  CHECK(detail::input_poppers(sink([](int) {}).workers(2)) == 2);
  CHECK(detail::input_poppers(batch(4)) == 1);

  CHECK(detail::ring_link<int>(8, {1, 1}).is_spsc());
  CHECK_FALSE(detail::ring_link<int>(8, {3, 1}).is_spsc());
  CHECK_FALSE(detail::ring_link<int>(8, {1, 2}).is_spsc());
  CHECK_FALSE(detail::ring_link<int>(8, {detail::any_threads, 1}).is_spsc());
  // Both kinds behave the same through the link, positions included.
  for (const detail::ring_ends ends : {detail::ring_ends{1, 1}, detail::ring_ends{2, 2}}) {
    detail::ring_link<int> l{4, ends};
    for (int i = 0; i < 4; ++i) REQUIRE(l.try_push(int{i}));
    REQUIRE_FALSE(l.try_push(9));
    REQUIRE(l.size_approx() == 4);
    std::size_t pos = 99;
    REQUIRE(l.pop(&pos) == std::optional<int>{0});
    REQUIRE(pos == 0);
    l.close();
    REQUIRE_FALSE(l.push(9));
    REQUIRE(l.try_pop(&pos) == std::optional<int>{1});
    REQUIRE(pos == 1);
    REQUIRE(l.pop() == std::optional<int>{2});
    REQUIRE(l.pop_until(std::chrono::steady_clock::now()) == std::optional<int>{3});
    REQUIRE_FALSE(l.pop().has_value());
    REQUIRE(l.closed());
  }
}

TEST_CASE("pipeline: ordered maps run on lanes exactly where both neighbours keep order") {
  using detail::plan_lanes;
  using lanes4 = std::array<std::size_t, 4>;
  // source -> map x2 ordered -> map x3 ordered -> sink: both maps on lanes.
  CHECK(plan_lanes(lanes4{0, 2, 3, 0}, lanes4{1, 1, 1, 0}, lanes4{0, 2, 3, 1}) ==
        lanes4{0, 2, 3, 0});
  // The sink has 2 workers: the map before it cannot deal to them in order; then the one
  // before that has a neighbour that pops with 3 threads, not on lanes: neither runs on
  // lanes.
  CHECK(plan_lanes(lanes4{0, 2, 3, 0}, lanes4{1, 1, 1, 0}, lanes4{0, 2, 3, 2}) ==
        lanes4{0, 0, 0, 0});
  // A service's input is pushed by any thread: the first map keeps its reorder window, and
  // its one emitter deals to the second.
  CHECK(plan_lanes(lanes4{0, 2, 3, 0}, lanes4{detail::any_threads, 1, 1, 0}, lanes4{0, 2, 3, 1}) ==
        lanes4{0, 0, 3, 0});
  // An unordered map of 2 (no candidate, pushes from 2 threads) before an ordered one.
  CHECK(plan_lanes(lanes4{0, 0, 3, 0}, lanes4{1, 2, 1, 0}, lanes4{0, 2, 3, 1}) ==
        lanes4{0, 0, 0, 0});
  // A service's last stage hands its results to one thread.
  using lanes2 = std::array<std::size_t, 2>;
  CHECK(plan_lanes(lanes2{0, 4}, lanes2{1, 1}, lanes2{0, 4}) == lanes2{0, 4});
}

TEST_CASE("pipeline: a lanes link deals element n from pusher n % P to popper n % C") {
  for (const auto& [P, C] :
       {std::pair<std::size_t, std::size_t>{1, 2}, {2, 1}, {2, 2}, {2, 3}, {3, 2}, {4, 6}}) {
    CAPTURE(P, C);
    detail::ring_link<std::uint64_t> l{4, {.pushers = P, .poppers = C, .lanes = true}};
    REQUIRE(l.is_lanes());
    const std::uint64_t n = 2 * P * C;  // every lane used gets at most 2: below capacity
    // Pushers in turn, each pushing its own elements in order; through port() or
    // lane_port(), which calls the lanes without asking which ring the link has.
    for (std::uint64_t i = 0; i < n; ++i) {
      const bool pushed = i % 3 != 0 ? l.port(i % P).try_push(std::uint64_t{i})
                                     : l.lane_port(i % P).try_push(std::uint64_t{i});
      REQUIRE(pushed);
    }
    REQUIRE(l.size_approx() == n);
    // Poppers in turn: popper c's m-th element is c + m * C, with that position.
    for (std::uint64_t i = 0; i < n; ++i) {
      std::size_t pos = 99;
      auto v = i % 2 != 0   ? l.port(i % C).try_pop(&pos)
               : i % 3 != 0 ? l.port(i % C).pop(&pos)
                            : l.lane_port(i % C).pop(&pos);
      REQUIRE(v == std::optional<std::uint64_t>{i});
      REQUIRE(pos == i);
    }
    REQUIRE_FALSE(l.port(0).try_pop().has_value());
    // Closing: each popper sees the end once its next lane is closed and drained; what
    // is left in any lane is found by take_any() (as after a cancelled run).
    if (P > 1) REQUIRE(l.port(P - 1).try_push(std::uint64_t{n + P - 1}));  // ran ahead
    l.close();
    REQUIRE(l.closed());
    REQUIRE_FALSE(l.port(0).push(std::uint64_t{7}));
    REQUIRE_FALSE(l.port(0).pop().has_value());  // its element n never came
    if (P > 1) REQUIRE(l.take_any() == std::optional<std::uint64_t>{n + P - 1});
    REQUIRE_FALSE(l.take_any().has_value());
  }
  // Only the lanes some element goes through are made: P == C is the diagonal.
  CHECK(detail::ring_link<int>(8, {.pushers = 2, .poppers = 2, .lanes = true}).capacity() == 16);
  CHECK(detail::ring_link<int>(8, {.pushers = 2, .poppers = 3, .lanes = true}).capacity() == 48);
  CHECK(detail::ring_link<int>(8, {.pushers = 2, .poppers = 4, .lanes = true}).capacity() == 32);
  // One thread on each side is an SPSC ring, lanes or not.
  CHECK(detail::ring_link<int>(8, {.pushers = 1, .poppers = 1, .lanes = true}).is_spsc());
}

TEST_CASE("pipeline: a lanes link under P pushing and C popping threads keeps every order") {
  for (const auto& [P, C] :
       {std::pair<std::size_t, std::size_t>{1, 3}, {3, 1}, {2, 2}, {2, 3}, {3, 2}}) {
    CAPTURE(P, C);
    const std::uint64_t n = t::scaled(300'000);
    // small: often full
    detail::ring_link<std::uint64_t> l{8, {.pushers = P, .poppers = C, .lanes = true}};
    std::atomic<std::size_t> pushing{P};
    std::atomic<std::uint64_t> refused{0};
    std::vector<std::uint64_t> bad(C, 0), got(C, 0);
    std::vector<std::thread> threads;
    for (std::size_t p = 0; p < P; ++p)
      threads.emplace_back([&, p] {
        // Even threads through lane_port(), odd ones through port(): the same lanes.
        const auto run = [&](auto port) {
          for (std::uint64_t i = p; i < n; i += P) {
            if (i % 3 == 0) {
              while (!port.try_push(std::uint64_t{i})) std::this_thread::yield();
            } else if (!port.push(std::uint64_t{i})) {
              refused.fetch_add(1);  // Catch's assertions are for the test's thread only
            }
          }
        };
        p % 2 ? run(l.port(p)) : run(l.lane_port(p));
        if (pushing.fetch_sub(1) == 1) l.close();
      });
    for (std::size_t c = 0; c < C; ++c)
      threads.emplace_back([&, c] {
        const auto run = [&](auto port) {
          std::uint64_t expect = c;
          std::size_t pos = 0;
          while (auto v = port.pop(&pos)) {
            bad[c] += *v != expect || pos != expect;
            expect += C;
            ++got[c];
          }
        };
        c % 2 ? run(l.port(c)) : run(l.lane_port(c));
      });
    for (auto& th : threads) th.join();
    CHECK(refused.load() == 0);
    CHECK(std::accumulate(bad.begin(), bad.end(), std::uint64_t{0}) == 0);
    CHECK(std::accumulate(got.begin(), got.end(), std::uint64_t{0}) == n);
    CHECK_FALSE(l.take_any().has_value());
  }
}

// A link that can grow (detail/link.hpp, "Growing"): the producer moves to the other
// ring only where it finds its ring full and is asked to, recording a switch point; the
// consumer takes everything before the switch point, then follows.
TEST_CASE("pipeline: a link that can grow moves at a full ring and keeps the order") {
  using value = std::shared_ptr<std::uint64_t>;  // its use count tells what is alive
  const auto item = [](std::uint64_t i) { return std::make_shared<std::uint64_t>(i); };
  std::vector<value> kept;  // the test's own reference to every element pushed
  const auto push = [&](detail::ring_link<value>& l, std::uint64_t i, bool blocking) {
    kept.push_back(item(i));
    return blocking ? l.push(value{kept.back()}) : l.try_push(value{kept.back()});
  };
  std::uint64_t next = 0;    // the next element the consumer should see
  std::size_t position = 0;  // and its position
  const auto pop_in_order = [&](detail::ring_link<value>& l, bool blocking) {
    std::size_t pos = 99;
    auto v = blocking ? l.pop(&pos) : l.try_pop(&pos);
    REQUIRE(v.has_value());
    REQUIRE(**v == next++);
    REQUIRE(pos == position++);
  };
  {
    detail::ring_link<value> l{4, {.pushers = 1, .poppers = 1}, 16};
    REQUIRE(l.can_grow());
    CHECK(l.capacity() == 4);
    CHECK(l.reserve() == 16);
    CHECK(l.deepest() == 4);
    // Asked before the ring is full: nothing moves until it is.
    l.grow(true);
    for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(push(l, i, false));
    REQUIRE_FALSE(push(l, 4, false));  // full; a try never moves
    kept.pop_back();
    CHECK(l.deepest() == 4);
    REQUIRE(push(l, 4, true));  // switches at 4, goes on in the reserve
    CHECK(l.deepest() == 16);
    for (std::uint64_t i = 5; i < 20; ++i) REQUIRE(push(l, i, false));  // the reserve: 16
    REQUIRE_FALSE(push(l, 20, false));
    kept.pop_back();
    CHECK(l.size_approx() == 4 + 16);
    // The consumer takes 0..3, reaches the switch point (a try does too) and follows.
    pop_in_order(l, false);
    pop_in_order(l, true);
    pop_in_order(l, false);
    pop_in_order(l, false);
    pop_in_order(l, false);  // past the switch point: 4
    for (int i = 0; i < 15; ++i) pop_in_order(l, i % 2 == 0);
    REQUIRE(next == 20);
    REQUIRE_FALSE(l.try_pop().has_value());
    // Back: again only at a full ring.
    l.grow(false);
    for (std::uint64_t i = 20; i < 36; ++i) REQUIRE(push(l, i, false));
    REQUIRE_FALSE(push(l, 36, false));
    kept.pop_back();
    REQUIRE(push(l, 36, true));  // switches at 36: 36 in the first ring
    REQUIRE(push(l, 37, true));
    for (int i = 0; i < 18; ++i) pop_in_order(l, i % 3 == 0);
    REQUIRE(next == 38);
    // A move is owed until the consumer has followed the last: a full ring then waits
    // for room where it is.
    l.grow(true);
    for (std::uint64_t i = 38; i < 42; ++i) REQUIRE(push(l, i, false));
    REQUIRE(push(l, 42, true));  // switches at 42: 38..41 here, 42 there
    l.grow(false);
    REQUIRE(push(l, 43, true));  // the consumer has not followed: stays in the reserve
    // Left inside when the link goes, in both rings: destroyed with it.
    for (std::size_t i = 0; i < kept.size(); ++i) CHECK(kept[i].use_count() == (i >= 38 ? 2 : 1));
  }
  for (const value& v : kept) CHECK(v.use_count() == 1);
  // After a close: the consumer drains both rings, past the switch point, and sees the
  // end; take_any() finds what a consumer left.
  kept.clear();
  next = position = 0;
  detail::ring_link<value> l{4, {.pushers = 1, .poppers = 1}, 8};
  l.grow(true);
  for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(push(l, i, false));
  REQUIRE(push(l, 4, true));
  REQUIRE(push(l, 5, true));
  l.close();
  REQUIRE_FALSE(push(l, 6, true));
  pop_in_order(l, true);
  pop_in_order(l, true);
  pop_in_order(l, true);
  pop_in_order(l, true);
  pop_in_order(l, true);  // past the switch point: 4
  REQUIRE(l.take_any() == kept[5]);
  REQUIRE_FALSE(l.take_any().has_value());
  REQUIRE_FALSE(l.pop().has_value());
  // No reserve at or below the capacity, or where several threads share an end.
  CHECK(detail::ring_link<int>(2, {.pushers = 1, .poppers = 1}, 16).can_grow());
  CHECK_FALSE(detail::ring_link<int>(8, {.pushers = 1, .poppers = 1}, 8).can_grow());
  CHECK_FALSE(detail::ring_link<int>(8, {.pushers = 2, .poppers = 1}, 64).can_grow());
  // An SPSC link without a reserve takes the same path and never moves: grow(true) does
  // nothing, a full ring stays full, and its pops' positions count on.
  detail::ring_link<int> fixed{4, {.pushers = 1, .poppers = 1}};
  fixed.grow(true);
  CHECK(fixed.reserve() == 4);
  for (int lap = 0; lap < 3; ++lap) {
    for (int i = 0; i < 4; ++i) REQUIRE(fixed.try_push(int{lap * 4 + i}));
    REQUIRE_FALSE(fixed.try_push(int{99}));
    CHECK(fixed.size_approx() == 4);
    for (int i = 0; i < 4; ++i) {
      std::size_t pos = 99;
      auto v = i % 2 == 0 ? fixed.try_pop(&pos) : fixed.pop(&pos);
      REQUIRE(v);
      CHECK(*v == lap * 4 + i);
      CHECK(pos == static_cast<std::size_t>(lap * 4 + i));
    }
    REQUIRE_FALSE(fixed.try_pop().has_value());
  }
  CHECK(fixed.popped() == 12);
  CHECK(fixed.deepest() == 4);
  // A reserve asked for after a close is not made: nothing can move into an open ring.
  detail::ring_link<int> closed{4, {.pushers = 1, .poppers = 1}, 16};
  closed.close();
  closed.grow(true);
  for (int i = 0; i < 5; ++i) CHECK_FALSE(closed.push(int{i}));
  CHECK(closed.deepest() == 4);
}

TEST_CASE("pipeline: a growing link under a producer, a consumer and moves from a third thread") {
  const std::uint64_t n = t::scaled(1'000'000);
  const std::size_t capacity = GENERATE(4u, 64u);
  const bool drains = GENERATE(false, true);  // the consumer also takes bursts (drain())
  CAPTURE(capacity, drains);
  detail::ring_link<std::uint64_t> l{capacity, {.pushers = 1, .poppers = 1}, 4 * capacity};
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> refused{0}, bad{0}, got{0};
  std::thread producer{[&] {
    for (std::uint64_t i = 0; i < n; ++i) {
      if (i % 5 == 0) {
        while (!l.try_push(std::uint64_t{i})) std::this_thread::yield();
      } else if (!l.push(std::uint64_t{i})) {
        refused.fetch_add(1);
      }
    }
    l.close();
  }};
  std::thread consumer{[&] {
    std::uint64_t expect = 0;
    std::size_t pos = 0;
    // A burst of up to 1 + expect % 40, cut short where f says so: positions after it
    // must go on from its count.
    const auto take = [&](std::uint64_t&& v) noexcept {
      bad.fetch_add(v != expect);
      ++expect;
      got.fetch_add(1);
      return expect % 11 != 0;
    };
    for (;;) {
      if (drains && expect % 3 != 0 && l.drain(take, 1 + expect % 40) != 0) continue;
      std::optional<std::uint64_t> v;
      if (expect % 7 == 0) {
        v = l.try_pop(&pos);
        if (!v) {
          if (!l.closed()) continue;
          v = l.pop(&pos);  // closed: the rest, past any mark
          if (!v) break;
        }
      } else {
        v = l.pop(&pos);
        if (!v) break;
      }
      bad.fetch_add(*v != expect || pos != expect);
      ++expect;
      got.fetch_add(1);
    }
  }};
  // Asks the producer to move back and forth, as placer rounds would, only faster.
  std::thread mover{[&] {
    bool deep = false;
    while (!done.load()) {
      l.grow(deep = !deep);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }};
  producer.join();
  consumer.join();
  done.store(true);
  mover.join();
  CHECK(refused.load() == 0);
  CHECK(bad.load() == 0);
  CHECK(got.load() == n);
  CHECK(l.popped() == n);
  CHECK_FALSE(l.take_any().has_value());
  CHECK(l.deepest() == 4 * capacity);  // a blocking push moves whenever asked
}
