// benchmarks/bench_pipeline.cpp: conveyor's pipeline against oneTBB's parallel_pipeline and
// a serial loop, same stages, one binary.
//
//   ./bench_pipeline                                     # every benchmark, ~1.5 min on 2 cores
//   ./bench_pipeline --benchmark_filter='/trivial'       # per-item overhead only
//   ./bench_pipeline --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Two questions, two families of names:
//
// <peer>/trivial[/workers:W/metrics:on|off[/ring_growth:1|/placement:os] | /tokens:T]
//     per-item overhead.
//     1<<22 items per iteration (long enough that the placer's first round, 10 ms in,
//     has pinned the stage threads for most of it: what a pipeline that runs for a while
//     gets) go
//     source (serial, in order) -> map x+1 (parallel) -> map x*2 (parallel) -> sink (serial,
//     in order); the sink checks that item i arrives i-th with value 2(i+1), and the sum.
//     conveyor: from_range | map.workers(W).ordered() | map.workers(W).ordered() | sink,
//     W = 1 and 2, each with the pipeline's metrics on (the default: per-stage clocks,
//     counters, latency histogram) and off (pipeline_options{.metrics = false}), so the
//     cost of measuring is the ratio of the two in the same run; and metrics off with
//     ring_growth = 1 (rings that never grow) and with placement = os beside the
//     defaults (rings that grow where neighbours take turns on a CPU, automatic placement), each
//     what that default gives, in the same run. tbb: parallel_pipeline
//     with filters serial_in_order -> parallel -> parallel -> serial_in_order and
//     T = 4 * cores tokens. serial: one plain loop. bare: the same stages as four threads
//     over the in-bench Lamport ring (benchmarks/lamport_ring.hpp), waiting by pause and
//     yield; /pinned: two neighbours per CPU, else where the OS puts them. The pinned
//     chain also runs over conveyor's rings: /ring:spsc, spsc_ring<item> (the default
//     layout), and /ring:hop, the ring of a pipeline's hop (detail::hop_ring) holding what
//     a hop holds for these stages (the value and its item's 8-byte id): the rings'
//     share of the gap between the pipeline and the bare chain, apart from the stages'.
//     Counters: items_per_second; conveyor with W = 1: rings_grown, how many of the three
//     rings ran deeper than ring_capacity in an iteration, on average
//     (pipeline_options::ring_growth: once pinned two stages per core, the two rings
//     within a core and the one between the cores grow, so 3 is what the default placement
//     should reach on two cores; lanes, W = 2, never grow).
//
// <peer>/overlap/{sleep,spin}  overlap efficiency. 2000 items per iteration through three
//     one-worker stages costing 200, 300 and 100 us per item, between a source and an
//     in-order checking sink. "sleep": the stage waits (std::this_thread::sleep_for; it
//     burns no CPU, like a stream wait, and on these VMs takes longer than asked because of
//     timer slack). "spin": the stage burns that much CPU time of its own thread (it spins
//     on CLOCK_THREAD_CPUTIME_ID, so a stage that is preempted does not progress: it models
//     real CPU work, not a wall-clock wait). Before its timed iteration each benchmark
//     measures every stage in isolation (500 items through the stage alone, on the calling
//     thread), so the bound comes from the same run and the same load:
//       ideal_items_per_second = 1 / (slowest stage's isolated cost per item)
//       overlap_efficiency     = measured items/s / ideal_items_per_second
//       sum_bound_items_per_second = 1 / (sum of the isolated costs): what no overlap gives
//     conveyor: from_range | map | map | map | sink, one worker each, with the default
//     placement (automatic: pinned by CPU time per item while the stages alone fill the
//     cores), /placement:os (never pinned) and /placement:by_load (always pinned); the
//     placer re-plans every 50 ms. tbb: parallel_pipeline,
//     every filter serial_in_order, 4 * cores tokens. serial: one loop calling the three.
//     With "spin" the three stages need 600 us of CPU per item and the slowest needs 300 us:
//     on 2 cores the ideal leaves no idle time anywhere, so the figure also shows how much
//     CPU the pipeline's own waiting takes from the stages.
//
// Timing is wall clock (UseRealTime), construction of the pipeline included; the
// benchmark pins nothing itself (the pipeline owns its threads). The context block
// records the load average at start: other processes on the same cores change every
// figure here.
//
// Thread-safety: a benchmark binary; each benchmark owns its pipeline and its checker.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <fstream>
#include <ranges>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/version.h>

