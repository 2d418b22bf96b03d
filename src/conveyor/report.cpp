// src/conveyor/report.cpp: the report's builders, its table and its JSON
// (conveyor/report/report.hpp).
#include "conveyor/report/report.hpp"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "json_writer.hpp"

namespace conveyor::metrics {

report::report() = default;
report::report(const report&) = default;
report::report(report&&) noexcept = default;
report& report::operator=(const report&) = default;
report& report::operator=(report&&) noexcept = default;
report::~report() = default;

namespace {

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}
std::string pad(std::string s, std::size_t w, bool left = false) {
  if (s.size() >= w) return s;
  return left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}
std::string pct(double f) { return fmt("%.1f", 100.0 * f); }
std::string ms(double s) { return fmt("%.3f", 1e3 * s); }
std::string num(std::uint64_t v) { return std::to_string(v); }

}  // namespace

std::string_view to_string(verdict_kind k) noexcept {
  switch (k) {
    case verdict_kind::idle:
      return "idle";
    case verdict_kind::cpu_stage_bound:
      return "cpu_stage_bound";
    case verdict_kind::transfer_bound_h2d:
      return "transfer_bound_h2d";
    case verdict_kind::transfer_bound_d2h:
      return "transfer_bound_d2h";
    case verdict_kind::compute_bound:
      return "compute_bound";
    case verdict_kind::under_batched:
      return "under_batched";
    case verdict_kind::source_bound:
      return "source_bound";
    case verdict_kind::sink_bound:
      return "sink_bound";
    case verdict_kind::balanced:
      return "balanced";
    case verdict_kind::unmeasured:
      return "unmeasured";
  }
  return "?";
}

stage_report make_stage_report(std::string name, stage_kind kind, std::size_t workers,
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
  s.cpu_s = ns_to_s(c.cpu_ns);
  return s;
}

stage_report make_stage_report(std::string name, stage_kind kind, const stage_stats& stats,
                               std::size_t ring_capacity) {
  stage_report s =
      make_stage_report(std::move(name), kind, stats.workers(), stats.snapshot(), ring_capacity);
  s.failed = stats.failed();
  s.expired = stats.expired();
  return s;
}

lane_report make_lane_report(std::size_t lane, const lane_counters& c) {
  lane_report l;
  l.lane = lane;
  l.batches = c.batches;
  l.items = c.items;
  l.h2d_s = ns_to_s(c.h2d_ns);
  l.compute_s = ns_to_s(c.compute_ns);
  l.d2h_s = ns_to_s(c.d2h_ns);
  l.h2d_bytes = c.h2d_bytes;
  l.d2h_bytes = c.d2h_bytes;
  l.cpu_s = ns_to_s(c.cpu_ns);
  l.stage_in_s = ns_to_s(c.stage_in_ns);
  l.enqueue_s = ns_to_s(c.enqueue_ns);
  l.drained_batches = c.drained_batches;
  l.stage_out_s = ns_to_s(c.stage_out_ns);
  l.stage_out_cpu_s = ns_to_s(c.stage_out_cpu_ns);
  return l;
}

std::vector<lane_report> make_lane_reports(const gpu_stats& gpu) {
  std::vector<lane_report> out;
  out.reserve(gpu.lanes());
  for (std::size_t i = 0; i < gpu.lanes(); ++i) {
    out.push_back(make_lane_report(i, gpu.lane(i).snapshot()));
    out.back().device = gpu.device_of(i);
  }
  return out;
}

batch_report make_batch_report(const batch_counters& c) {
  return batch_report{c.max_size, c.mean_size(), c.batches, c.flushed_on_timeout};
}

namespace {

// Why windows missed the target, in words, from the last missed window's numbers.
std::string miss_reason(const latency_target_counters& c) {
  const target_miss_cause& m = c.last_miss;
  const std::string p = fmt("P%.0f", 100.0 * c.quantile);
  const auto msec = [](std::int64_t ns) {
    return fmt("%.2f", static_cast<double>(ns) * 1e-6) + " ms";
  };
  switch (m.kind) {
    case target_miss::none:
      return {};
    case target_miss::infeasible:
      return "the stages after the batch alone need " + msec(m.service_one_ns) +
             " per batch of 1, and items take " + msec(m.upstream_ns) +
             " to reach the batch: together above the target of " + msec(c.target_ns) +
             "; no wait or batch size meets it (make those stages faster, or set a longer "
             "target)";
    case target_miss::at_capacity:
      return "batches left full (mean size " + fmt("%.1f", m.mean_size) + ") and their items' " +
             p + " was still " + msec(m.observed_ns) +
             ": the stages after the batch are at capacity at " + fmt("%.0f", m.rate_per_s) +
             " items/s (add capacity there, or a larger max batch size)";
    case target_miss::tail:
      return "the items' " + p + " was " + msec(m.observed_ns) +
             ", longer than the measured service times predicted (queueing or variance "
             "after the batch, or before it); the wait budget was cut (mean wait " +
             msec(m.wait_ns) + ", batches of " + fmt("%.1f", m.mean_size) + ")";
  }
  return {};
}

}  // namespace

