// Pipelines end to end on the host: composition, ordering, batching, backpressure,
// stopping, accounting and a long soak. (Service pipelines: test_service.cpp; the links
// between stages and the stage internals: tests/unit/stage/.)
#include "conveyor/pipeline.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;

namespace {

template <class Counts>
void require_conserved(const Counts& c) {
  CAPTURE(c.produced, c.completed, c.failed, c.cancelled);
  REQUIRE(c.produced == c.completed + c.failed + c.cancelled);
}

// Busy-waits for a random few microseconds: varies completion order between workers.
void random_pause(std::uint64_t seed) {
  std::minstd_rand r{static_cast<unsigned>(seed * 2654435761u + 1)};
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(r() % 50);
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

TEST_CASE("pipeline: source -> parallel ordered maps -> sink keeps input order") {
  const std::size_t workers = GENERATE(1u, 2u, 4u, 8u);
  const std::uint64_t n = t::scaled(20000);
  CAPTURE(workers, n);
  std::vector<std::uint64_t> got;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
             map([](std::uint64_t x) {
               random_pause(x);
               return x * 3;
             })
                 .workers(workers)
                 .ordered() |
             map([](std::uint64_t x) { return x + 1; }).workers(workers).ordered() |
             sink([&](std::uint64_t x) { got.push_back(x); })};
  const auto c = p.run();
  require_conserved(c);
  REQUIRE(c.completed == n);
  REQUIRE(got.size() == n);
  bool in_order = true;
  for (std::uint64_t i = 0; i < n; ++i) in_order &= got[i] == 3 * i + 1;
  REQUIRE(in_order);
}

namespace {

// An ordered map of 2 workers whose item 0 stalls its worker (as a preempted thread
// would) until the other worker has started `ahead` items, then stays stalled 20 ms
// more. Records how many items the others had started at both moments.
struct stall_probe {
  std::uint64_t ahead;
  std::atomic<std::uint64_t> started_others{0};
  std::atomic<std::uint64_t> seen_while_stalled{0};
  std::atomic<std::uint64_t> max_while_stalled{0};

  auto stage() {
    return map([this](std::uint64_t x) {
             if (x != 0) {
               started_others.fetch_add(1);
               return x;
             }
             // A safety deadline only: the assertions are on the counts reached.
             const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
             while (started_others.load() < ahead && std::chrono::steady_clock::now() < give_up)
               std::this_thread::yield();
             seen_while_stalled.store(started_others.load());
             // Stay stalled a little longer: the window must hold the other worker.
             std::this_thread::sleep_for(std::chrono::milliseconds(20));
             max_while_stalled.store(started_others.load());
             return x;
           })
        .workers(2)
        .ordered();
  }
};

}  // namespace

TEST_CASE("pipeline: an ordered map's workers run a ring's depth ahead of a stalled one") {
  SECTION("reorder window (items submitted: any thread may push, so no lanes)") {
    // The reorder window is the input ring's capacity (a service's: 1024), so the other
    // worker gets to capacity - 1 items and no further: the stage never holds more.
    constexpr std::uint64_t capacity = 1024;
    stall_probe probe{capacity - 1};
    pipeline svc{input<std::uint64_t>() | probe.stage()};
    svc.start();
    std::vector<std::future<std::uint64_t>> results;
    std::thread feeder{[&] {
      // Submits block while every ticket is taken (one per item in flight).
      for (std::uint64_t i = 0; i < 4 * capacity; ++i) results.push_back(svc.submit(i));
    }};
    feeder.join();
    require_conserved(svc.stop(stop_mode::drain));
    for (std::uint64_t i = 0; i < results.size(); ++i) REQUIRE(results[i].get() == i);
    CHECK(probe.seen_while_stalled.load() == capacity - 1);
    CHECK(probe.max_while_stalled.load() == capacity - 1);
  }
  SECTION("lanes (a source before, a sink after: each worker its own lanes)") {
    // Each lane holds a ring's capacity. Worker 0 stalls on item 0: its input lane fills
    // with the next `capacity` even items, then the source blocks; worker 1 gets the odd
    // items up to there (capacity + 1 of them) and pushes all but the last into its
    // output lane (the sink waits for item 0), so it starts exactly capacity + 1 items.
    constexpr std::uint64_t capacity = 256;
    stall_probe probe{capacity - 1};
    pipeline p{from_range(std::views::iota(std::uint64_t{0}, std::uint64_t{4 * capacity})) |
                   probe.stage() | sink([](std::uint64_t) {}),
               pipeline_options{.ring_capacity = capacity}};
    require_conserved(p.run());
    CHECK(probe.seen_while_stalled.load() >= capacity - 1);
    CHECK(probe.max_while_stalled.load() == capacity + 1);
  }
}

TEST_CASE("pipeline: unordered parallel map delivers every item exactly once") {
  const std::uint64_t n = t::scaled(100000);
  std::vector<std::uint64_t> got;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
             map([](std::uint64_t x) { return x; }).workers(4) |
             sink([&](std::uint64_t x) { got.push_back(x); })};
  require_conserved(p.run());
  std::sort(got.begin(), got.end());
  REQUIRE(got.size() == n);
  std::vector<std::uint64_t> expected(n);
  std::iota(expected.begin(), expected.end(), 0);
  REQUIRE(got == expected);
}

