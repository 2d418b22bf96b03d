// conveyor/report/report.hpp: the report of a pipeline run: a struct for programs, a
// table for people (operator<<) and JSON for tools (to_json).
//
//   conveyor::report r = pipeline.run();          // also pipeline.report(), stop()
//   std::cout << r;                               // table + "verdict: ..." + "advice: ..."
//   std::ofstream{"run.json"} << conveyor::metrics::to_json(r);
//   if (r.verdict.kind == conveyor::verdict_kind::cpu_stage_bound) ... r.verdict.stage ...
//
// Filling it (the pipeline does this; see verdict.hpp for what the verdict reads):
//   stages   one stage_report per stage, in pipeline order, from make_stage_report()
//            over the stage's stage_stats. Times are summed over workers, so a stage's
//            capacity is wall_s * workers. For the GPU segment (kind gpu) the workers
//            are the lanes' host threads and busy/starved/blocked are theirs; the device
//            side is in `lanes` and gpu_busy_fraction.
//   lanes    one lane_report per lane (make_lane_reports(gpu_stats)): the stream's phases
//            and the host work around them (stage-in, stage-out).
//   gpu_busy_fraction   gpu_stats::compute_busy_ns() / wall: union over lanes.
//   batching make_batch_report(batch_stats) when the pipeline batches, else nullopt.
//   latency_target   make_latency_target_report(latency_target_log) for a batch stage
//            with a latency target, else nullopt.
//   *_latency make_latency_report(histogram).
//   cpus, process_cpu_s   the usable CPUs and the process's CPU time over the run.
//   machine_cpu_s, machine_busy_cpu_s   the same CPUs' time and busy time, every process
//            counted (/proc/stat): with process_cpu_s, the share other work took.
//   timeline  the verdict of each period of the run (verdict_timeline, timeline.hpp).
//   placement   the placement mode and the placer's rounds (pinned / all).
//   then complete_report(r) (verdict.hpp): throughput and verdict.
//
// The builders, the table and the JSON are compiled once, in the library (src/report.cpp).
// Thread-safety: plain values. The make_* builders read counters from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/counters/batch_stats.hpp"
#include "conveyor/counters/failure_log.hpp"
#include "conveyor/counters/histogram.hpp"
#include "conveyor/counters/lane_stats.hpp"
#include "conveyor/counters/latency_target.hpp"
#include "conveyor/counters/stage_stats.hpp"

namespace conveyor::metrics {

enum class verdict_kind {
  idle,                // no items went through
  cpu_stage_bound,     // a CPU stage is at capacity and the stages after it (the GPU) wait
  transfer_bound_h2d,  // the GPU segment is at capacity and host-to-device copies dominate
  transfer_bound_d2h,  // ... device-to-host copies dominate
  compute_bound,       // ... compute dominates: the GPU is the bottleneck (healthy)
  under_batched,       // batches leave on timeout, far below max size, GPU mostly idle
  source_bound,        // the source (or the input it waits on) sets the pace
  sink_bound,          // the sink, or a postprocess stage after the GPU, is at capacity
  balanced,            // no single stage limits throughput
  unmeasured,          // the pipeline ran with metrics off: nothing to diagnose from
};

std::string_view to_string(verdict_kind k) noexcept;

struct stage_report {
  std::string name;
  stage_kind kind = stage_kind::map;
  std::size_t workers = 1;
  std::uint64_t items = 0;      // items (a batch counts its items) that left the stage
  double busy_s = 0.0;          // summed over workers
  double starved_s = 0.0;       // waiting on the input ring
  double blocked_s = 0.0;       // waiting for room downstream (or for a free slot)
  double occupancy_mean = 0.0;  // input ring, sampled ~every 50 us (worker_probe)
  std::size_t occupancy_max = 0;
  std::size_t ring_capacity = 0;  // of the input ring; 0: none (a source)
  std::uint64_t failed = 0;       // items the stage threw on (a batch: all its items)
  std::uint64_t expired = 0;      // a service's items it dropped: their deadline had passed
  // The workers' thread CPU time (read every ~10 ms of their work, and when they end);
  // 0: not read. Over busy_s: how much of its busy time the stage ran on a CPU (a stage
  // that waits on I/O or a device in its function has little).
  double cpu_s = 0.0;
};

struct lane_report {
  std::size_t lane = 0;
  int device = 0;  // the device the lane ran on (gpu_options::devices)
  std::uint64_t batches = 0;
  std::uint64_t items = 0;
  double h2d_s = 0.0;
  double compute_s = 0.0;
  double d2h_s = 0.0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  double cpu_s = 0.0;  // CPU time of the lane's host threads: low while they wait asleep
  // The segment's host work on this lane, host clock: stage-in on the lane's thread,
  // stage-out on its completion thread. Each thread does one batch at a time, so each
  // over wall_s is how busy that thread was with it.
  double stage_in_s = 0.0;
  double stage_out_s = 0.0;
  double stage_out_cpu_s = 0.0;  // of stage_out_s, the completion thread's CPU time
  // The compute functor's calls on the lane's thread, host clock. An enqueue-only
  // compute takes a small share of compute_s; one that synchronizes (or launches more
  // small kernels than the device runs) takes as long as the device does.
  double enqueue_s = 0.0;
  // Batches whose compute call returned with the lane's stream already idle: the call
  // waited for the device (a synchronizing call in it), where an enqueue-only one returns
  // with its kernels still queued.
  std::uint64_t drained_batches = 0;

