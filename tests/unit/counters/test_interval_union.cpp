// interval_union and concurrent_interval_union against a brute-force union: exact when
// arrivals are out of order within the window, never over-counting beyond it, and
// conserving intervals under concurrent adds.
#include "conveyor/counters/interval_union.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "test_support.hpp"

using conveyor::interval;
using conveyor::metrics::concurrent_interval_union;
using conveyor::metrics::interval_union;
namespace t = conveyor::test;

namespace {

std::int64_t brute_force(std::vector<interval> v) {
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.start_ns < b.start_ns; });
  std::int64_t total = 0;
  std::int64_t covered_to = INT64_MIN;
  for (const auto& iv : v) {
    if (iv.end_ns <= iv.start_ns) continue;
    const std::int64_t from = std::max(iv.start_ns, covered_to);
    if (iv.end_ns > from) total += iv.end_ns - from;
    covered_to = std::max(covered_to, iv.end_ns);
  }
  return total;
}

// Intervals sorted by start: lanes-like, with overlaps, gaps and nesting.
std::vector<interval> sorted_intervals(std::mt19937_64& rng, std::size_t n) {
  std::vector<interval> v;
  std::int64_t s = 1'000;
  std::uniform_int_distribution<std::int64_t> gap{0, 600}, len{1, 1'500};
  for (std::size_t i = 0; i < n; ++i) {
    s += gap(rng);
    v.push_back({s, s + len(rng)});
  }
  return v;
}

// Arrival order where an interval is preceded by at most `displacement - 1` intervals
// that start after it: sort by index + U[0, displacement).
std::vector<interval> displaced(std::mt19937_64& rng, const std::vector<interval>& sorted,
                                std::size_t displacement) {
  std::uniform_real_distribution<double> u{0.0, static_cast<double>(displacement)};
  std::vector<std::pair<double, interval>> keyed;
  for (std::size_t i = 0; i < sorted.size(); ++i)
    keyed.push_back({static_cast<double>(i) + u(rng), sorted[i]});
  std::sort(keyed.begin(), keyed.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<interval> out;
  for (auto& k : keyed) out.push_back(k.second);
  return out;
}

}  // namespace

TEST_CASE("interval_union: bad window throws config_error") {
  REQUIRE_THROWS_AS(interval_union{0}, conveyor::config_error);
  REQUIRE_THROWS_AS(interval_union{1u << 20}, conveyor::config_error);
  REQUIRE_THROWS_AS((concurrent_interval_union{64, 1000}), conveyor::config_error);
}

TEST_CASE("interval_union: edge cases") {
  interval_union u{4};
  REQUIRE(u.total_ns() == 0);
  u.add(10, 10);  // empty
  u.add(20, 15);  // reversed
  REQUIRE(u.count() == 0);
  REQUIRE(u.total_ns() == 0);
  u.add(0, 5);
  u.add(5, 10);   // touching: one run
  u.add(2, 3);    // nested
  u.add(20, 30);  // gap
  u.add(25, 26);
  u.add(29, 40);
  REQUIRE(u.total_ns() == 30);
  REQUIRE(u.count() == 6);
  REQUIRE(u.late() == 0);
  u.reset();
  REQUIRE(u.total_ns() == 0);
  REQUIRE(u.count() == 0);
}

TEST_CASE("interval_union: exact when out of order within the window") {
  std::mt19937_64 rng{GENERATE(1u, 2u, 3u)};
  const std::size_t window = GENERATE(as<std::size_t>{}, 1, 2, 8, 64);
  const std::size_t n = 20'000;
  CAPTURE(window);
  const auto sorted = sorted_intervals(rng, n);
  const auto arrivals = displaced(rng, sorted, window);
  interval_union u{window};
  std::vector<interval> prefix;
  for (std::size_t i = 0; i < arrivals.size(); ++i) {
    u.add(arrivals[i]);
    prefix.push_back(arrivals[i]);
    if (i % 997 == 0) REQUIRE(u.total_ns() == brute_force(prefix));  // mid-stream too
  }
  REQUIRE(u.total_ns() == brute_force(sorted));
  REQUIRE(u.late() == 0);
  REQUIRE(u.count() == n);
}

TEST_CASE("interval_union: beyond the window it under-counts, never over-counts") {
  std::mt19937_64 rng{11};
  const std::size_t window = 4;
  auto sorted = sorted_intervals(rng, 5'000);
  // Sparse intervals (big gaps) so that a late one really falls into a gap.
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    sorted[i].start_ns += static_cast<std::int64_t>(i) * 5'000;
    sorted[i].end_ns += static_cast<std::int64_t>(i) * 5'000;
  }
  const auto arrivals = displaced(rng, sorted, 40);
  interval_union u{window};
  for (const auto& iv : arrivals) u.add(iv);
  REQUIRE(u.late() > 0);
  REQUIRE(u.total_ns() < brute_force(sorted));
  REQUIRE(u.total_ns() > 0);
}

TEST_CASE("concurrent_interval_union: single thread matches interval_union") {
  std::mt19937_64 rng{5};
  const auto arrivals = displaced(rng, sorted_intervals(rng, 10'000), 16);
  concurrent_interval_union c{16, 64};  // small queue: folded on every add
  interval_union u{16};
  for (const auto& iv : arrivals) {
    REQUIRE(c.add(iv));
    u.add(iv);
  }
  REQUIRE(c.total_ns() == u.total_ns());
  REQUIRE(c.count() == u.count());
  REQUIRE(c.dropped() == 0);
}

TEST_CASE("concurrent_interval_union: 4 writers and a reader, exact union, nothing lost") {
  // Every writer adds the same in-order sequence (like lanes reporting overlapping
  // work). Whatever the interleaving, the first arrival of each interval is never late
  // (everything before it starts no later), so the union is exact.
  const std::size_t n = t::scaled(50'000);
  std::vector<interval> seq;
  for (std::size_t k = 0; k < n; ++k) {
    const auto s = static_cast<std::int64_t>(k) * 100;
    seq.push_back({s, s + 40 + static_cast<std::int64_t>(k % 4) * 30});  // some overlap, some gaps
  }
  constexpr int writers = 4;
  concurrent_interval_union u{64, 1u << 18};  // holds every add: never drops
  REQUIRE(writers * n <= (1u << 18));
  std::atomic<bool> done{false};
  bool monotone = true;
  std::thread reader{[&] {
    std::int64_t last = 0;
    while (!done.load(std::memory_order_acquire)) {
      const std::int64_t now = u.total_ns();
      monotone &= now >= last;
      last = now;
      std::this_thread::yield();
    }
  }};
  std::atomic<std::uint64_t> refused{0};  // Catch2 assertions are not thread-safe
  std::vector<std::thread> ws;
  for (int w = 0; w < writers; ++w)
    ws.emplace_back([&] {
      for (const auto& iv : seq)
        if (!u.add(iv)) refused.fetch_add(1, std::memory_order_relaxed);
    });
  for (auto& th : ws) th.join();
  REQUIRE(refused.load() == 0);
  done.store(true, std::memory_order_release);
  reader.join();
  REQUIRE(monotone);
  REQUIRE(u.dropped() == 0);
  REQUIRE(u.count() == writers * n);
  REQUIRE(u.total_ns() == brute_force(seq));
}

TEST_CASE("concurrent_interval_union: a full queue drops and counts, never blocks") {
  concurrent_interval_union u{8, 2};
  // A 2-slot queue under 4 writers: every add either lands in the union or is counted
  // as dropped, and add() returns (it never waits for the folding thread).
  const std::size_t per = t::scaled(100'000);
  std::atomic<std::uint64_t> accepted{0};
  std::vector<std::thread> ws;
  for (int w = 0; w < 4; ++w)
    ws.emplace_back([&, w] {
      std::uint64_t ok = 0;
      for (std::size_t k = 0; k < per; ++k) {
        const auto s = static_cast<std::int64_t>(k * 4 + static_cast<std::size_t>(w)) * 10;
        ok += u.add(s, s + 5) ? 1 : 0;
      }
      accepted.fetch_add(ok, std::memory_order_relaxed);
    });
  for (auto& th : ws) th.join();
  REQUIRE(accepted.load() + u.dropped() == 4 * per);
  REQUIRE(u.count() == accepted.load());
}