// Stages build envelopes in the ring's slot only when that cannot throw; an item whose
// move may throw goes the other way (a temporary, then push). Both must deliver.
TEST_CASE("pipeline: items whose move may throw arrive complete and in order") {
  struct throwing_move {
    std::uint64_t v;
    explicit throwing_move(std::uint64_t x) : v(x) {}
    throwing_move(throwing_move&& o) noexcept(false) : v(o.v) {}
  };
  static_assert(!std::is_nothrow_move_constructible_v<throwing_move>);
  const std::uint64_t n = t::scaled(20000);
  std::uint64_t next = 0;
  bool in_order = true;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
             map([](std::uint64_t x) { return throwing_move{x}; }) |
             map([](throwing_move m) { return throwing_move{m.v + 1}; }) |
             sink([&](throwing_move m) { in_order = in_order && m.v == ++next; })};
  require_conserved(p.run());
  CHECK(in_order);
  CHECK(next == n);
}

TEST_CASE("pipeline: fixed and dynamic batches, flushed at the end, unbatched in order") {
  const std::size_t size = GENERATE(1u, 7u, 64u);
  const bool dynamic = GENERATE(false, true);
  const std::uint64_t n = 1000;
  CAPTURE(size, dynamic);
  std::vector<std::size_t> batch_sizes;
  std::vector<std::uint64_t> got;
  auto b = batch(size);
  if (dynamic) b.max_delay(std::chrono::milliseconds(1));
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) | std::move(b) |
             map([&](std::vector<std::uint64_t> v) {
               batch_sizes.push_back(v.size());
               return v;
             }) |
             unbatch() | sink([&](std::uint64_t x) { got.push_back(x); })};
  require_conserved(p.run());
  REQUIRE(got.size() == n);
  for (std::uint64_t i = 0; i < n; ++i) REQUIRE(got[i] == i);
  for (std::size_t s : batch_sizes) REQUIRE(s <= size);
  REQUIRE(std::accumulate(batch_sizes.begin(), batch_sizes.end(), std::size_t{0}) == n);
  if (!dynamic) {
    // Fixed batches are full except the last.
    for (std::size_t i = 0; i + 1 < batch_sizes.size(); ++i) REQUIRE(batch_sizes[i] == size);
  }
}

