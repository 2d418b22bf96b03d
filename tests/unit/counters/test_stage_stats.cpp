// stage_stats / phase_clock, lane_stats / gpu_stats and batch_stats: layout, exact
// totals from concurrent writers, snapshots that only grow while writers run.
#include "conveyor/counters/batch_stats.hpp"
#include "conveyor/counters/lane_stats.hpp"
#include "conveyor/counters/stage_stats.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace m = conveyor::metrics;
namespace t = conveyor::test;

TEST_CASE("stage_stats: bad worker counts throw config_error") {
  REQUIRE_THROWS_AS(m::stage_stats{0}, conveyor::config_error);
  REQUIRE_THROWS_AS(m::gpu_stats{0}, conveyor::config_error);
  REQUIRE_THROWS_AS(m::batch_stats{0}, conveyor::config_error);
}

TEST_CASE("stage_stats: every worker slot owns its own cache line") {
  m::stage_stats s{5};
  REQUIRE(s.workers() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    const auto a = reinterpret_cast<std::uintptr_t>(&s.worker(i));
    REQUIRE(a % conveyor::cache_line_size == 0);
    if (i > 0)
      REQUIRE(a - reinterpret_cast<std::uintptr_t>(&s.worker(i - 1)) == conveyor::cache_line_size);
  }
  static_assert(noexcept(s.worker(0).add_busy(1)));
  static_assert(noexcept(s.snapshot()));
}

TEST_CASE("stage_stats: concurrent workers and a snapshot reader, totals exact") {
  constexpr std::size_t workers = 4;
  m::stage_stats s{workers};
  const std::uint64_t n = t::scaled(1'000'000);
  std::atomic<bool> done{false};
  bool monotone = true;
  std::thread reader{[&] {
    m::stage_counters last;
    while (!done.load(std::memory_order_acquire)) {
      const m::stage_counters c = s.snapshot();
      monotone &= c.items >= last.items && c.busy_ns >= last.busy_ns &&
                  c.starved_ns >= last.starved_ns && c.blocked_ns >= last.blocked_ns &&
                  c.occupancy_samples >= last.occupancy_samples &&
                  c.occupancy_max >= last.occupancy_max;
      last = c;
    }
  }};
  std::vector<std::thread> ws;
  for (std::size_t w = 0; w < workers; ++w)
    ws.emplace_back([&, w] {
      auto& slot = s.worker(w);
      for (std::uint64_t i = 0; i < n; ++i) {
        slot.add_items(1);
        slot.add_busy(3);
        slot.add_starved(static_cast<std::int64_t>(w));
        slot.add_blocked(7);
        slot.add_blocked(-2);  // negative: ignored
        slot.sample_occupancy(static_cast<std::size_t>(i % 17 + w));
      }
    });
  for (auto& th : ws) th.join();
  done.store(true, std::memory_order_release);
  reader.join();
  REQUIRE(monotone);

  const m::stage_counters c = s.snapshot();
  REQUIRE(c.items == workers * n);
  REQUIRE(c.busy_ns == static_cast<std::int64_t>(3 * workers * n));
  REQUIRE(c.starved_ns == static_cast<std::int64_t>((0 + 1 + 2 + 3) * n));
  REQUIRE(c.blocked_ns == static_cast<std::int64_t>(7 * workers * n));
  REQUIRE(c.occupancy_samples == workers * n);
  REQUIRE(c.occupancy_max == (n >= 17 ? 16 : n - 1) + (workers - 1));
  std::uint64_t occ = 0;
  for (std::size_t w = 0; w < workers; ++w)
    for (std::uint64_t i = 0; i < n; ++i) occ += i % 17 + w;
  REQUIRE(c.occupancy_sum == occ);
  REQUIRE(c.occupancy_mean() ==
          Approx(static_cast<double>(occ) / static_cast<double>(workers * n)));
  REQUIRE(s.worker(2).snapshot().starved_ns == static_cast<std::int64_t>(2 * n));
}

TEST_CASE("phase_clock: consecutive phases tile time and land in the right counter") {
  m::stage_stats s{1};
  auto& w = s.worker(0);
  const std::int64_t t0 = conveyor::now_ns();
  m::phase_clock clock{w, t0};
  const m::phase a = clock.starved();
  const m::phase b = clock.busy();
  const m::phase c = clock.skip();
  const m::phase d = clock.blocked();
  const m::phase e = clock.busy();
  REQUIRE(a.start_ns == t0);
  REQUIRE(b.start_ns == a.end_ns);
  REQUIRE(c.start_ns == b.end_ns);
  REQUIRE(d.start_ns == c.end_ns);
  REQUIRE(e.start_ns == d.end_ns);
  REQUIRE(clock.mark_ns() == e.end_ns);
  const m::stage_counters k = s.snapshot();
  REQUIRE(k.starved_ns == a.length_ns());
  REQUIRE(k.busy_ns == b.length_ns() + e.length_ns());
  REQUIRE(k.blocked_ns == d.length_ns());
  REQUIRE(k.busy_ns + k.starved_ns + k.blocked_ns + c.length_ns() == clock.mark_ns() - t0);
}

