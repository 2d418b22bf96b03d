// conveyor/report/timeline.hpp: the verdict of each period of a run, kept bounded, and the
// phases it falls into: where the bottleneck moved, when, and from what to what.
//
//   metrics::timeline_recorder rec{[&] { return core.make_report(); }, 100ms};  // a thread
//   ...                                                // the pipeline runs
//   rec.stop(core.make_report());                      // joins; the last period ends here
//   r.timeline = rec.periods();                        // verdict_period per period
//   for (const auto& ph : metrics::bottleneck_phases(r.timeline)) ...  // start_s, stage
//
// Every period the recorder takes a cumulative report, diagnoses the difference with the
// previous one (window(), progress.hpp) and keeps that period's verdict and CPU shares.
// At most max_periods are kept: when one more comes, every two neighbouring periods merge
// into one (re-diagnosed over both), so a long run keeps its whole span at a coarser grain
// and the memory does not grow with the run.
//
// Phases (what diagnose() reads): consecutive periods naming the same bottleneck stage
// form a run (its kind and advice: those of its longest period, the first of equals); a run shorter than phase_share of the timeline or than
// two periods joins its neighbours (both, when they name the same bottleneck; else the
// longer one), shortest first, until every run is long enough. A period with no named
// bottleneck (balanced, idle) is a run with no name, absorbed the same way.
//
// Thread-safety: verdict_timeline is a plain value (one thread). timeline_recorder's
// constructor, stop() from the owning thread; periods() from any thread (a mutex).
// The snapshot function runs on the recorder's thread, concurrently with the pipeline.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/report/report.hpp"

namespace conveyor::metrics {

// The periods of a run from its cumulative reports, bounded.
class verdict_timeline {
 public:
  static constexpr std::size_t max_periods = 64;

  // The next cumulative report (the first one marks the start). A report not later than
  // the last one is ignored. `last`: the final report of the run; a tail shorter than
  // half a period then extends the last period instead of making one of its own (the
  // drain alone would read as a phase).
  void add(report cumulative, bool last = false);

  const std::vector<verdict_period>& periods() const noexcept { return periods_; }

 private:
  verdict_period make_period(const report& later, const report& earlier) const;
  void merge_pairs();

  std::vector<report> bounds_;  // cumulative reports at the periods' ends (first: start)
  std::vector<verdict_period> periods_;
};

// One phase of a timeline: a stretch of periods with one named bottleneck (or none:
// kind balanced, stage empty).
struct bottleneck_phase {
  double start_s = 0.0;
  double end_s = 0.0;
  verdict_kind kind = verdict_kind::balanced;
  std::string stage;   // empty: no named bottleneck
  std::string advice;  // what its periods advised (the longest-held period's)
  std::size_t periods = 0;
  double duration_s() const noexcept { return end_s - start_s; }
};

// The phases of a timeline (see above); empty for an empty timeline.
std::vector<bottleneck_phase> bottleneck_phases(const std::vector<verdict_period>& timeline,
                                                double phase_share = 0.2);

// Records a verdict_timeline on a thread of its own, every period.
class timeline_recorder {
 public:
  using snapshot_fn = std::function<report()>;
  static constexpr std::chrono::milliseconds min_period{10};

  // Takes the first snapshot now, then one every period on its thread.
  // @throws config_error when period < 10 ms or snapshot is empty.
  timeline_recorder(snapshot_fn snapshot, std::chrono::milliseconds period);
  timeline_recorder(const timeline_recorder&) = delete;
  timeline_recorder& operator=(const timeline_recorder&) = delete;
  ~timeline_recorder();

  // Stops and joins the thread, then adds `final` as the run's last report. Idempotent
  // (a second call adds nothing). @note blocks until the thread's current snapshot ends.
  void stop(report final);
  void stop() noexcept;  // without a final report (the destructor's)

  // The periods so far, oldest first. Any thread.
  std::vector<verdict_period> periods() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace conveyor::metrics