latency_target_report make_latency_target_report(std::string stage,
                                                 const latency_target_counters& c,
                                                 std::int64_t run_start_ns) {
  latency_target_report t;
  t.stage = std::move(stage);
  t.target_s = ns_to_s(c.target_ns);
  t.percentile = 100.0 * c.quantile;
  t.windows = c.windows;
  t.windows_met = c.windows_met;
  t.met = c.windows != 0 && 20 * c.windows_met >= 19 * c.windows;
  if (c.windows_met != c.windows) t.reason = miss_reason(c);
  for (const target_window& w : c.history) {
    latency_target_period p;
    p.start_s = ns_to_s(w.start_ns - run_start_ns);
    p.end_s = ns_to_s(w.end_ns - run_start_ns);
    p.windows = w.windows;
    p.windows_met = w.windows_met;
    p.batches = w.batches;
    p.mean_size = w.mean_size();
    p.largest = w.largest;
    p.mean_wait_s = w.mean_wait_ns() * 1e-9;
    p.observed_s = ns_to_s(w.observed_ns);
    p.slack = w.slack;
    t.history.push_back(p);
  }
  return t;
}

latency_report make_latency_report(const latency_histogram& h) {
  latency_report l;
  l.p50_s = ns_to_s(h.percentile(50.0));
  l.p95_s = ns_to_s(h.percentile(95.0));
  l.p99_s = ns_to_s(h.percentile(99.0));
  l.max_s = ns_to_s(h.max());
  l.mean_s = h.mean() * 1e-9;
  l.count = h.count();
  return l;
}

double machine_cpu_load(const report& r) noexcept {
  return r.machine_cpu_s > 0.0 ? std::min(r.machine_busy_cpu_s / r.machine_cpu_s, 1.0) : -1.0;
}

double other_cpu_load(const report& r) noexcept {
  const double machine = machine_cpu_load(r);
  return machine < 0.0 ? -1.0 : std::max(machine - process_cpu_load(r), 0.0);
}

double lane_busy_fraction(const report& r) noexcept {
  double busy = 0.0;
  for (const auto& l : r.lanes) busy += l.busy_s();
  return r.lanes.empty() ? 0.0 : fraction_of_capacity(busy, r.wall_s, r.lanes.size());
}

