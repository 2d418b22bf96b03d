// bench_autotune: conveyor::autotune against an exhaustive grid over the same knobs, on
// three planted pipelines (host runtime), in one run:
//   cpu_bound       decode waits 200 us per item and starts with 1 worker
//   transfer_bound  32 KiB per item copied in by the segment (the host runtime's H2D is a
//                   memcpy on the lane's stream thread), starting with 1 lane
//   compute_bound   the segment's kernel takes 20 us + 8 us per item on one shared engine
//                   (a mutex: lanes do not add compute, as on one GPU)
// Each row probes the whole grid (workers 1, 2, 4, 8 x lanes 1, 2, 4 x batch 16, 64, 256:
// 36 probes), then runs autotune from the planted start with the default budget.
// Counters: grid_best and tuned (items/s: the grid's best knobs and the tuner's, measured
// again 3 times each, taking turns, medians; a best seen once among 36 noisy probes
// overstates itself: grid_best_in_grid), tuned_over_grid (target >= 0.95), probes and
// grid_probes, probe_time_ratio (the tuner's probing time over the grid's; target <= 0.2).
// The label is both knob sets. Stages wait rather than spin where they can, so the
// figures depend little on the machine's core count; the transfer row's copies do use
// the cores.
//   ./build/benchmarks/bench_autotune
//   env CONVEYOR_AUTOTUNE_SCALE=P: items per probe at P % (the CTest smoke run uses 5)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <ranges>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/pipeline/autotune.hpp"
#include "conveyor/runtime/host/runtime.hpp"

namespace {

using namespace conveyor;
using R = host::runtime;
using item = std::uint64_t;

struct planted {
  const char* name;
  std::uint64_t items;                // per probe, at full scale
  std::chrono::microseconds decode;   // per item, waiting
  std::size_t in_bytes;               // per item, copied in by the segment
  std::chrono::microseconds kernel0;  // per batch, on the shared engine
  std::chrono::microseconds kernel1;  // per item, on the shared engine
  tune_knobs start;
};

std::uint64_t scaled(std::uint64_t n) {
  const char* s = std::getenv("CONVEYOR_AUTOTUNE_SCALE");
  const long pct = s != nullptr ? std::strtol(s, nullptr, 10) : 100;
  return std::max<std::uint64_t>(n * static_cast<std::uint64_t>(std::clamp(pct, 1L, 100L)) / 100,
                                 64);
}

report run_probe(const planted& c, const tune_knobs& k) {
  static std::mutex engine;  // one device: one kernel at a time, whatever the lanes
  const std::size_t b = k.batch, in_bytes = c.in_bytes;
  auto seg = gpu<R, std::uint8_t, std::uint8_t>(
      {.lanes = k.lanes, .in_elems = b * in_bytes, .out_elems = b, .name = "model"},
      [in_bytes](std::vector<item>& v, R::pinned_span<std::uint8_t>) {
        return v.size() * in_bytes;  // the copy moves what the slot holds
      },
      [&c](lane_batch<R, std::uint8_t, std::uint8_t>& l) {
        const auto t = c.kernel0 + c.kernel1 * static_cast<long>(l.items);
        l.stream.enqueue([t] {
          const std::lock_guard<std::mutex> hold(engine);
          std::this_thread::sleep_for(t);
        });
        return l.items;
      },
      [](std::vector<item>&& v, R::pinned_span<const std::uint8_t>) { return std::move(v); });
  const auto decode = c.decode;
  pipeline p{from_range(std::views::iota(item{0}, scaled(c.items))) |
                 map([decode](item x) {
                   if (decode.count() > 0) std::this_thread::sleep_for(decode);
                   return x;
                 })
                     .workers(k.workers_of("decode", 1))
                     .name("decode") |
                 batch(b) | std::move(seg) | unbatch() | sink([](item) {}),
             {.ring_capacity = k.ring_capacity}};
  return p.run();
}

std::string knobs_label(const tune_knobs& k) {
  return "workers " + std::to_string(k.workers_of("decode", 1)) + ", lanes " +
         std::to_string(k.lanes) + ", batch " + std::to_string(k.batch) + ", ring " +
         std::to_string(k.ring_capacity);
}

void tuned_against_grid(benchmark::State& state, const planted& c) {
  for (auto _ : state) {
    double grid_best = 0, grid_s = 0;
    std::size_t grid_probes = 0;
    tune_knobs grid_knobs = c.start;
    for (std::size_t w : {1, 2, 4, 8})
      for (std::size_t l : {1, 2, 4})
        for (std::size_t b : {16, 64, 256}) {
          tune_knobs k = c.start;
          k.workers["decode"] = w;
          k.lanes = l;
          k.batch = b;
          const auto t0 = std::chrono::steady_clock::now();
          const report r = run_probe(c, k);
          grid_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r.throughput > grid_best) {
            grid_best = r.throughput;
            grid_knobs = k;
          }
          ++grid_probes;
        }
    tune_budget budget;
    budget.max_workers = 8;
    budget.max_lanes = 4;
    budget.max_batch = 256;
    const tune_result t =
        autotune([&c](const tune_knobs& k) { return run_probe(c, k); }, {}, budget, c.start);
    std::ostringstream table;
    table << t;
    // The grid's best and the tuner's best, each seen once among noisy probes: measure
    // both again, taking turns, and compare medians.
    std::vector<double> grid_again, tuned_again;
    for (int round = 0; round < 3; ++round) {
      grid_again.push_back(run_probe(c, grid_knobs).throughput);
      tuned_again.push_back(run_probe(c, t.best).throughput);
    }
    std::ranges::sort(grid_again);
    std::ranges::sort(tuned_again);
    state.counters["grid_best_in_grid"] = grid_best;
    state.counters["grid_best"] = grid_again[1];
    state.counters["tuned"] = tuned_again[1];
    state.counters["tuned_over_grid"] = tuned_again[1] / grid_again[1];
    state.counters["probes"] = static_cast<double>(t.trials.size());
    state.counters["grid_probes"] = static_cast<double>(grid_probes);
    state.counters["probe_time_ratio"] = grid_s > 0 ? t.probe_seconds / grid_s : 0.0;
    state.SetLabel("tuned: " + knobs_label(t.best) + "; grid: " + knobs_label(grid_knobs));
    if (std::getenv("CONVEYOR_BENCH_REPORTS") != nullptr)
      std::printf("%s:\n%s\n", c.name, table.str().c_str());
  }
}

tune_knobs start(std::size_t workers, std::size_t lanes, std::size_t batch) {
  tune_knobs k;
  k.workers["decode"] = workers;
  k.lanes = lanes;
  k.batch = batch;
  return k;
}

const planted configs[] = {
    {"cpu_bound", 6000, std::chrono::microseconds(200), 64, std::chrono::microseconds(10),
     std::chrono::microseconds(0), start(1, 2, 64)},
    {"transfer_bound", 100000, std::chrono::microseconds(0), 32 * 1024,
     std::chrono::microseconds(5), std::chrono::microseconds(0), start(2, 1, 16)},
    {"compute_bound", 40000, std::chrono::microseconds(0), 64, std::chrono::microseconds(20),
     std::chrono::microseconds(8), start(2, 2, 64)},
};

}  // namespace

int main(int argc, char** argv) {
  for (const planted& c : configs)
    benchmark::RegisterBenchmark((std::string("autotune/") + c.name).c_str(),
                                 [&c](benchmark::State& s) { tuned_against_grid(s, c); })
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kSecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