  // Achieved bandwidth over the time spent in that phase, bytes/s; 0 with no time.
  double h2d_bandwidth() const noexcept {
    return h2d_s > 0 ? static_cast<double>(h2d_bytes) / h2d_s : 0.0;
  }
  double d2h_bandwidth() const noexcept {
    return d2h_s > 0 ? static_cast<double>(d2h_bytes) / d2h_s : 0.0;
  }
  double busy_s() const noexcept { return h2d_s + compute_s + d2h_s; }
};

struct batch_report {
  std::size_t max_size = 0;
  double mean_size = 0.0;
  std::uint64_t batches = 0;
  std::uint64_t flushed_on_timeout = 0;  // left because max delay expired before max size
};

// A batch stage with a latency target (batch(max).target_p99(d)): what it chose over
// time and whether the items met the target. Each period is one or more of the
// controller's windows (a few dozen batches each; neighbours merge as a run grows).
struct latency_target_period {
  double start_s = 0.0;  // since the run started
  double end_s = 0.0;
  std::uint64_t windows = 0;
  std::uint64_t windows_met = 0;
  std::uint64_t batches = 0;  // batches whose results came back in it
  double mean_size = 0.0;     // their mean size
  std::size_t largest = 0;    // the largest batch cut
  double mean_wait_s = 0.0;   // the wait budget the batches had at their first item
  double observed_s = 0.0;    // the items' latency at the percentile (merged: the worst)
  double slack = 0.0;         // the controller's budget factor at the end, (0, 1]
};

struct latency_target_report {
  std::string stage;  // the batch stage's name
  double target_s = 0.0;
  double percentile = 99.0;       // 99: target_p99, 95: target_p95
  std::uint64_t windows = 0;      // the controller's windows so far
  std::uint64_t windows_met = 0;  // of them, those whose latency at the percentile met it
  bool met = false;               // at least 95% of the windows met it
  std::string reason;             // why windows missed (the last miss); empty: none did
  std::vector<latency_target_period> history;  // oldest first
};

struct latency_report {
  double p50_s = 0.0;
  double p95_s = 0.0;
  double p99_s = 0.0;
  double max_s = 0.0;
  double mean_s = 0.0;
  // Items the figures stand for: a source pipeline times a sample of its items, each
  // recorded with its sampling period as its weight (see detail::latency_sample_weight),
  // so over a whole run this is about the items completed.
  std::uint64_t count = 0;
};

// Where the stage threads ran (pipeline_options::placement), and how often the placer
// had them pinned: after how many of its rounds so far (automatic pins only while the
// pipeline alone fills the cores; by_load always; os never runs a placer).
struct placement_report {
  std::string mode;  // "os", "automatic" or "by_load"; empty: not told (a report built by hand)
  std::uint64_t rounds = 0;
  std::uint64_t pinned_rounds = 0;
};

struct verdict {
  verdict_kind kind = verdict_kind::idle;
  std::string stage;    // the bottleneck stage's name; empty when none (idle, balanced)
  std::string summary;  // what the numbers say, with the numbers
  std::string advice;   // the knob to turn
};

// The verdict of one period of a run (the timeline), with the CPU shares of that period.
struct verdict_period {
  double start_s = 0.0;  // since the run started
  double end_s = 0.0;
  conveyor::metrics::verdict verdict;
  double process_cpu_load = 0.0;  // this process's CPU time over the period x cpus
  double other_cpu_load = -1.0;   // other processes' share of those CPUs; < 0: unknown
};

struct report {
  double wall_s = 0.0;
  std::uint64_t produced = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;
  std::uint64_t cancelled = 0;
  std::uint64_t expired = 0;         // a service's items whose deadline passed first
  double throughput = 0.0;           // completed items per second of wall time
  std::vector<stage_report> stages;  // in pipeline order
  std::vector<lane_report> lanes;
  // Union of the lanes' compute intervals / wall; with several devices, the mean of
  // theirs (each device's below).
  double gpu_busy_fraction = 0.0;
  struct device_busy {
    int device = 0;
    double busy_fraction = 0.0;  // union of its lanes' compute intervals / wall
  };
  std::vector<device_busy> devices;  // one per device the lanes ran on
  std::optional<batch_report> batching;
  std::optional<latency_target_report> latency_target;  // a batch stage with a target
  latency_report item_latency;                          // submit (source) -> result (sink)
  latency_report batch_latency;
  conveyor::metrics::verdict verdict;
  std::string runtime;  // "host" or "cuda"
  // The CPUs the process may run on, and the CPU time all its threads (the pipeline's
  // and any others) used over wall_s; 0 when not measured.
  std::size_t cpus = 0;
  double process_cpu_s = 0.0;
  // The same CPUs as /proc/stat counts them, every process included: their time over
  // the run (about wall_s x cpus) and the part of it they were busy. 0: not measured.
  double machine_cpu_s = 0.0;
  double machine_busy_cpu_s = 0.0;
  placement_report placement;
  // The first failures (up to failure_log::kept: stage, item, message), and how many
  // there were in all (each stage's own count is stage_report::failed).
  std::vector<failure_record> errors;
  std::uint64_t errors_total = 0;
  // Per period of the run, oldest first (bounded: adjacent periods merge as it grows);
  // empty for a run shorter than one period or a report built by hand.
  std::vector<verdict_period> timeline;

