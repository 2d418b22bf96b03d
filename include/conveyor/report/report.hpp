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
//   lanes    one lane_report per lane (make_lane_reports(gpu_stats)).
//   gpu_busy_fraction   gpu_stats::compute_busy_ns() / wall: union over lanes.
//   batching make_batch_report(batch_stats) when the pipeline batches, else nullopt.
//   *_latency make_latency_report(histogram).
//   cpus, process_cpu_s   the usable CPUs and the process's CPU time over the run.
//   placement   the placement mode and the placer's rounds (pinned / all).
//   then complete_report(r) (verdict.hpp): throughput and verdict.
//
// Thread-safety: plain values. The make_* builders read counters from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/counters/batch_stats.hpp"
#include "conveyor/base/clock.hpp"
#include "conveyor/report/detail/json.hpp"
#include "conveyor/counters/histogram.hpp"
#include "conveyor/counters/lane_stats.hpp"
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

inline std::string_view to_string(verdict_kind k) noexcept {
  switch (k) {
    case verdict_kind::idle: return "idle";
    case verdict_kind::cpu_stage_bound: return "cpu_stage_bound";
    case verdict_kind::transfer_bound_h2d: return "transfer_bound_h2d";
    case verdict_kind::transfer_bound_d2h: return "transfer_bound_d2h";
    case verdict_kind::compute_bound: return "compute_bound";
    case verdict_kind::under_batched: return "under_batched";
    case verdict_kind::source_bound: return "source_bound";
    case verdict_kind::sink_bound: return "sink_bound";
    case verdict_kind::balanced: return "balanced";
    case verdict_kind::unmeasured: return "unmeasured";
  }
  return "?";
}

struct stage_report {
  std::string name;
  stage_kind kind = stage_kind::map;
  std::size_t workers = 1;
  std::uint64_t items = 0;  // items (a batch counts its items) that left the stage
  double busy_s = 0.0;      // summed over workers
  double starved_s = 0.0;   // waiting on the input ring
  double blocked_s = 0.0;   // waiting for room downstream (or for a free slot)
  double occupancy_mean = 0.0;    // input ring, sampled ~every 50 us (worker_probe)
  std::size_t occupancy_max = 0;
  std::size_t ring_capacity = 0;  // of the input ring; 0: none (a source)
};

struct lane_report {
  std::size_t lane = 0;
  std::uint64_t batches = 0;
  std::uint64_t items = 0;
  double h2d_s = 0.0;
  double compute_s = 0.0;
  double d2h_s = 0.0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;

  // Achieved bandwidth over the time spent in that phase, bytes/s; 0 with no time.
  double h2d_bandwidth() const noexcept { return h2d_s > 0 ? static_cast<double>(h2d_bytes) / h2d_s : 0.0; }
  double d2h_bandwidth() const noexcept { return d2h_s > 0 ? static_cast<double>(d2h_bytes) / d2h_s : 0.0; }
  double busy_s() const noexcept { return h2d_s + compute_s + d2h_s; }
};

struct batch_report {
  std::size_t max_size = 0;
  double mean_size = 0.0;
  std::uint64_t batches = 0;
  std::uint64_t flushed_on_timeout = 0;  // left because max delay expired before max size
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

struct report {
  double wall_s = 0.0;
  std::uint64_t produced = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;
  std::uint64_t cancelled = 0;
  double throughput = 0.0;            // completed items per second of wall time
  std::vector<stage_report> stages;   // in pipeline order
  std::vector<lane_report> lanes;
  double gpu_busy_fraction = 0.0;     // union of the lanes' compute intervals / wall
  std::optional<batch_report> batching;
  latency_report item_latency;        // submit (source) -> result (sink)
  latency_report batch_latency;
  conveyor::metrics::verdict verdict;
  std::string runtime;                // "host" or "cuda"
  // The CPUs the process may run on, and the CPU time all its threads (the pipeline's
  // and any others) used over wall_s; 0 when not measured.
  std::size_t cpus = 0;
  double process_cpu_s = 0.0;
  placement_report placement;