#include <pthread.h>  // pthread_setaffinity_np: the pinned bare chain
#include <sched.h>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/cpu_relax.hpp"
#include "conveyor/pipeline.hpp"
#include "lamport_ring.hpp"

namespace {

using item = std::uint64_t;
using clock_type = std::chrono::steady_clock;

constexpr item trivial_items = item{1} << 22;
constexpr item overlap_items = 2000;
// The overlap rows' placer re-plans every 50 ms (the option's default is 200 ms): a run
// lasts ~0.6 s, and the figure is meant to show the placed steady state.
constexpr std::chrono::milliseconds placement_period{50};
constexpr item isolation_items = 500;

unsigned cores() { return std::max(1u, std::thread::hardware_concurrency()); }
std::size_t tbb_tokens() { return 4 * std::size_t{cores()}; }

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double process_cpu_ns() noexcept { return static_cast<double>(conveyor::process_cpu_ns()); }

// CPU time of the whole process (every thread: the pipeline's, TBB's workers) over the
// timed iterations, per item: what the pipeline costs beyond its stages' own work, and
// whether its idle threads sleep (sleep stages: near zero) or spin.
class cpu_meter {
 public:
  cpu_meter() noexcept : start_(process_cpu_ns()) {}
  // Sets items_per_second (from the framework's real time) and cpu_ns_per_item.
  void finish(benchmark::State& state, item items_per_iteration) const {
    const auto items = state.iterations() * static_cast<std::int64_t>(items_per_iteration);
    state.SetItemsProcessed(items);
    if (items > 0)
      state.counters["cpu_ns_per_item"] = (process_cpu_ns() - start_) / static_cast<double>(items);
  }

 private:
  double start_;
};

// Checks, in the sink, that item i arrives i-th with value expected(i); keeps the sum too.
template <class Expected>
class in_order_check {
 public:
  explicit in_order_check(Expected expected) : expected_(expected) {}
  void operator()(item x) noexcept {
    ok_ &= x == expected_(next_);
    sum_ += x;
    ++next_;
  }
  // True when exactly n items came, each in its place, and their sum is `sum`.
  bool passed(item n, item sum) const noexcept { return ok_ && next_ == n && sum_ == sum; }

