// conveyor/pipeline/detail/core.hpp: the part of a running pipeline that does not depend on
// its stages' types: the control block, the threads and their placement, the progress
// line, the trace, and the report's assembly. Compiled once, in the library
// (src/pipeline_core.cpp); pipeline<chain> adds the rings, the stages and the service.
//
//   detail::pipeline_core core{options};         // checks the options (config_error)
//   core.add_stage(node.info());                 // setup, in chain order
//   core.add_growable(p, make_box<growable_link<T>>(ring));  // ring after stage p
//   core.start([&](thread_group& g) { node.start(g); });  // spawn, open the gate, placer
//   core.join();                                 // every stage thread, placer, progress
//   conveyor::report r = core.make_report();
//
// While it runs (metrics on), a timeline_recorder takes a report every timeline_period and
// keeps each period's verdict (report::timeline, timeline.hpp).
//
// Thread-safety: start()/join() from the owning thread; make_report(), counts() and the
// trace from any thread that does not race with start()/join() (the progress line does
// so); ctl() as control's own contract.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/base/box.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/pipeline/growth.hpp"
#include "conveyor/pipeline/options.hpp"
#include "conveyor/report/report.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/latency_samples.hpp"

namespace conveyor::metrics {
class progress_line;
class timeline_recorder;
}  // namespace conveyor::metrics

namespace conveyor::detail {

class thread_registry;
class load_placer;
struct chain_placement;

class pipeline_core {
 public:
  // @throws config_error for options that cannot work, saying what to change.
  explicit pipeline_core(const pipeline_options& options);
  ~pipeline_core();
  pipeline_core(const pipeline_core&) = delete;
  pipeline_core& operator=(const pipeline_core&) = delete;

  const pipeline_options& options() const noexcept { return options_; }
  control& ctl() noexcept { return ctl_; }
  const control& ctl() const noexcept { return ctl_; }
  latency_recorder& latency() noexcept { return latency_; }

  // Setup, before start(): each stage's identity and counters, in chain order (a
  // service's result node last), and each ring that may grow, by the chain position of
  // the stage that feeds it.
  void add_stage(stage_info info);
  void add_growable(std::size_t producer, box<growable_ring> ring);

  // Spawns the stage threads through spawn(threads) (they wait at the gate), then opens
  // the gate and starts the placer and the progress line. A throw from spawn() leaves the
  // pipeline started: the owner must still stop() and join().
  // @throws closed_error if already started.
  void start(const std::function<void(thread_group&)>& spawn);
  bool started() const noexcept { return started_; }
  bool joined() const noexcept { return joined_; }

  // Joins every stage thread, then stops the placer and the progress line and takes the
  // end time. Idempotent. @note blocks until the stage threads end.
  void join();

  // What the pipeline measured, a snapshot while it runs (see pipeline::report()).
  conveyor::report make_report() const;
  // How often the timeline takes a report: short enough that a run of a second or two has
  // enough periods to show where its bottleneck moved (verdict_timeline keeps at most 64,
  // merging neighbours as a run grows).
  static constexpr std::chrono::milliseconds timeline_period{100};
  item_counts counts() const noexcept;

  bool tracing() const noexcept { return ctl_.trace != nullptr; }
  // @throws conveyor::error without a trace, or when the file cannot be written.
  void write_trace(std::ostream& os) const;
  void write_trace(const std::string& path) const;
  std::string trace_json() const;

 private:
  struct growable_entry {
    std::size_t producer;
    box<growable_ring> ring;
  };
  void follow_placement(const chain_placement& where) noexcept;
  // with_timeline = false: without report::timeline (the timeline recorder's own
  // snapshots), so it reads no timeline_.
  conveyor::report make_report(bool with_timeline) const;

  // First, so destroyed last: stage threads use the registry until they end.
  std::unique_ptr<thread_registry> placed_;
  pipeline_options options_;
  control ctl_;  // before the stages and rings the owner builds: they register with it
  latency_recorder latency_;
  std::vector<stage_info> infos_;
  std::vector<growable_entry> growable_;
  thread_group threads_;
  std::unique_ptr<load_placer> placer_;                         // null: placement left to the OS
  std::unique_ptr<metrics::progress_line> progress_;            // null: no progress line
  std::unique_ptr<metrics::timeline_recorder> timeline_;        // null: metrics off, not started
  std::vector<int> cpu_list_;                                   // allowed_cpus() at start
  std::uint64_t start_ticks_busy_ = 0, start_ticks_total_ = 0;  // /proc/stat, cpu_list_
  std::uint64_t end_ticks_busy_ = 0, end_ticks_total_ = 0;      // at join
  bool ticks_ = false;                                          // both read
  bool started_ = false, joined_ = false;
  std::int64_t start_ns_ = 0, end_ns_ = 0;
  std::int64_t start_cpu_ns_ = 0, end_cpu_ns_ = 0;  // process_cpu_ns()
};

// The closed_error of a pipeline call that cannot be served, thrown from the library
// (the message is built there, not in every includer): on a moved-from pipeline, before
// start(), and on a service that stopped (saying why, see failure_reason()).
[[noreturn]] void throw_moved_from(const char* call);
[[noreturn]] void throw_before_start(const char* call);
[[noreturn]] void throw_refused(const char* call, const control& ctl);

}  // namespace conveyor::detail