  // Items produced but neither completed, failed nor cancelled (non-zero mid-run only).
  std::uint64_t in_flight() const noexcept {
    const std::uint64_t done = completed + failed + cancelled;
    return produced > done ? produced - done : 0;
  }
};

// ---- builders from the counters ----------------------------------------------------

inline stage_report make_stage_report(std::string name, stage_kind kind, std::size_t workers,
                                      const stage_counters& c, std::size_t ring_capacity) {
  stage_report s;
  s.name = std::move(name);
  s.kind = kind;
  s.workers = workers;
  s.items = c.items;
  s.busy_s = ns_to_s(c.busy_ns);
  s.starved_s = ns_to_s(c.starved_ns);
  s.blocked_s = ns_to_s(c.blocked_ns);
  s.occupancy_mean = c.occupancy_mean();
  s.occupancy_max = static_cast<std::size_t>(c.occupancy_max);
  s.ring_capacity = ring_capacity;
  return s;
}

inline stage_report make_stage_report(std::string name, stage_kind kind, const stage_stats& stats,
                                      std::size_t ring_capacity) {
  return make_stage_report(std::move(name), kind, stats.workers(), stats.snapshot(), ring_capacity);
}

inline lane_report make_lane_report(std::size_t lane, const lane_counters& c) {
  lane_report l;
  l.lane = lane;
  l.batches = c.batches;
  l.items = c.items;
  l.h2d_s = ns_to_s(c.h2d_ns);
  l.compute_s = ns_to_s(c.compute_ns);
  l.d2h_s = ns_to_s(c.d2h_ns);
  l.h2d_bytes = c.h2d_bytes;
  l.d2h_bytes = c.d2h_bytes;
  return l;
}

inline std::vector<lane_report> make_lane_reports(const gpu_stats& gpu) {
  std::vector<lane_report> out;
  out.reserve(gpu.lanes());
  for (std::size_t i = 0; i < gpu.lanes(); ++i) out.push_back(make_lane_report(i, gpu.lane(i).snapshot()));
  return out;
}

inline batch_report make_batch_report(const batch_counters& c) {
  return batch_report{c.max_size, c.mean_size(), c.batches, c.flushed_on_timeout};
}

inline latency_report make_latency_report(const latency_histogram& h) {
  latency_report l;
  l.p50_s = ns_to_s(h.percentile(50.0));
  l.p95_s = ns_to_s(h.percentile(95.0));
  l.p99_s = ns_to_s(h.percentile(99.0));
  l.max_s = ns_to_s(h.max());
  l.mean_s = h.mean() * 1e-9;
  l.count = h.count();
  return l;
}

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
// Lanes' stream time (H2D + compute + D2H) over wall_s * lanes: how much of the time
// the lanes' streams had work. 0 without lanes.
inline double lane_busy_fraction(const report& r) noexcept {
  double busy = 0.0;
  for (const auto& l : r.lanes) busy += l.busy_s();
  return r.lanes.empty() ? 0.0 : fraction_of_capacity(busy, r.wall_s, r.lanes.size());
}

// ---- the table ---------------------------------------------------------------------

}  // namespace conveyor::metrics

namespace conveyor::detail::report_text {
inline std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}
inline std::string pad(std::string s, std::size_t w, bool left = false) {
  if (s.size() >= w) return s;
  return left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}
inline std::string pct(double f) { return fmt("%.1f", 100.0 * f); }
inline std::string ms(double s) { return fmt("%.3f", 1e3 * s); }
inline std::string num(std::uint64_t v) { return std::to_string(v); }
}  // namespace conveyor::detail::report_text