 private:
  Expected expected_;
  item next_ = 0;
  item sum_ = 0;
  bool ok_ = true;
};

template <class Expected>
bool report_check(benchmark::State& state, const in_order_check<Expected>& check, item n,
                  item sum) {
  if (check.passed(n, sum)) return true;
  state.SkipWithError("the sink saw a wrong, missing or out-of-order item");
  return false;
}

// ---------------------------------------------------------------------------------------
// Per-item overhead: trivial stages.

// Function objects, not functions: both pipelines inline them the same way.
constexpr auto add_one = [](item x) noexcept { return x + 1; };
constexpr auto twice = [](item x) noexcept { return x * 2; };
constexpr auto trivial_expected = [](item i) noexcept { return twice(add_one(i)); };
using trivial_check = in_order_check<std::remove_const_t<decltype(trivial_expected)>>;
constexpr item trivial_sum = trivial_items * (trivial_items + 1);  // sum of 2(i+1), i < n

void conveyor_trivial(benchmark::State& state, std::size_t workers, bool metrics,
                      conveyor::thread_placement placement, std::size_t ring_growth) {
  const cpu_meter cpu;
  const conveyor::pipeline_options options{
      .ring_growth = ring_growth, .metrics = metrics, .placement = placement};
  double rings_grown = 0;
  for (auto _ : state) {
    trivial_check check{trivial_expected};
    try {
      conveyor::pipeline p{conveyor::from_range(std::views::iota(item{0}, trivial_items)) |
                               conveyor::map(add_one).workers(workers).ordered() |
                               conveyor::map(twice).workers(workers).ordered() |
                               conveyor::sink([&check](item x) { check(x); }),
                           options};
      for (const conveyor::stage_report& s : p.run().stages)
        rings_grown += s.ring_capacity > options.ring_capacity ? 1 : 0;
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
    if (!report_check(state, check, trivial_items, trivial_sum)) return;
  }
  cpu.finish(state, trivial_items);
  if (workers == 1)  // a map of two workers talks over lanes, which never grow
    state.counters["rings_grown"] =
        benchmark::Counter(rings_grown, benchmark::Counter::kAvgIterations);
}

void tbb_trivial(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  const cpu_meter cpu;
  for (auto _ : state) {
    trivial_check check{trivial_expected};
    item next = 0;
    oneapi::tbb::parallel_pipeline(
        tokens,
        oneapi::tbb::make_filter<void, item>(oneapi::tbb::filter_mode::serial_in_order,
                                             [&next](oneapi::tbb::flow_control& fc) -> item {
                                               if (next == trivial_items) {
                                                 fc.stop();
                                                 return 0;
                                               }
                                               return next++;
                                             }) &
            oneapi::tbb::make_filter<item, item>(oneapi::tbb::filter_mode::parallel, add_one) &
            oneapi::tbb::make_filter<item, item>(oneapi::tbb::filter_mode::parallel, twice) &
            oneapi::tbb::make_filter<item, void>(oneapi::tbb::filter_mode::serial_in_order,
                                                 [&check](item x) { check(x); }));
    if (!report_check(state, check, trivial_items, trivial_sum)) return;
  }
  cpu.finish(state, trivial_items);
}

// The bare chain: what a hand-written pipeline of the same stages gets at best, four
// threads over a ring (by default the in-bench Lamport ring, benchmarks/lamport_ring.hpp:
// rigtorp's layout, each side on its own 64-byte line), capacity 1024 as the pipeline's
// rings, waiting by pause and a yield every 64 failed tries. pinned: the threads in runs
// of neighbours, two per CPU (what conveyor's placement does with four equal stages on two
// cores); else wherever the OS puts them.
void pin_to(unsigned cpu) noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % cores(), &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // unpinned if refused
}

// What a pipeline's hop holds for an item of these stages: its value and the item's id
// (detail::envelope<item>: 16 bytes).
struct hop_item {
  item value;
  std::uint64_t id;
};
static_assert(sizeof(hop_item) == sizeof(conveyor::detail::envelope<item>));

template <class Ring = bench::lamport_ring<item, 64>>
void bare_trivial(benchmark::State& state, bool pinned) {
  using ring = Ring;
  using element = typename Ring::value_type;
  constexpr std::size_t capacity = 1024;
  const cpu_meter cpu;
  for (auto _ : state) {
    trivial_check check{trivial_expected};
    ring a{capacity}, b{capacity}, c{capacity};
    const auto push = [](ring& r, item v) {
      bench::backoff wait;
      element e{};
      if constexpr (std::is_same_v<element, hop_item>)
        e = hop_item{v, v};  // an id per item, as a source gives
      else
        e = v;
      while (!r.try_push(e)) wait();
    };
    const auto pop = [](ring& r) {
      bench::backoff wait;
      element e{};
      while (!r.try_pop(e)) wait();
      if constexpr (std::is_same_v<element, hop_item>)
        return e.value;
      else
        return e;
    };
    std::thread source{[&] {
      if (pinned) pin_to(0);
      for (item i = 0; i < trivial_items; ++i) push(a, i);
    }};
    std::thread first{[&] {
      if (pinned) pin_to(0);
      for (item i = 0; i < trivial_items; ++i) push(b, add_one(pop(a)));
    }};
    std::thread second{[&] {
      if (pinned) pin_to(1);
      for (item i = 0; i < trivial_items; ++i) push(c, twice(pop(b)));
    }};
    if (pinned) pin_to(1);
    for (item i = 0; i < trivial_items; ++i) check(pop(c));
    source.join();
    first.join();
    second.join();
    if (pinned) {  // the benchmark's own thread back on every CPU
      cpu_set_t all;
      CPU_ZERO(&all);
      for (unsigned k = 0; k < cores(); ++k) CPU_SET(k, &all);
      (void)pthread_setaffinity_np(pthread_self(), sizeof all, &all);
    }
    if (!report_check(state, check, trivial_items, trivial_sum)) return;
  }
  cpu.finish(state, trivial_items);
}

void serial_trivial(benchmark::State& state) {
  const cpu_meter cpu;
  for (auto _ : state) {
    trivial_check check{trivial_expected};
    for (item i = 0; i < trivial_items; ++i) {
      item x = i;
      benchmark::DoNotOptimize(x);  // keep the loop a loop of single items
      check(twice(add_one(x)));
    }
    if (!report_check(state, check, trivial_items, trivial_sum)) return;
  }
  cpu.finish(state, trivial_items);
}

// ---------------------------------------------------------------------------------------
// Overlap efficiency: three stages of 200, 300 and 100 us per item.

enum class cost_kind { sleep, spin };

// Burns d of this thread's CPU time: while preempted it makes no progress.
void burn_cpu(std::chrono::nanoseconds d) noexcept {
  const std::int64_t end = conveyor::thread_cpu_ns() + d.count();
  while (conveyor::thread_cpu_ns() < end) {
  }
}

constexpr std::array<std::chrono::microseconds, 3> stage_costs{
    std::chrono::microseconds(200), std::chrono::microseconds(300), std::chrono::microseconds(100)};

// One stage's work: waits or burns its cost, then passes the item on, changed.
struct costly_stage {
  cost_kind kind;
  std::chrono::microseconds cost;
  item operator()(item x) const noexcept {
    if (kind == cost_kind::sleep) {
      std::this_thread::sleep_for(cost);
    } else {
      burn_cpu(cost);
    }
    return x + 1;
  }
};

constexpr auto overlap_expected = [](item i) noexcept { return i + stage_costs.size(); };
using overlap_check = in_order_check<std::remove_const_t<decltype(overlap_expected)>>;
// sum of i + 3, i < n
constexpr item overlap_sum = overlap_items * (overlap_items - 1) / 2 + 3 * overlap_items;

costly_stage stage(cost_kind kind, std::size_t i) { return {kind, stage_costs[i]}; }

// Seconds per item of each stage run alone on this thread.
struct isolated_costs {
  std::array<double, 3> per_item{};
  double slowest() const { return *std::max_element(per_item.begin(), per_item.end()); }
  double sum() const { return per_item[0] + per_item[1] + per_item[2]; }
};

isolated_costs measure_isolated(cost_kind kind) {
  isolated_costs c;
  for (std::size_t s = 0; s < stage_costs.size(); ++s) {
    const costly_stage f = stage(kind, s);
    const auto t0 = clock_type::now();
    for (item i = 0; i < isolation_items; ++i) benchmark::DoNotOptimize(f(i));
    c.per_item[s] = seconds_since(t0) / static_cast<double>(isolation_items);
  }
  return c;
}

// Runs body() once per iteration, timed; sets items and the overlap counters.
template <class Body>
void run_overlap(benchmark::State& state, cost_kind kind, Body body) {
  const isolated_costs iso = measure_isolated(kind);
  double elapsed = 0;
  const cpu_meter cpu;
  for (auto _ : state) {
    overlap_check check{overlap_expected};
    const auto t0 = clock_type::now();
    try {
      body(check);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
    elapsed += seconds_since(t0);
    if (!report_check(state, check, overlap_items, overlap_sum)) return;
  }
  cpu.finish(state, overlap_items);
  const auto items = static_cast<double>(state.iterations() * overlap_items);
  const double measured = items / elapsed;
  const double ideal = 1.0 / iso.slowest();
  state.counters["ideal_items_per_second"] = ideal;
  state.counters["overlap_efficiency"] = measured / ideal;
  state.counters["sum_bound_items_per_second"] = 1.0 / iso.sum();
  state.counters["slowest_stage_us"] = iso.slowest() * 1e6;
}

void conveyor_overlap(benchmark::State& state, cost_kind kind,
                      conveyor::thread_placement placement) {
  run_overlap(state, kind, [kind, placement](overlap_check& check) {
    conveyor::pipeline p{
        conveyor::from_range(std::views::iota(item{0}, overlap_items)) |
            conveyor::map(stage(kind, 0)) | conveyor::map(stage(kind, 1)) |
            conveyor::map(stage(kind, 2)) | conveyor::sink([&check](item x) { check(x); }),
        conveyor::pipeline_options{.placement = placement, .placement_period = placement_period}};
    (void)p.run();
  });
}

void tbb_overlap(benchmark::State& state, cost_kind kind) {
  run_overlap(state, kind, [kind](overlap_check& check) {
    namespace tbb = oneapi::tbb;
    constexpr auto in_order = tbb::filter_mode::serial_in_order;
    item next = 0;
    tbb::parallel_pipeline(
        tbb_tokens(), tbb::make_filter<void, item>(in_order,
                                                   [&next](tbb::flow_control& fc) -> item {
                                                     if (next == overlap_items) {
                                                       fc.stop();
                                                       return 0;
                                                     }
                                                     return next++;
                                                   }) &
                          tbb::make_filter<item, item>(in_order, stage(kind, 0)) &
                          tbb::make_filter<item, item>(in_order, stage(kind, 1)) &
                          tbb::make_filter<item, item>(in_order, stage(kind, 2)) &
                          tbb::make_filter<item, void>(in_order, [&check](item x) { check(x); }));
  });
}

void serial_overlap(benchmark::State& state, cost_kind kind) {
  run_overlap(state, kind, [kind](overlap_check& check) {
    const costly_stage a = stage(kind, 0), b = stage(kind, 1), c = stage(kind, 2);
    for (item i = 0; i < overlap_items; ++i) check(c(b(a(i))));
  });
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string one, five, fifteen;
  if (!(f >> one >> five >> fifteen)) return "unknown";
  return one + " " + five + " " + fifteen;
}

void register_all() {
  // metrics:on (the default) and metrics:off side by side: what the per-stage clocks,
  // counters and latency histogram cost per item, measured in the same run.
  // /placement:os beside the default (automatic): what pinning by load gives.
  // /ring_growth:1 beside the default (8): what rings that grow where neighbouring stages
  // share a CPU give (pipeline_options::ring_growth).
  using conveyor::thread_placement;
  constexpr std::size_t growth = conveyor::pipeline_options{}.ring_growth;
  for (const std::size_t w : {1, 2})
    for (const auto& [suffix, metrics, placement, ring_growth] :
         {std::tuple{"/metrics:on", true, thread_placement::automatic, growth},
          std::tuple{"/metrics:off", false, thread_placement::automatic, growth},
          std::tuple{"/metrics:off/ring_growth:1", false, thread_placement::automatic,
                     std::size_t{1}},
          std::tuple{"/metrics:off/placement:os", false, thread_placement::os, growth}})
      benchmark::RegisterBenchmark(
          ("conveyor/trivial/workers:" + std::to_string(w) + suffix).c_str(), conveyor_trivial, w,
          metrics, placement, ring_growth)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("tbb/trivial", tbb_trivial)
      ->ArgName("tokens")
      ->Arg(static_cast<std::int64_t>(tbb_tokens()))
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("serial/trivial", serial_trivial)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bare/trivial", bare_trivial<>, false)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bare/trivial/pinned", bare_trivial<>, true)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bare/trivial/pinned/ring:spsc",
                               bare_trivial<conveyor::spsc_ring<item>>, true)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bare/trivial/pinned/ring:hop",
                               bare_trivial<conveyor::detail::hop_ring<hop_item>>, true)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);

  for (const auto& [name, kind] :
       {std::pair{"sleep", cost_kind::sleep}, std::pair{"spin", cost_kind::spin}}) {
    const std::string suffix = std::string("/overlap/") + name;
    // One iteration of 2000 items (~0.6 to 1.5 s) per repetition: fixed, so that the
    // isolated costs measured before it belong to that very iteration's run.
    for (const auto& [placement_suffix, placement] :
         {std::pair{"", thread_placement::automatic},
          std::pair{"/placement:os", thread_placement::os},
          std::pair{"/placement:by_load", thread_placement::by_load}})
      benchmark::RegisterBenchmark(("conveyor" + suffix + placement_suffix).c_str(),
                                   conveyor_overlap, kind, placement)
          ->UseRealTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("tbb" + suffix).c_str(), tbb_overlap, kind)
        ->UseRealTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("serial" + suffix).c_str(), serial_overlap, kind)
        ->UseRealTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("loadavg_at_start", load_average());
  benchmark::AddCustomContext("onetbb", TBB_VERSION_STRING);
  benchmark::AddCustomContext("tbb_tokens", std::to_string(tbb_tokens()));
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