  // Defined in the library: a program that runs a pipeline does not compile them again.
  report();
  report(const report&);
  report(report&&) noexcept;
  report& operator=(const report&);
  report& operator=(report&&) noexcept;
  ~report();

  // Items produced but neither completed, failed, cancelled nor expired (non-zero mid-run
  // only).
  std::uint64_t in_flight() const noexcept {
    const std::uint64_t done = completed + failed + cancelled + expired;
    return produced > done ? produced - done : 0;
  }
};

// ---- builders from the counters ----------------------------------------------------

stage_report make_stage_report(std::string name, stage_kind kind, std::size_t workers,
                               const stage_counters& c, std::size_t ring_capacity);
stage_report make_stage_report(std::string name, stage_kind kind, const stage_stats& stats,
                               std::size_t ring_capacity);
lane_report make_lane_report(std::size_t lane, const lane_counters& c);
std::vector<lane_report> make_lane_reports(const gpu_stats& gpu);
batch_report make_batch_report(const batch_counters& c);
// run_start_ns: the run's start on the now_ns() clock (the periods' times count from it).
latency_target_report make_latency_target_report(std::string stage,
                                                 const latency_target_counters& c,
                                                 std::int64_t run_start_ns);
latency_report make_latency_report(const latency_histogram& h);

// ---- fractions of capacity (what the table prints and the verdict reads) ----------

// share of wall_s * workers; 0 when there is no time.
inline double fraction_of_capacity(double seconds, double wall_s, std::size_t workers) noexcept {
  const double cap = wall_s * static_cast<double>(workers == 0 ? 1 : workers);
  return cap > 0.0 ? seconds / cap : 0.0;
}
inline double busy_fraction(const stage_report& s, double wall_s) noexcept {
  return fraction_of_capacity(s.busy_s, wall_s, s.workers);
}
inline double starved_fraction(const stage_report& s, double wall_s) noexcept {
  return fraction_of_capacity(s.starved_s, wall_s, s.workers);
}
inline double blocked_fraction(const stage_report& s, double wall_s) noexcept {
  return fraction_of_capacity(s.blocked_s, wall_s, s.workers);
}
// Process CPU time over wall_s * cpus: how much of the machine (what this process may
// use of it) was busy. 0 when not measured.
inline double process_cpu_load(const report& r) noexcept {
  return r.cpus == 0 ? 0.0 : fraction_of_capacity(r.process_cpu_s, r.wall_s, r.cpus);
}
// Every process's CPU time on the process's CPUs over their time (/proc/stat), in
// [0, 1]; < 0 when not measured.
double machine_cpu_load(const report& r) noexcept;
// The share of the process's CPUs that other processes took: machine less process load;
// < 0 when not measured.
double other_cpu_load(const report& r) noexcept;
// Lanes' stream time (H2D + compute + D2H) over wall_s * lanes: how much of the time
// the lanes' streams had work. 0 without lanes.
double lane_busy_fraction(const report& r) noexcept;

// ---- the table and JSON ------------------------------------------------------------

// The table, the verdict and the advice, written in one piece (lines from other threads
// do not interleave).
std::ostream& operator<<(std::ostream& os, const report& r);

// Every field of the report under its C++ name; enums as their to_string() names;
// batching is null when absent; non-finite numbers are null.
std::string to_json(const report& r);

}  // namespace conveyor::metrics

namespace conveyor {
// The report is public vocabulary: conveyor::report, conveyor::verdict_kind, ...
using metrics::batch_report;
using metrics::lane_report;
using metrics::latency_report;
using metrics::latency_target_period;
using metrics::latency_target_report;
using metrics::report;
using metrics::stage_kind;
using metrics::stage_report;
using metrics::verdict;
using metrics::verdict_kind;
using metrics::verdict_period;
}  // namespace conveyor