TEST_CASE("pipeline: a batch of batches keeps every item's identity through two unbatches") {
  const std::uint64_t n = 1000;  // 1000 = 7 * 142 + 6: partial batches at both levels
  std::vector<std::uint64_t> got;
  std::vector<std::size_t> outer_items;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) | batch(7) | batch(3) |
                 map([&](std::vector<std::vector<std::uint64_t>> v) {
                   std::size_t items = 0;
                   for (const auto& inner : v) items += inner.size();
                   outer_items.push_back(items);
                   return v;
                 }) |
                 unbatch() | unbatch() | sink([&](std::uint64_t x) { got.push_back(x); }),
             pipeline_options{.metrics = true}};
  const report r = p.run();
  require_conserved(r);
  REQUIRE(r.completed == n);
  REQUIRE(got.size() == n);
  for (std::uint64_t i = 0; i < n; ++i) REQUIRE(got[i] == i);
  // The outer batches count the items inside them, not their inner batches.
  REQUIRE(std::accumulate(outer_items.begin(), outer_items.end(), std::size_t{0}) == n);
  // Every stage counts items, whatever it holds them in; the sink timed a sample of them,
  // each standing for its sampling period.
  REQUIRE(r.stages.size() == 7);
  for (const auto& st : r.stages) {
    CAPTURE(st.name);
    REQUIRE(st.items == n);
  }
  std::uint64_t represented = 0;
  for (std::uint64_t i = 0; i < n; ++i) represented += detail::latency_sample_weight(i);
  REQUIRE(r.item_latency.count == represented);
}

TEST_CASE("pipeline: the latency sample stands for every item of a long run") {
  // Dense (1 in 8) at first, sparser (1 in 64, then 1 in 256) later; the weights add up
  // to one per item whenever a run ends on a multiple of the current period.
  std::uint64_t sum = 0;
  for (std::uint64_t i = 0; i < 2 * detail::latency_sparse_items; ++i) {
    const std::uint32_t w = detail::latency_sample_weight(i);
    const std::uint32_t period = i < detail::latency_dense_items    ? 8u
                                 : i < detail::latency_sparse_items ? 64u
                                                                    : 256u;
    REQUIRE((w == 0 || w == period));
    sum += w;
    if ((i + 1) % period == 0) REQUIRE(sum == i + 1);
  }
  REQUIRE(sum == 2 * detail::latency_sparse_items);

  const std::uint64_t n = 2 * detail::latency_dense_items + 64 * 10;
  std::uint64_t got = 0;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
                 map([](std::uint64_t x) { return x + 1; }) | sink([&](std::uint64_t) { ++got; }),
             pipeline_options{.metrics = true}};
  const report r = p.run();
  require_conserved(r);
  REQUIRE(got == n);
  REQUIRE(r.item_latency.count == n);
  REQUIRE(r.item_latency.max_s >= r.item_latency.p99_s);
  REQUIRE(r.item_latency.p50_s > 0.0);
}

TEST_CASE("pipeline: a dynamic batch leaves at its deadline with what it has") {
  // The source hands out 3 items, then waits on a gate the sink opens: only the batch's
  // deadline can get those 3 items to the sink. A fixed batch of 8 would hang here.
  std::atomic<bool> gate{false};
  std::vector<std::size_t> sizes;
  int produced = 0;
  pipeline p{source([&]() -> std::optional<int> {
               if (produced == 3) gate.wait(false);
               if (produced == 6) return std::nullopt;
               return produced++;
             }) |
             batch(8).max_delay(std::chrono::milliseconds(5)) | sink([&](std::vector<int> v) {
               sizes.push_back(v.size());
               gate.store(true);
               gate.notify_all();
             })};
  require_conserved(p.run());
  // Usually {3, 3}. The first batch left before the gate opened, so with at most the 3
  // items handed out by then: it left at its deadline, not full. (On a loaded machine a
  // source preempted for over 5 ms between two of those items splits them.)
  CAPTURE(sizes);
  REQUIRE(!sizes.empty());
  REQUIRE(sizes.front() >= 1);
  REQUIRE(sizes.front() <= 3);
  REQUIRE(std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}) == 6);
}

