// src/conveyor/pipeline_core.cpp: the type-independent part of a pipeline
// (conveyor/pipeline/detail/core.hpp): options, lifecycle, placement, report assembly.
#include "conveyor/pipeline/detail/core.hpp"

#include <algorithm>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>

#if defined(__linux__)
#include <unistd.h>  // sysconf(_SC_CLK_TCK): /proc/stat's ticks per second
#endif

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/pipeline/detail/service.hpp"
#include "conveyor/pipeline/placement.hpp"
#include "conveyor/report/progress.hpp"
#include "conveyor/report/timeline.hpp"
#include "conveyor/report/trace_export.hpp"
#include "conveyor/report/verdict.hpp"
#include "conveyor/ring/detail/storage.hpp"

namespace conveyor::detail {
namespace {

const pipeline_options& checked(const pipeline_options& o) {
  CONVEYOR_EXPECTS(o.ring_growth >= 1 && o.ring_growth <= 64 && is_power_of_two(o.ring_growth),
                   "pipeline_options: ring_growth must be a power of two in [1, 64] (1: rings "
                   "never grow), got " +
                       std::to_string(o.ring_growth) + "; 8 is the default");
  CONVEYOR_EXPECTS(o.ring_capacity <= max_ring_capacity / o.ring_growth,
                   "pipeline_options: ring_capacity x ring_growth must be <= 2^30, got " +
                       std::to_string(o.ring_capacity) + " x " + std::to_string(o.ring_growth) +
                       "; lower ring_growth (1: rings never grow)");
  CONVEYOR_EXPECTS(!o.progress || o.metrics,
                   "pipeline_options: progress needs metrics = true (the line shows "
                   "measured rates and the bottleneck)");
  CONVEYOR_EXPECTS(!o.progress || o.progress_period >= metrics::progress_line::min_period,
                   "pipeline_options: progress_period must be >= 250 ms (at most 4 "
                   "refreshes a second)");
  CONVEYOR_EXPECTS(
      o.placement == thread_placement::os || o.placement_period >= std::chrono::milliseconds(10),
      "pipeline_options: placement_period must be >= 10 ms; 200 ms is the "
      "default");
  return o;
}

// /proc/stat's ticks per second (USER_HZ); 0 where there is no /proc/stat.
double ticks_per_s() {
#if defined(__linux__)
  static const double hz = [] {
    const long v = ::sysconf(_SC_CLK_TCK);
    return v > 0 ? static_cast<double>(v) : 0.0;
  }();
  return hz;
#else
  return 0.0;
#endif
}

}  // namespace

pipeline_core::pipeline_core(const pipeline_options& options)
    : placed_(std::make_unique<thread_registry>()),
      options_(checked(options)),
      ctl_(options.metrics, options.trace_events) {
  check_ring_capacity("pipeline ring", options_.ring_capacity);
  if (options_.placement != thread_placement::os) ctl_.workers = placed_.get();
}

pipeline_core::~pipeline_core() = default;

void pipeline_core::add_stage(stage_info info) { infos_.push_back(std::move(info)); }

void pipeline_core::add_growable(std::size_t producer, box<growable_ring> ring) {
  growable_.push_back({producer, std::move(ring)});
}

void pipeline_core::start(const std::function<void(thread_group&)>& spawn) {
  if (started_) throw closed_error("conveyor::pipeline: start() called twice");
  started_ = true;
  std::vector<const metrics::stage_stats*> chain;
  chain.reserve(infos_.size());
  for (const stage_info& i : infos_) chain.push_back(i.stats);
  placed_->set_chain(std::move(chain));
  start_ns_ = now_ns();  // a placeholder should spawning throw
  spawn(threads_);       // the threads wait at the gate
  cpu_list_ = allowed_cpus();
  const std::optional<cpu_ticks> ticks = read_cpu_ticks(cpu_list_);
  start_ns_ = now_ns();
  start_cpu_ns_ = process_cpu_ns();
  if (ticks) {
    ticks_ = true;
    start_ticks_busy_ = ticks->busy;
    start_ticks_total_ = ticks->total;
  }
  ctl_.open_gate();
  if (options_.placement != thread_placement::os)
    placer_ = std::make_unique<load_placer>(
        *placed_, options_.placement_period,
        options_.placement == thread_placement::by_load ? pin_policy::always
                                                        : pin_policy::automatic,
        load_placer::shares_override{},
        // The placer is stopped (in join()) before anything it reads goes.
        [this](const chain_placement& where) { follow_placement(where); });
  // The recorder's snapshots leave the timeline out: its thread starts before timeline_
  // is set. Made before the progress line, whose reports read timeline_.
  if (ctl_.metrics_on)
    timeline_ = std::make_unique<metrics::timeline_recorder>([this] { return make_report(false); },
                                                             timeline_period);
  if (options_.progress)
    progress_ = std::make_unique<metrics::progress_line>(
        [this] { return make_report(); }, options_.progress_period,
        options_.progress_out != nullptr ? *options_.progress_out : std::cerr);
}

bool ring_deepens(const chain_placement& where, std::size_t producer,
                  std::size_t reserve) noexcept {
  const std::size_t p = producer;
  const bool turns =
      where.share_cpu(p) ||
      (where.pinned_apart(p) && ((p > 0 && where.share_cpu(p - 1)) || where.share_cpu(p + 1)));
  return turns && shared_core_grows(reserve, where.load(p + 1));
}

// After each placer round (on its thread): every ring that can grow moves to its reserve
// where ring_deepens() says so, and back elsewhere.
void pipeline_core::follow_placement(const chain_placement& where) noexcept {
  for (const growable_entry& g : growable_)
    g.ring->grow(ring_deepens(where, g.producer, g.ring->reserve()));
}

void pipeline_core::join() {
  if (joined_) return;
  threads_.join();
  if (placer_) placer_->stop();
  // Before joined_/end_ns_ change: the progress thread reads them through make_report().
  if (progress_) progress_->stop();
  // The run's last period ends with the stage threads: its report is exact.
  if (timeline_) timeline_->stop(make_report(false));
  if (const std::optional<cpu_ticks> ticks = ticks_ ? read_cpu_ticks(cpu_list_) : std::nullopt) {
    end_ticks_busy_ = ticks->busy;
    end_ticks_total_ = ticks->total;
  } else {
    ticks_ = false;
  }
  joined_ = true;
  end_ns_ = now_ns();
  end_cpu_ns_ = process_cpu_ns();
}

item_counts pipeline_core::counts() const noexcept {
  // relaxed: counters; after join they are exact, before it a recent snapshot.
  return {ctl_.produced_items(), ctl_.completed(), ctl_.failed.load(std::memory_order_relaxed),
          ctl_.cancelled.load(std::memory_order_relaxed),
          ctl_.expired.load(std::memory_order_relaxed)};
}

conveyor::report pipeline_core::make_report() const { return make_report(true); }

conveyor::report pipeline_core::make_report(bool with_timeline) const {
  conveyor::report r;
  const std::int64_t end = joined_ ? end_ns_ : now_ns();
  r.wall_s = started_ ? ns_to_s(end - start_ns_) : 0.0;
  const item_counts c = counts();
  r.produced = c.produced;
  r.completed = c.completed;
  r.failed = c.failed;
  r.cancelled = c.cancelled;
  r.expired = c.expired;
  r.errors = ctl_.failures.first();
  r.errors_total = ctl_.failures.total();
  r.runtime = "host";
  if (started_) {
    r.cpus = usable_cpus();
    const std::int64_t cpu_end = joined_ ? end_cpu_ns_ : process_cpu_ns();
    r.process_cpu_s = ns_to_s(std::max<std::int64_t>(cpu_end - start_cpu_ns_, 0));
    // Every process on the same CPUs, from /proc/stat (10 ms ticks: over a run of a
    // second on two CPUs, within 1 %).
    std::optional<cpu_ticks> ticks;
    if (joined_ && ticks_)
      ticks = cpu_ticks{end_ticks_busy_, end_ticks_total_};
    else if (!joined_ && ticks_)
      ticks = read_cpu_ticks(cpu_list_);
    const double hz = ticks_per_s();
    if (ticks && hz > 0 && ticks->total > start_ticks_total_ && ticks->busy >= start_ticks_busy_) {
      r.machine_cpu_s = static_cast<double>(ticks->total - start_ticks_total_) / hz;
      r.machine_busy_cpu_s = static_cast<double>(ticks->busy - start_ticks_busy_) / hz;
    }
  }
  r.placement.mode = to_string(options_.placement);
  if (placer_) {  // made in start() before the progress thread, kept until destruction
    r.placement.rounds = placer_->rounds();
    r.placement.pinned_rounds = std::min(placer_->pinned_rounds(), r.placement.rounds);
  }
  std::int64_t gpu_busy_ns = 0;
  for (const stage_info& i : infos_) {
    r.stages.push_back(metrics::make_stage_report(i.name, i.kind, *i.stats, i.input_capacity));
    if (i.gpu) {
      for (auto& l : metrics::make_lane_reports(*i.gpu)) r.lanes.push_back(l);
      // One device: the union over the lanes; several: the mean of each device's union.
      const std::vector<int>& devices = i.gpu->devices();
      std::int64_t sum_ns = 0;
      for (std::size_t d = 0; d < devices.size(); ++d) {
        const std::int64_t busy = i.gpu->device_busy_ns(d);
        sum_ns += busy;
        r.devices.push_back({devices[d], r.wall_s > 0 ? ns_to_s(busy) / r.wall_s : 0.0});
      }
      gpu_busy_ns += devices.empty() ? i.gpu->compute_busy_ns()
                                     : sum_ns / static_cast<std::int64_t>(devices.size());
      r.runtime = std::string(i.runtime);
    }
    if (i.batches && !r.batching) r.batching = metrics::make_batch_report(i.batches->snapshot());
    if (i.target && !r.latency_target)
      r.latency_target =
          metrics::make_latency_target_report(i.name, i.target->snapshot(), start_ns_);
  }
  // A ring that could grow is reported at the deepest it ran, on the stage it feeds.
  for (const growable_entry& g : growable_)
    if (g.producer + 1 < r.stages.size())
      r.stages[g.producer + 1].ring_capacity = g.ring->deepest();
  r.gpu_busy_fraction = r.wall_s > 0 ? ns_to_s(gpu_busy_ns) / r.wall_s : 0.0;
  r.item_latency = metrics::make_latency_report(latency_);
  if (with_timeline && timeline_) r.timeline = timeline_->periods();
  metrics::complete_report(r);
  if (!ctl_.metrics_on) {
    r.verdict = {verdict_kind::unmeasured,
                 {},
                 "the pipeline ran with pipeline_options::metrics = false: only item counts "
                 "were kept",
                 "turn metrics on (the default) to see busy / starved / blocked time per "
                 "stage and the bottleneck"};
  }
  return r;
}

void pipeline_core::write_trace(std::ostream& os) const {
  if (!ctl_.trace)
    throw error(
        "conveyor::pipeline: no trace was recorded; construct the pipeline with "
        "pipeline_options{.trace_events = N} (e.g. 16384)");
  metrics::write_chrome_trace(os, *ctl_.trace);
}

void pipeline_core::write_trace(const std::string& path) const {
  std::ofstream f{path};
  if (!f) throw error("conveyor::pipeline: cannot open '" + path + "' to write the trace");
  write_trace(f);
  f.flush();
  if (!f) throw error("conveyor::pipeline: writing the trace to '" + path + "' failed");
}

std::string pipeline_core::trace_json() const {
  std::ostringstream o;
  write_trace(o);
  return o.str();
}

namespace {
// closed_error("conveyor::pipeline: <call><what>"), for the three below.
[[noreturn]] void throw_call_error(const char* call, const std::string& what) {
  throw closed_error(std::string("conveyor::pipeline: ") + call + what);
}
}  // namespace

void throw_moved_from(const char* call) {
  throw_call_error(call,
                   " on a moved-from pipeline: its stages and threads went to the pipeline it "
                   "was moved to; call that one");
}

void throw_before_start(const char* call) { throw_call_error(call, " before start()"); }

void throw_refused(const char* call, const control& ctl) {
  const std::string why = failure_reason(ctl);
  throw_call_error(call, why.empty() ? " after stop()" : " refused: the pipeline stopped " + why);
}

// ---- pipeline/detail/service.hpp ------------------------------------------------------

void check_service_capacity(std::size_t n) {
  CONVEYOR_EXPECTS(n >= 2 && n <= max_ring_capacity && is_power_of_two(n),
                   "conveyor::input<T>().capacity(n): n is how many items the service holds at "
                   "once and must be a power of two in [2, 2^30], got " +
                       std::to_string(n) + "; pass " + std::to_string(next_power_of_two(n)) +
                       " (or leave it out: 1024)");
}

std::string failure_reason(const control& ctl) {
  const std::exception_ptr e = ctl.error.get();
  if (!e) return {};
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return std::string("because ") + ex.what();
  } catch (...) {
    return "because a stage threw an unknown exception";
  }
}

std::exception_ptr not_accepted_error(const control& ctl) {
  const std::string why = failure_reason(ctl);
  return std::make_exception_ptr(
      closed_error("conveyor::pipeline: stopped before the item was accepted" +
                   (why.empty() ? std::string{} : " (" + why + ")")));
}

std::exception_ptr stop_error(const control& ctl) {
  if (std::exception_ptr e = ctl.error.get()) return e;
  return std::make_exception_ptr(closed_error("conveyor::pipeline: the item was cancelled"));
}

}  // namespace conveyor::detail
