// conveyor/pipeline/autotune.hpp: find a pipeline's knobs by running short probes of it,
// moving only the knob of the stage the verdict names.
//
//   auto probe = [&](const conveyor::tune_knobs& k) {        // builds and runs one probe
//     conveyor::pipeline p{
//         conveyor::from_range(sample) |
//             conveyor::map(decode).workers(k.workers_of("decode", 1)).name("decode") |
//             conveyor::batch(k.batch) | model_segment(k.lanes) | conveyor::unbatch() |
//             conveyor::sink(keep),
//         {.ring_capacity = k.ring_capacity}};
//     return p.run();
//   };
//   conveyor::tune_result t = conveyor::autotune(probe);   // or tune_objective::within_p99(5ms)
//   std::cout << t;                                        // every probe, and why it stopped
//   run_for_real(t.best);
//
// The search is not a grid: each probe's verdict names the stage that set the pace, and
// the next probe changes that stage's knob alone —
//   cpu_stage_bound / sink_bound at a map     workers of that map x2
//   cpu_stage_bound at the GPU segment        lanes x2 (its host side: more threads)
//   transfer_bound_h2d / _d2h                 lanes x2, then batch x2 (fewer, larger copies)
//   compute_bound                             batch x2 once; then it stops: the device is
//                                             the bottleneck, nothing is left on the host
//   balanced                                  ring_capacity x4 while it gains (stages
//                                             absorbing each other's jitter), then workers
//                                             x2 on the busiest map
//   source_bound, under_batched, a sink       it stops: the input (or the sink) sets the
//                                             pace, no knob here changes it
// With a P99 bound, a probe over the bound first halves the batch (less waiting to fill
// it), and only probes within the bound can become the best.
// A move is kept when its probe beats the best by min_gain (default 5 %: below it a
// probe's noise on a shared machine decides); a move that is not kept is not tried again,
// and the next probe moves the knob the best probe's verdict names next. The search ends
// when no move is left, or at the budget (probes, seconds). Probes should each run long
// enough for the verdict to name a stage (a few hundred milliseconds at least; the report
// says when a run was too short to tell).
// Thread-safety: runs the probes one after another on the calling thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/report/report.hpp"

namespace conveyor {

// The knobs a probe is built from. workers: by the map stage's name; a name not in it
// means the probe's own default (workers_of's fallback) until the tuner moves it.
struct tune_knobs {
  std::map<std::string, std::size_t, std::less<>> workers;
  std::size_t lanes = 2;
  std::size_t batch = 64;
  std::size_t ring_capacity = 1024;

  std::size_t workers_of(std::string_view stage, std::size_t fallback = 1) const {
    const auto it = workers.find(stage);
    return it == workers.end() ? fallback : it->second;
  }
  friend bool operator==(const tune_knobs&, const tune_knobs&) = default;
};

// What the search maximizes: throughput, or throughput among probes whose item P99 is at
// most max_p99.
struct tune_objective {
  std::chrono::nanoseconds max_p99{0};  // 0: no bound

  static tune_objective throughput() { return {}; }
  static tune_objective within_p99(std::chrono::nanoseconds bound) { return {bound}; }
};

struct tune_budget {
  std::size_t max_probes = 12;
  std::chrono::milliseconds max_time{60'000};  // no probe starts after this much probing
  double min_gain = 0.05;                      // a move is kept when it wins by this share
  std::size_t max_workers = 0;                 // per map; 0: the machine's hardware threads
  std::size_t max_lanes = 8;
  std::size_t max_batch = 1024;
  std::size_t max_ring_capacity = 1 << 16;
};

// One probe: its knobs, what it measured, what it changed from the best before it.
struct tune_trial {
  tune_knobs knobs;
  double throughput = 0.0;  // items/s
  double p99_s = 0.0;       // item latency
  double seconds = 0.0;     // the probe's wall time
  metrics::verdict_kind kind = metrics::verdict_kind::idle;
  std::string stage;  // the stage its verdict named
  std::string move;   // "start", "workers 'decode' 2 -> 4", "lanes 2 -> 4", ...
  bool kept = false;  // became the best
};

struct tune_result {
  tune_knobs best;
  double best_throughput = 0.0;
  double best_p99_s = 0.0;
  bool objective_met = false;  // with a P99 bound: some probe was within it
  std::vector<tune_trial> trials;
  std::string stopped;       // why the search ended
  double probe_seconds = 0;  // all probes' wall time
};

std::ostream& operator<<(std::ostream& o, const tune_result& t);

namespace detail {
tune_result autotune(const std::function<report(const tune_knobs&)>& probe, tune_objective obj,
                     tune_budget budget, const tune_knobs& start);
}  // namespace detail

// Runs probe(knobs) for the start knobs, then for each move the verdicts ask for (see
// above), and returns the best knobs with the table of every probe.
// @throws config_error on a budget with no probes or bad limits; whatever probe throws.
template <class Probe>
  requires std::is_invocable_r_v<report, Probe&, const tune_knobs&>
tune_result autotune(Probe&& probe, tune_objective objective = {}, tune_budget budget = {},
                     const tune_knobs& start = {}) {
  return detail::autotune([&probe](const tune_knobs& k) -> report { return std::invoke(probe, k); },
                          objective, budget, start);
}

}  // namespace conveyor