std::ostream& operator<<(std::ostream& os, const report& r) {
  std::ostringstream o;  // one write at the end: lines from other threads do not interleave
  o << "conveyor report: " << fmt("%.3f", r.wall_s) << " s wall"
    << (r.runtime.empty() ? std::string{} : ", " + r.runtime + " runtime") << '\n';
  o << "  items: produced " << r.produced << ", completed " << r.completed << ", failed "
    << r.failed << ", cancelled " << r.cancelled;
  if (r.expired != 0) o << ", expired " << r.expired;
  if (r.in_flight() != 0) o << ", in flight " << r.in_flight();
  o << "\n  throughput: " << fmt("%.1f", r.throughput) << " items/s";
  if (!r.lanes.empty()) o << ", GPU busy " << pct(r.gpu_busy_fraction) << "%";
  if (r.devices.size() > 1) {
    o << " (";
    for (std::size_t d = 0; d < r.devices.size(); ++d)
      o << (d == 0 ? "" : ", ") << "device " << r.devices[d].device << ": "
        << pct(r.devices[d].busy_fraction) << "%";
    o << ")";
  }
  o << '\n';
  if (r.cpus != 0)
    o << "  CPU: the process kept " << fmt("%.2f", r.wall_s > 0 ? r.process_cpu_s / r.wall_s : 0.0)
      << " of its " << r.cpus << (r.cpus == 1 ? " core" : " cores") << " busy ("
      << pct(process_cpu_load(r)) << "%)"
      << (other_cpu_load(r) >= 0.0
              ? ", other processes " + pct(other_cpu_load(r)) + "% of them (machine " +
                    pct(machine_cpu_load(r)) + "% busy)"
              : std::string{})
      << '\n';
  if (!r.placement.mode.empty()) {
    o << "  placement: " << r.placement.mode;
    if (r.placement.mode != "os")
      o << ", stage threads pinned after " << r.placement.pinned_rounds << " of "
        << r.placement.rounds << (r.placement.rounds == 1 ? " round" : " rounds");
    o << '\n';
  }

  if (!r.stages.empty()) {
    o << "  " << pad("stage", 18, true) << pad("kind", 8, true) << pad("workers", 8)
      << pad("items", 12) << pad("busy%", 8) << pad("starved%", 10) << pad("blocked%", 10)
      << "  ring mean/max/cap\n";
    for (const auto& s : r.stages) {
      o << "  " << pad(s.name, 18, true) << pad(std::string(to_string(s.kind)), 8, true)
        << pad(num(s.workers), 8) << pad(num(s.items), 12)
        << pad(pct(busy_fraction(s, r.wall_s)), 8) << pad(pct(starved_fraction(s, r.wall_s)), 10)
        << pad(pct(blocked_fraction(s, r.wall_s)), 10) << "  ";
      if (s.ring_capacity == 0) {
        o << '-';
      } else {
        o << fmt("%.1f", s.occupancy_mean) << '/' << s.occupancy_max << '/' << s.ring_capacity;
      }
      if (s.kind == stage_kind::gpu && !r.lanes.empty())
        o << "  (lanes' streams busy " << pct(lane_busy_fraction(r)) << "%)";
      if (s.failed != 0) o << "  failed " << s.failed;
      if (s.expired != 0) o << "  expired " << s.expired;
      o << '\n';
    }
  }
  if (!r.lanes.empty()) {
    o << "  " << pad("lane", 6, true) << pad("device", 8) << pad("batches", 9) << pad("items", 12)
      << pad("H2D ms", 12) << pad("compute ms", 12) << pad("D2H ms", 12) << pad("H2D GB/s", 10)
      << pad("D2H GB/s", 10) << pad("stage-in ms", 13) << pad("enqueue ms", 12)
      << pad("stage-out ms", 14) << pad("CPU ms", 10) << '\n';
    for (const auto& l : r.lanes) {
      o << "  " << pad(num(l.lane), 6, true) << pad(std::to_string(l.device), 8)
        << pad(num(l.batches), 9) << pad(num(l.items), 12) << pad(ms(l.h2d_s), 12)
        << pad(ms(l.compute_s), 12) << pad(ms(l.d2h_s), 12)
        << pad(fmt("%.2f", l.h2d_bandwidth() * 1e-9), 10)
        << pad(fmt("%.2f", l.d2h_bandwidth() * 1e-9), 10) << pad(ms(l.stage_in_s), 13)
        << pad(ms(l.enqueue_s), 12) << pad(ms(l.stage_out_s), 14) << pad(ms(l.cpu_s), 10) << '\n';
    }
  }
  if (r.batching) {
    const batch_report& b = *r.batching;
    o << "  batching: " << b.batches << " batches, mean size " << fmt("%.1f", b.mean_size)
      << " of max " << b.max_size << ", " << b.flushed_on_timeout << " left on timeout";
    if (b.batches != 0)
      o << " (" << pct(static_cast<double>(b.flushed_on_timeout) / static_cast<double>(b.batches))
        << "%)";
    o << '\n';
  }
  if (r.latency_target) {
    const latency_target_report& t = *r.latency_target;
    o << "  latency target ('" << t.stage << "'): P" << fmt("%.0f", t.percentile)
      << " <= " << ms(t.target_s) << " ms, met in " << t.windows_met << " of " << t.windows
      << " windows";
    if (t.windows != 0)
      o << " (" << pct(static_cast<double>(t.windows_met) / static_cast<double>(t.windows))
        << "%): " << (t.met ? "met" : "missed");
    o << '\n';
    // At most table_rows rows: neighbouring periods merge (the JSON has them all).
    constexpr std::size_t table_rows = 8;
    std::vector<latency_target_period> rows;
    const std::size_t per_row = (t.history.size() + table_rows - 1) / table_rows;
    for (std::size_t i = 0; i < t.history.size(); i += per_row) {
      latency_target_period m = t.history[i];
      double size_sum = m.mean_size * static_cast<double>(m.batches);
      double wait_sum = m.mean_wait_s * static_cast<double>(m.windows);
      for (std::size_t k = i + 1; k < std::min(i + per_row, t.history.size()); ++k) {
        const latency_target_period& w = t.history[k];
        m.end_s = w.end_s;
        m.windows += w.windows;
        m.windows_met += w.windows_met;
        m.batches += w.batches;
        size_sum += w.mean_size * static_cast<double>(w.batches);
        wait_sum += w.mean_wait_s * static_cast<double>(w.windows);
        m.largest = std::max(m.largest, w.largest);
        m.observed_s = std::max(m.observed_s, w.observed_s);
        m.slack = w.slack;
      }
      m.mean_size = m.batches == 0 ? 0.0 : size_sum / static_cast<double>(m.batches);
      m.mean_wait_s = m.windows == 0 ? 0.0 : wait_sum / static_cast<double>(m.windows);
      rows.push_back(m);
    }
    if (!rows.empty()) {
      const std::string p = "P" + fmt("%.0f", t.percentile) + " ms";
      o << "    " << pad("time s", 14, true) << pad("batches", 9) << pad("mean size", 11)
        << pad("largest", 9) << pad("wait ms", 10) << pad(p, 10) << pad("slack", 7)
        << pad("windows met", 13) << '\n';
      for (const latency_target_period& w : rows)
        o << "    " << pad(fmt("%.2f", w.start_s) + "-" + fmt("%.2f", w.end_s), 14, true)
          << pad(num(w.batches), 9) << pad(fmt("%.1f", w.mean_size), 11) << pad(num(w.largest), 9)
          << pad(ms(w.mean_wait_s), 10) << pad(ms(w.observed_s), 10) << pad(fmt("%.2f", w.slack), 7)
          << pad(num(w.windows_met) + "/" + num(w.windows), 13) << '\n';
    }
    if (!t.reason.empty()) o << "    missed: " << t.reason << '\n';
  }
  o << "  " << pad("latency ms", 12, true) << pad("p50", 10) << pad("p95", 10) << pad("p99", 10)
    << pad("max", 10) << pad("mean", 10) << pad("count", 12) << '\n';
  const auto lat_row = [&](const char* label, const latency_report& l) {
    o << "  " << pad(label, 12, true) << pad(ms(l.p50_s), 10) << pad(ms(l.p95_s), 10)
      << pad(ms(l.p99_s), 10) << pad(ms(l.max_s), 10) << pad(ms(l.mean_s), 10)
      << pad(num(l.count), 12) << '\n';
  };
  lat_row("item", r.item_latency);
  if (r.batch_latency.count != 0) lat_row("batch", r.batch_latency);
  if (r.errors_total != 0) {
    o << "  errors: " << r.errors_total;
    if (r.errors.size() < r.errors_total) o << " (the first " << r.errors.size() << ")";
    o << '\n';
    for (const failure_record& f : r.errors)
      o << "    stage '" << f.stage << "', item " << f.item << ": " << f.message << '\n';
  }
  if (!r.timeline.empty()) {
    // Consecutive periods with the same verdict print as one.
    o << "  timeline:";
    for (std::size_t i = 0; i < r.timeline.size();) {
      const verdict_period& first = r.timeline[i];
      std::size_t j = i + 1;
      while (j < r.timeline.size() && r.timeline[j].verdict.kind == first.verdict.kind &&
             r.timeline[j].verdict.stage == first.verdict.stage)
        ++j;
      o << (i == 0 ? " " : "; ") << fmt("%.2f", first.start_s) << '-'
        << fmt("%.2f", r.timeline[j - 1].end_s) << " s " << to_string(first.verdict.kind);
      if (!first.verdict.stage.empty()) o << " '" << first.verdict.stage << "'";
      i = j;
    }
    o << '\n';
  }
  o << "verdict: " << to_string(r.verdict.kind);
  if (!r.verdict.stage.empty()) o << " ('" << r.verdict.stage << "')";
  if (!r.verdict.summary.empty()) o << ": " << r.verdict.summary;
  o << '\n';
  if (!r.verdict.advice.empty()) o << "advice: " << r.verdict.advice << '\n';
  return os << o.str();
}