namespace conveyor::metrics {

inline std::ostream& operator<<(std::ostream& os, const report& r) {
  namespace d = ::conveyor::detail::report_text;
  std::ostringstream o;  // one write at the end: lines from other threads do not interleave
  o << "conveyor report: " << d::fmt("%.3f", r.wall_s) << " s wall"
    << (r.runtime.empty() ? std::string{} : ", " + r.runtime + " runtime") << '\n';
  o << "  items: produced " << r.produced << ", completed " << r.completed << ", failed "
    << r.failed << ", cancelled " << r.cancelled;
  if (r.in_flight() != 0) o << ", in flight " << r.in_flight();
  o << "\n  throughput: " << d::fmt("%.1f", r.throughput) << " items/s";
  if (!r.lanes.empty()) o << ", GPU busy " << d::pct(r.gpu_busy_fraction) << "%";
  o << '\n';
  if (r.cpus != 0)
    o << "  CPU: the process kept " << d::fmt("%.2f", r.wall_s > 0 ? r.process_cpu_s / r.wall_s : 0.0)
      << " of its " << r.cpus << (r.cpus == 1 ? " core" : " cores") << " busy ("
      << d::pct(process_cpu_load(r)) << "%)\n";
  if (!r.placement.mode.empty()) {
    o << "  placement: " << r.placement.mode;
    if (r.placement.mode != "os")
      o << ", stage threads pinned after " << r.placement.pinned_rounds << " of "
        << r.placement.rounds << (r.placement.rounds == 1 ? " round" : " rounds");
    o << '\n';
  }

  if (!r.stages.empty()) {
    o << "  " << d::pad("stage", 18, true) << d::pad("kind", 8, true) << d::pad("workers", 8)
      << d::pad("items", 12) << d::pad("busy%", 8) << d::pad("starved%", 10)
      << d::pad("blocked%", 10) << "  ring mean/max/cap\n";
    for (const auto& s : r.stages) {
      o << "  " << d::pad(s.name, 18, true) << d::pad(std::string(to_string(s.kind)), 8, true)
        << d::pad(d::num(s.workers), 8) << d::pad(d::num(s.items), 12)
        << d::pad(d::pct(busy_fraction(s, r.wall_s)), 8)
        << d::pad(d::pct(starved_fraction(s, r.wall_s)), 10)
        << d::pad(d::pct(blocked_fraction(s, r.wall_s)), 10) << "  ";
      if (s.ring_capacity == 0) {
        o << '-';
      } else {
        o << d::fmt("%.1f", s.occupancy_mean) << '/' << s.occupancy_max << '/' << s.ring_capacity;
      }
      if (s.kind == stage_kind::gpu && !r.lanes.empty())
        o << "  (lanes' streams busy " << d::pct(lane_busy_fraction(r)) << "%)";
      o << '\n';
    }
  }
  if (!r.lanes.empty()) {
    o << "  " << d::pad("lane", 6, true) << d::pad("batches", 9) << d::pad("items", 12)
      << d::pad("H2D ms", 12) << d::pad("compute ms", 12) << d::pad("D2H ms", 12)
      << d::pad("H2D GB/s", 10) << d::pad("D2H GB/s", 10) << '\n';
    for (const auto& l : r.lanes) {
      o << "  " << d::pad(d::num(l.lane), 6, true) << d::pad(d::num(l.batches), 9)
        << d::pad(d::num(l.items), 12) << d::pad(d::ms(l.h2d_s), 12)
        << d::pad(d::ms(l.compute_s), 12) << d::pad(d::ms(l.d2h_s), 12)
        << d::pad(d::fmt("%.2f", l.h2d_bandwidth() * 1e-9), 10)
        << d::pad(d::fmt("%.2f", l.d2h_bandwidth() * 1e-9), 10) << '\n';
    }
  }
  if (r.batching) {
    const batch_report& b = *r.batching;
    o << "  batching: " << b.batches << " batches, mean size " << d::fmt("%.1f", b.mean_size)
      << " of max " << b.max_size << ", " << b.flushed_on_timeout << " left on timeout";
    if (b.batches != 0)
      o << " (" << d::pct(static_cast<double>(b.flushed_on_timeout) / static_cast<double>(b.batches)) << "%)";
    o << '\n';
  }
  o << "  " << d::pad("latency ms", 12, true) << d::pad("p50", 10) << d::pad("p95", 10)
    << d::pad("p99", 10) << d::pad("max", 10) << d::pad("mean", 10) << d::pad("count", 12) << '\n';
  const auto lat_row = [&](const char* label, const latency_report& l) {
    o << "  " << d::pad(label, 12, true) << d::pad(d::ms(l.p50_s), 10) << d::pad(d::ms(l.p95_s), 10)
      << d::pad(d::ms(l.p99_s), 10) << d::pad(d::ms(l.max_s), 10) << d::pad(d::ms(l.mean_s), 10)
      << d::pad(d::num(l.count), 12) << '\n';
  };
  lat_row("item", r.item_latency);
  if (r.batch_latency.count != 0) lat_row("batch", r.batch_latency);
  o << "verdict: " << to_string(r.verdict.kind);
  if (!r.verdict.stage.empty()) o << " ('" << r.verdict.stage << "')";
  if (!r.verdict.summary.empty()) o << ": " << r.verdict.summary;
  o << '\n';
  if (!r.verdict.advice.empty()) o << "advice: " << r.verdict.advice << '\n';
  return os << o.str();
}

// ---- JSON --------------------------------------------------------------------------

// Every field of the report under its C++ name; enums as their to_string() names;
// batching is null when absent; non-finite numbers are null.
inline std::string to_json(const report& r) {
  using conveyor::detail::json_number;
  using conveyor::detail::json_string;
  std::ostringstream o;
  const auto key = [&](std::string_view k) {
    json_string(o, k);
    o << ':';
  };
  const auto dbl = [&](std::string_view k, double v) { key(k); json_number(o, v); };
  const auto u64 = [&](std::string_view k, std::uint64_t v) { key(k); json_number(o, v); };
  const auto str = [&](std::string_view k, std::string_view v) { key(k); json_string(o, v); };
  const auto lat = [&](std::string_view k, const latency_report& l) {
    key(k);
    o << '{';
    dbl("p50_s", l.p50_s); o << ',';
    dbl("p95_s", l.p95_s); o << ',';
    dbl("p99_s", l.p99_s); o << ',';
    dbl("max_s", l.max_s); o << ',';
    dbl("mean_s", l.mean_s); o << ',';
    u64("count", l.count);
    o << '}';
  };

  o << '{';
  dbl("wall_s", r.wall_s); o << ',';
  u64("produced", r.produced); o << ',';
  u64("completed", r.completed); o << ',';
  u64("failed", r.failed); o << ',';
  u64("cancelled", r.cancelled); o << ',';
  dbl("throughput", r.throughput); o << ',';
  str("runtime", r.runtime); o << ',';
  u64("cpus", r.cpus); o << ',';
  dbl("process_cpu_s", r.process_cpu_s); o << ',';
  key("placement");
  o << '{';
  str("mode", r.placement.mode); o << ',';
  u64("rounds", r.placement.rounds); o << ',';
  u64("pinned_rounds", r.placement.pinned_rounds);
  o << "},";
  key("stages");
  o << '[';
  for (std::size_t i = 0; i < r.stages.size(); ++i) {
    const stage_report& s = r.stages[i];
    if (i) o << ',';
    o << '{';
    str("name", s.name); o << ',';
    str("kind", to_string(s.kind)); o << ',';
    u64("workers", s.workers); o << ',';
    u64("items", s.items); o << ',';
    dbl("busy_s", s.busy_s); o << ',';
    dbl("starved_s", s.starved_s); o << ',';
    dbl("blocked_s", s.blocked_s); o << ',';
    dbl("occupancy_mean", s.occupancy_mean); o << ',';
    u64("occupancy_max", s.occupancy_max); o << ',';
    u64("ring_capacity", s.ring_capacity);
    o << '}';
  }
  o << "],";
  key("lanes");
  o << '[';
  for (std::size_t i = 0; i < r.lanes.size(); ++i) {
    const lane_report& l = r.lanes[i];
    if (i) o << ',';
    o << '{';
    u64("lane", l.lane); o << ',';
    u64("batches", l.batches); o << ',';
    u64("items", l.items); o << ',';
    dbl("h2d_s", l.h2d_s); o << ',';
    dbl("compute_s", l.compute_s); o << ',';
    dbl("d2h_s", l.d2h_s); o << ',';
    u64("h2d_bytes", l.h2d_bytes); o << ',';
    u64("d2h_bytes", l.d2h_bytes);
    o << '}';
  }
  o << "],";
  dbl("gpu_busy_fraction", r.gpu_busy_fraction); o << ',';
  key("batching");
  if (r.batching) {
    o << '{';
    u64("max_size", r.batching->max_size); o << ',';
    dbl("mean_size", r.batching->mean_size); o << ',';
    u64("batches", r.batching->batches); o << ',';
    u64("flushed_on_timeout", r.batching->flushed_on_timeout);
    o << '}';
  } else {
    o << "null";
  }
  o << ',';
  lat("item_latency", r.item_latency); o << ',';
  lat("batch_latency", r.batch_latency); o << ',';
  key("verdict");
  o << '{';
  str("kind", to_string(r.verdict.kind)); o << ',';
  str("stage", r.verdict.stage); o << ',';
  str("summary", r.verdict.summary); o << ',';
  str("advice", r.verdict.advice);
  o << "}}";
  return o.str();
}

}  // namespace conveyor::metrics

namespace conveyor {
// The report is public vocabulary: conveyor::report, conveyor::verdict_kind, ...
using metrics::batch_report;
using metrics::lane_report;
using metrics::latency_report;
using metrics::report;
using metrics::stage_kind;
using metrics::stage_report;
using metrics::verdict;
using metrics::verdict_kind;
}  // namespace conveyor