TEST_CASE("pipeline: a slow sink never lets items in flight exceed the bound") {
  // Live items are counted by construction/destruction; with every ring at capacity 4
  // the items alive at once are bounded by rings + what each stage holds. The ring into
  // the sink (one thread at each end, small items) may grow where the placer pins the
  // map and the sink to one CPU (ring_growth): then it holds up to 4 x (1 + growth).
  const std::size_t growth = GENERATE(1u, 8u);
  CAPTURE(growth);
  t::counted::live.store(0);
  std::atomic<long> max_live{0};
  const std::uint64_t n = t::scaled(3000);
  {
    pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
                   map([](std::uint64_t x) { return t::counted{x}; }).workers(2) |
                   map([](t::counted c) { return c; }) | sink([&](t::counted) {
                     long live = t::counted::live.load();
                     long m = max_live.load();
                     while (live > m && !max_live.compare_exchange_weak(m, live)) {
                     }
                     std::this_thread::yield();
                   }),
               pipeline_options{.ring_capacity = 4, .ring_growth = growth}};
    require_conserved(p.run());
  }
  // 2 rings x 4 + the sink's ring + 2 map workers + 1 map + 1 sink, each holding at
  // most two copies (the envelope and the value being moved), plus the optional in the
  // ring pop.
  const long sink_ring = growth == 1 ? 4 : static_cast<long>(4 * (1 + growth));
  CHECK(max_live.load() <= 2 * (2 * 4 + sink_ring + 2 + 1 + 1) + 4);
  REQUIRE(t::counted::live.load() == 0);
}

TEST_CASE("pipeline: stop(drain) on a running source pipeline ends it cleanly") {
  std::atomic<std::uint64_t> seen{0};
  pipeline p{source([i = 0]() mutable -> std::optional<int> { return i++; }) |  // endless
             map([](int x) { return x; }) | sink([&](int) { seen.fetch_add(1); })};
  p.start();
  while (seen.load() < 1000) std::this_thread::yield();
  const auto c = p.stop(stop_mode::drain);
  require_conserved(c);
  REQUIRE(c.cancelled == 0);  // drain: everything produced completes
  REQUIRE(c.completed == seen.load());
}

TEST_CASE("pipeline: a consumer that stops early (sink throws) stops everything") {
  pipeline p{source([i = 0]() mutable -> std::optional<int> { return i++; }) |  // endless
             map([](int x) { return x; }).workers(2) | sink([](int x) {
               if (x == 500) throw std::runtime_error("enough");
             })};
  REQUIRE_THROWS_AS(p.run(), stage_error);
  require_conserved(p.counts());
  REQUIRE(p.counts().failed == 1);
}

TEST_CASE("pipeline: ordered maps of different widths on lanes keep input order") {
  const std::uint64_t n = t::scaled(20000);
  std::vector<std::uint64_t> got;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
                 map([](std::uint64_t x) {
                   random_pause(x);
                   return x + 1;
                 })
                     .workers(2)
                     .ordered() |
                 map([](std::uint64_t x) {
                   random_pause(x + 7);
                   return x * 3;
                 })
                     .workers(3)
                     .ordered() |
                 map([](std::uint64_t x) { return x; }) |
                 map([](std::uint64_t x) {
                   random_pause(x + 13);
                   return x - 1;
                 })
                     .workers(4)
                     .ordered() |
                 batch(5) | unbatch() | sink([&](std::uint64_t x) { got.push_back(x); }),
             pipeline_options{.ring_capacity = 16}};
  const auto c = p.run();
  require_conserved(c);
  REQUIRE(got.size() == n);
  bool in_order = true;
  for (std::uint64_t i = 0; i < n; ++i) in_order &= got[i] == 3 * (i + 1) - 1;
  REQUIRE(in_order);
}