TEST_CASE("phase_clock: waits measured without a clock read go to starved and blocked") {
  m::stage_stats s{1};
  auto& w = s.worker(0);
  const std::int64_t t0 = 1'000'000;
  m::phase_clock clock{w, t0};
  const m::phase a = clock.busy_until(t0 + 1000, 300, 200);
  REQUIRE(a.start_ns == t0);
  REQUIRE(a.end_ns == t0 + 1000);
  REQUIRE(clock.mark_ns() == t0 + 1000);
  m::stage_counters k = s.snapshot();
  REQUIRE(k.starved_ns == 300);
  REQUIRE(k.blocked_ns == 200);
  REQUIRE(k.busy_ns == 500);
  // Waits longer than the phase are cut to it, starved first: time is never
  // charged twice.
  const m::phase b = clock.busy_until(t0 + 1100, 1'000'000, 1'000'000);
  REQUIRE(b.length_ns() == 100);
  k = s.snapshot();
  REQUIRE(k.starved_ns == 400);
  REQUIRE(k.blocked_ns == 200);
  REQUIRE(k.busy_ns == 500);
  // An end before the mark (a reading older than the last mark) charges nothing and
  // leaves the mark where it was.
  const m::phase c = clock.busy_until(t0, 50, 50);
  REQUIRE(c.length_ns() == 0);
  REQUIRE(clock.mark_ns() == t0 + 1100);
  k = s.snapshot();
  REQUIRE(k.starved_ns + k.blocked_ns + k.busy_ns == 1100);
}

TEST_CASE("gpu_stats: per-lane sums and the compute union across lanes") {
  constexpr std::size_t lanes = 3;
  m::gpu_stats gpu{lanes, 16};
  const std::uint64_t batches = t::scaled(20'000);
  // Lane l runs batch k's compute in [k*1000 + l*100, k*1000 + l*100 + 300): lanes
  // overlap each other (union per k = [k*1000, k*1000 + 500)), consecutive k do not.
  std::vector<std::thread> ts;
  for (std::size_t l = 0; l < lanes; ++l)
    ts.emplace_back([&, l] {
      for (std::uint64_t k = 0; k < batches; ++k) {
        const auto base = static_cast<std::int64_t>(k * 1000 + l * 100);
        m::batch_timing bt;
        bt.items = 32;
        bt.h2d = {base - 50, base};
        bt.compute = {base, base + 300};
        bt.d2h = {base + 300, base + 320};
        bt.h2d_bytes = 4096;
        bt.d2h_bytes = 128;
        gpu.record_batch(l, bt);
      }
    });
  for (auto& th : ts) th.join();
  for (std::size_t l = 0; l < lanes; ++l) {
    const m::lane_counters c = gpu.lane(l).snapshot();
    REQUIRE(c.batches == batches);
    REQUIRE(c.items == 32 * batches);
    REQUIRE(c.h2d_ns == static_cast<std::int64_t>(50 * batches));
    REQUIRE(c.compute_ns == static_cast<std::int64_t>(300 * batches));
    REQUIRE(c.d2h_ns == static_cast<std::int64_t>(20 * batches));
    REQUIRE(c.h2d_bytes == 4096 * batches);
    REQUIRE(c.d2h_bytes == 128 * batches);
  }
  // A writer that folds the queue can be preempted while the others keep adding; once
  // the queue is full, intervals are dropped and counted rather than waited for. On a
  // loaded machine free-running writers do get there (the pipeline records one interval
  // per batch, far below that rate), so the bounds allow for the dropped ones: each can
  // leave at most one k without a surviving interval.
  const std::uint64_t dropped = gpu.compute_intervals_dropped();
  CAPTURE(dropped);
  REQUIRE(dropped <= lanes * batches);
  // Free-running threads may drift apart by more than the window; late arrivals can
  // only lower the union, so check the bounds, then exactness when in step.
  REQUIRE(gpu.compute_busy_ns() <= static_cast<std::int64_t>(500 * batches));
  const std::uint64_t covered = dropped < batches ? batches - dropped : 0;
  REQUIRE(gpu.compute_busy_ns() >= static_cast<std::int64_t>(300 * covered));

  m::gpu_stats in_step{lanes, 16};
  for (std::uint64_t k = 0; k < batches; ++k)
    for (std::size_t l = lanes; l-- > 0;) {  // completions out of order within k
      const auto base = static_cast<std::int64_t>(k * 1000 + l * 100);
      m::batch_timing bt;
      bt.compute = {base, base + 300};
      in_step.record_batch(l, bt);
    }
  REQUIRE(in_step.compute_busy_ns() == static_cast<std::int64_t>(500 * batches));
  REQUIRE(in_step.compute_intervals_late() == 0);
}

TEST_CASE("batch_stats: mean size, timeouts, full batches") {
  m::batch_stats b{64};
  b.record(64, false);
  b.record(64, false);
  b.record(10, true);
  b.record(30, false);  // final partial batch: not a timeout
  const m::batch_counters c = b.snapshot();
  REQUIRE(c.max_size == 64);
  REQUIRE(c.batches == 4);
  REQUIRE(c.items == 168);
  REQUIRE(c.flushed_on_timeout == 1);
  REQUIRE(c.full == 2);
  REQUIRE(c.mean_size() == Approx(42.0));
}
