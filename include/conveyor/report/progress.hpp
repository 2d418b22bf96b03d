// conveyor/report/progress.hpp: an optional live progress line for long runs.
//
//   conveyor::metrics::progress_line progress{[&] { return pipe.report(); }};  // starts
//   pipe.wait();
//   progress.stop();                         // or let the destructor stop it
//   // stderr, rewritten in place every 500 ms:
//   // conveyor: 120000 done | 4521.3 items/s | GPU busy 93% | now: compute_bound 'gpu'
//
// Every period (>= 250 ms, so at most 4 refreshes a second) a background thread calls
// the snapshot function, takes the difference with the previous snapshot (window()),
// diagnoses that window, and writes '\r' + one line. Rates, GPU busy and the bottleneck
// are therefore those of the last period, not of the whole run. Off unless constructed.
//
// Thread-safety: the snapshot function runs on the progress thread, concurrently with
// the pipeline, so it must be safe to call while the pipeline runs (report() is: it
// reads the counters). stop() and the destructor from the thread that owns the object.
// If the snapshot function throws, the line stops updating (nothing propagates).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>

#include "conveyor/report/report.hpp"

namespace conveyor::metrics {

// What happened between two cumulative reports of the same pipeline (`earlier` taken
// first): counters and times are differences, fractions are recomputed over the
// window, latency is `later`'s (histograms cannot be subtracted), and the verdict is
// diagnosed on the window.
report window(const report& later, const report& earlier);

// One progress line (no '\r', no newline) from two cumulative snapshots.
std::string format_progress(const report& now, const report& previous);

class progress_line {
 public:
  using snapshot_fn = std::function<report()>;
  static constexpr std::chrono::milliseconds min_period{250};

  // Starts the thread. @throws config_error when period < 250 ms or snapshot is empty.
  explicit progress_line(snapshot_fn snapshot,
                         std::chrono::milliseconds period = std::chrono::milliseconds{500});
  progress_line(snapshot_fn snapshot, std::chrono::milliseconds period, std::ostream& out);

  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;

  ~progress_line();

  // Stops and joins the thread (waking it at once), then ends the line. Idempotent.
  // @note blocks until the thread has finished its current refresh.
  void stop() noexcept;

  // Lines written so far. Any thread.
  std::uint64_t refreshes() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace conveyor::metrics