TEST_CASE("pipeline: bad configuration fails at construction with what to change") {
  auto src = [] { return from_range(std::vector<int>{1, 2, 3}); };
  auto noop = [](int) {};
  REQUIRE_THROWS_WITH(pipeline(src() | map([](int x) { return x; }).workers(0) | sink(noop)),
                      Catch::Contains("workers must be in [1, 1024]"));
  REQUIRE_THROWS_WITH(pipeline(src() | batch(0) | sink([](std::vector<int>) {})),
                      Catch::Contains("max size must be in [1, 2^20]"));
  REQUIRE_THROWS_WITH(pipeline(src() | sink(noop), pipeline_options{.ring_capacity = 1000}),
                      Catch::Contains("pass 1024"));
  REQUIRE_THROWS_WITH(pipeline(src() | sink(noop).workers(5000)),
                      Catch::Contains("workers must be in [1, 1024]"));
  for (const std::size_t growth : {std::size_t{0}, std::size_t{3}, std::size_t{128}})
    REQUIRE_THROWS_WITH(pipeline(src() | sink(noop), pipeline_options{.ring_growth = growth}),
                        Catch::Contains("ring_growth must be a power of two in [1, 64]"));
  REQUIRE_THROWS_WITH(
      pipeline(src() | sink(noop), pipeline_options{.ring_capacity = std::size_t{1} << 28}),
      Catch::Contains("lower ring_growth"));
}

// Rings that grow (pipeline_options::ring_growth): what can grow gets a reserve, the
// report shows each ring at the deepest it ran, and with the rings moving under a
// pinned chain every item still arrives once, in order.
TEST_CASE("pipeline: rings of small items may grow where their stages share a CPU") {
  const std::uint64_t n = t::scaled(400'000);
  const std::size_t growth = GENERATE(1u, 16u);
  CAPTURE(growth);
  std::uint64_t next = 0;
  bool in_order = true;
  // Capacity 4: a ring that grows moves to 64 slots where its consumer needs at most
  // 15.6 us of CPU per element (these stages: under sanitizers too) and the placer
  // (every 10 ms, by_load: always pinned) puts both its threads on one CPU.
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
                 map([](std::uint64_t x) { return x + 1; }) |
                 map([](std::uint64_t x) { return x * 2; }) |
                 sink([&](std::uint64_t x) { in_order = in_order && x == 2 * (++next); }),
             pipeline_options{.ring_capacity = 4,
                              .ring_growth = growth,
                              .placement = thread_placement::by_load,
                              .placement_period = std::chrono::milliseconds(10)}};
  const report r = p.run();
  require_conserved(r);
  CHECK(r.completed == n);
  CHECK(in_order);
  REQUIRE(r.stages.size() == 4);
  CHECK(r.stages[0].ring_capacity == 0);  // the source has no input ring
  // Whether a ring grew depends on where the placer put the threads (neighbours together
  // on a CPU, or not); what it reports is one of the two depths either way.
  for (std::size_t i = 1; i < 4; ++i) {
    CAPTURE(i);
    CHECK((r.stages[i].ring_capacity == 4 || r.stages[i].ring_capacity == 4 * growth));
  }
}

TEST_CASE("pipeline: soak of 1M items through every stage kind with bounded memory") {
  const std::uint64_t n = t::scaled(1'000'000);
  t::counted::live.store(0);
  std::atomic<long> max_live{0};
  std::uint64_t sum = 0, count = 0;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
                 map([](std::uint64_t x) { return t::counted{x}; }).workers(2).ordered() |
                 batch(32).max_delay(std::chrono::microseconds(200)) | unbatch() |
                 sink([&](t::counted c) {
                   sum += c.value;
                   ++count;
                   if ((count & 1023) == 0) {
                     const long live = t::counted::live.load();
                     if (live > max_live.load()) max_live.store(live);
                   }
                 }),
             pipeline_options{.ring_capacity = 256}};
  require_conserved(p.run());
  REQUIRE(count == n);
  REQUIRE(sum == n * (n - 1) / 2);
  // Bounded by rings (3 x 256 items, one ring of 256 batches of 32; none grows: their
  // items own memory) + stage-held items, independent of n: a leak or an unbounded
  // queue would grow with the run.
  CHECK(max_live.load() <= 3 * 256 + 256 * 32 + 2 * 32 + 64);
  REQUIRE(t::counted::live.load() == 0);
}