// ---- JSON --------------------------------------------------------------------------

namespace {

void write_latency(detail::json_writer& j, std::string_view name, const latency_report& l) {
  j.key(name).begin_object();
  j.field("p50_s", l.p50_s).field("p95_s", l.p95_s).field("p99_s", l.p99_s);
  j.field("max_s", l.max_s).field("mean_s", l.mean_s).field("count", l.count);
  j.end_object();
}

void write_verdict(detail::json_writer& j, std::string_view name, const verdict& v) {
  j.key(name).begin_object();
  j.field("kind", to_string(v.kind)).field("stage", v.stage);
  j.field("summary", v.summary).field("advice", v.advice);
  j.end_object();
}

}  // namespace

std::string to_json(const report& r) {
  std::ostringstream o;
  detail::json_writer j{o};
  j.begin_object();
  j.field("wall_s", r.wall_s).field("produced", r.produced).field("completed", r.completed);
  j.field("failed", r.failed).field("cancelled", r.cancelled).field("expired", r.expired);
  j.field("throughput", r.throughput);
  j.field("runtime", r.runtime).field("cpus", r.cpus).field("process_cpu_s", r.process_cpu_s);
  j.field("machine_cpu_s", r.machine_cpu_s).field("machine_busy_cpu_s", r.machine_busy_cpu_s);
  j.key("placement").begin_object();
  j.field("mode", r.placement.mode).field("rounds", r.placement.rounds);
  j.field("pinned_rounds", r.placement.pinned_rounds);
  j.end_object();
  j.key("stages").begin_array();
  for (const stage_report& s : r.stages) {
    j.begin_object();
    j.field("name", s.name).field("kind", to_string(s.kind)).field("workers", s.workers);
    j.field("items", s.items).field("busy_s", s.busy_s).field("starved_s", s.starved_s);
    j.field("blocked_s", s.blocked_s).field("occupancy_mean", s.occupancy_mean);
    j.field("occupancy_max", s.occupancy_max).field("ring_capacity", s.ring_capacity);
    j.field("failed", s.failed).field("expired", s.expired);
    j.field("cpu_s", s.cpu_s);
    j.end_object();
  }
  j.end_array();
  j.key("lanes").begin_array();
  for (const lane_report& l : r.lanes) {
    j.begin_object();
    j.field("lane", l.lane).field("device", l.device).field("batches", l.batches);
    j.field("items", l.items);
    j.field("h2d_s", l.h2d_s).field("compute_s", l.compute_s).field("d2h_s", l.d2h_s);
    j.field("h2d_bytes", l.h2d_bytes).field("d2h_bytes", l.d2h_bytes);
    j.field("stage_in_s", l.stage_in_s).field("stage_out_s", l.stage_out_s);
    j.field("stage_out_cpu_s", l.stage_out_cpu_s).field("enqueue_s", l.enqueue_s);
    j.field("drained_batches", l.drained_batches);
    j.field("cpu_s", l.cpu_s);
    j.end_object();
  }
  j.end_array();
  j.field("gpu_busy_fraction", r.gpu_busy_fraction);
  j.key("devices").begin_array();
  for (const auto& d : r.devices) {
    j.begin_object();
    j.field("device", d.device).field("busy_fraction", d.busy_fraction);
    j.end_object();
  }
  j.end_array();
  j.key("batching");
  if (r.batching) {
    const batch_report& b = *r.batching;
    j.begin_object();
    j.field("max_size", b.max_size).field("mean_size", b.mean_size).field("batches", b.batches);
    j.field("flushed_on_timeout", b.flushed_on_timeout);
    j.end_object();
  } else {
    j.null();
  }
  j.key("latency_target");
  if (r.latency_target) {
    const latency_target_report& t = *r.latency_target;
    j.begin_object();
    j.field("stage", t.stage).field("target_s", t.target_s).field("percentile", t.percentile);
    j.field("windows", t.windows).field("windows_met", t.windows_met).field("met", t.met);
    j.field("reason", t.reason);
    j.key("history").begin_array();
    for (const latency_target_period& w : t.history) {
      j.begin_object();
      j.field("start_s", w.start_s).field("end_s", w.end_s).field("windows", w.windows);
      j.field("windows_met", w.windows_met).field("batches", w.batches);
      j.field("mean_size", w.mean_size).field("largest", w.largest);
      j.field("mean_wait_s", w.mean_wait_s).field("observed_s", w.observed_s);
      j.field("slack", w.slack);
      j.end_object();
    }
    j.end_array();
    j.end_object();
  } else {
    j.null();
  }
  j.field("errors_total", r.errors_total);
  j.key("errors").begin_array();
  for (const failure_record& f : r.errors) {
    j.begin_object();
    j.field("stage", f.stage).field("item", f.item).field("message", f.message);
    j.end_object();
  }
  j.end_array();
  write_latency(j, "item_latency", r.item_latency);
  write_latency(j, "batch_latency", r.batch_latency);
  write_verdict(j, "verdict", r.verdict);
  j.key("timeline").begin_array();
  for (const verdict_period& p : r.timeline) {
    j.begin_object();
    j.field("start_s", p.start_s).field("end_s", p.end_s);
    j.field("process_cpu_load", p.process_cpu_load).field("other_cpu_load", p.other_cpu_load);
    write_verdict(j, "verdict", p.verdict);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return o.str();
}

}  // namespace conveyor::metrics
