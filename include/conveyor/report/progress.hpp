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

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <iostream>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/report/report.hpp"
#include "conveyor/report/verdict.hpp"

namespace conveyor::metrics {

// What happened between two cumulative reports of the same pipeline (`earlier` taken
// first): counters and times are differences, fractions are recomputed over the
// window, latency is `later`'s (histograms cannot be subtracted), and the verdict is
// diagnosed on the window.
inline report window(const report& later, const report& earlier) {
  const auto sub = [](std::uint64_t a, std::uint64_t b) { return a > b ? a - b : std::uint64_t{0}; };
  const auto subd = [](double a, double b) { return a > b ? a - b : 0.0; };
  report w = later;
  w.wall_s = subd(later.wall_s, earlier.wall_s);
  if (!(w.wall_s > 0.0)) return later;
  w.produced = sub(later.produced, earlier.produced);
  w.completed = sub(later.completed, earlier.completed);
  w.failed = sub(later.failed, earlier.failed);
  w.cancelled = sub(later.cancelled, earlier.cancelled);
  w.process_cpu_s = subd(later.process_cpu_s, earlier.process_cpu_s);
  w.placement.rounds = sub(later.placement.rounds, earlier.placement.rounds);
  w.placement.pinned_rounds = sub(later.placement.pinned_rounds, earlier.placement.pinned_rounds);
  if (later.stages.size() == earlier.stages.size()) {
    for (std::size_t i = 0; i < w.stages.size(); ++i) {
      w.stages[i].items = sub(later.stages[i].items, earlier.stages[i].items);
      w.stages[i].busy_s = subd(later.stages[i].busy_s, earlier.stages[i].busy_s);
      w.stages[i].starved_s = subd(later.stages[i].starved_s, earlier.stages[i].starved_s);
      w.stages[i].blocked_s = subd(later.stages[i].blocked_s, earlier.stages[i].blocked_s);
    }
  }
  if (later.lanes.size() == earlier.lanes.size()) {
    for (std::size_t i = 0; i < w.lanes.size(); ++i) {
      w.lanes[i].batches = sub(later.lanes[i].batches, earlier.lanes[i].batches);
      w.lanes[i].items = sub(later.lanes[i].items, earlier.lanes[i].items);
      w.lanes[i].h2d_s = subd(later.lanes[i].h2d_s, earlier.lanes[i].h2d_s);
      w.lanes[i].compute_s = subd(later.lanes[i].compute_s, earlier.lanes[i].compute_s);
      w.lanes[i].d2h_s = subd(later.lanes[i].d2h_s, earlier.lanes[i].d2h_s);
      w.lanes[i].h2d_bytes = sub(later.lanes[i].h2d_bytes, earlier.lanes[i].h2d_bytes);
      w.lanes[i].d2h_bytes = sub(later.lanes[i].d2h_bytes, earlier.lanes[i].d2h_bytes);
    }
  }
  w.gpu_busy_fraction = std::clamp(
      subd(later.gpu_busy_fraction * later.wall_s, earlier.gpu_busy_fraction * earlier.wall_s) /
          w.wall_s,
      0.0, 1.0);
  if (later.batching && earlier.batching) {
    batch_report& b = *w.batching;
    b.batches = sub(later.batching->batches, earlier.batching->batches);
    b.flushed_on_timeout = sub(later.batching->flushed_on_timeout, earlier.batching->flushed_on_timeout);
    const double items = subd(later.batching->mean_size * static_cast<double>(later.batching->batches),
                              earlier.batching->mean_size * static_cast<double>(earlier.batching->batches));
    b.mean_size = b.batches == 0 ? 0.0 : items / static_cast<double>(b.batches);
  }
  complete_report(w);
  return w;
}

// One progress line (no '\r', no newline) from two cumulative snapshots.
inline std::string format_progress(const report& now, const report& previous) {
  const report w = window(now, previous);
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f", w.throughput);
  std::string line = "conveyor: " + std::to_string(now.completed) + " done | " + rate + " items/s";
  if (!now.lanes.empty()) {
    char gpu[32];
    std::snprintf(gpu, sizeof gpu, "%.0f%%", 100.0 * w.gpu_busy_fraction);
    line += std::string(" | GPU busy ") + gpu;
  }
  line += " | now: " + std::string(to_string(w.verdict.kind));
  if (!w.verdict.stage.empty()) line += " '" + w.verdict.stage + "'";
  return line;
}

class progress_line {
 public:
  using snapshot_fn = std::function<report()>;
  static constexpr std::chrono::milliseconds min_period{250};

  // Starts the thread. @throws config_error when period < 250 ms or snapshot is empty.
  explicit progress_line(snapshot_fn snapshot,
                         std::chrono::milliseconds period = std::chrono::milliseconds{500},
                         std::ostream& out = std::cerr)
      : snapshot_((check(snapshot, period), std::move(snapshot))), period_(period), out_(&out) {
    thread_ = std::thread([this] { loop(); });
  }

  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;

  ~progress_line() { stop(); }

  // Stops and joins the thread (waking it at once), then ends the line. Idempotent.
  // @note blocks until the thread has finished its current refresh.
  void stop() noexcept {
    {
      std::lock_guard<std::mutex> lock{mutex_};
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Lines written so far. Any thread.
  std::uint64_t refreshes() const noexcept {
    std::lock_guard<std::mutex> lock{mutex_};
    return refreshes_;
  }

 private:
  static void check(const snapshot_fn& f, std::chrono::milliseconds period) {
    CONVEYOR_EXPECTS(static_cast<bool>(f), "progress_line: pass a snapshot function");
    CONVEYOR_EXPECTS(period >= min_period,
                     "progress_line: period must be >= 250 ms (at most 4 refreshes a second)");
  }

  void loop() noexcept {
    std::size_t last_len = 0;
    try {
      report previous = snapshot_();
      std::unique_lock<std::mutex> lock{mutex_};
      for (;;) {
        // Not a timing assumption: the wait only paces the refreshes; stop() wakes it.
        if (wake_.wait_for(lock, period_, [this] { return stopping_; })) break;
        lock.unlock();
        report now = snapshot_();
        std::string line = format_progress(now, previous);
        const std::size_t len = line.size();
        if (len < last_len) line.append(last_len - len, ' ');  // erase the longer old line
        *out_ << '\r' << line << std::flush;
        last_len = len;
        previous = std::move(now);
        lock.lock();
        ++refreshes_;
      }
    } catch (...) {
      // A failing snapshot ends the progress line; the pipeline reports its own errors.
    }
    if (last_len != 0) {
      try {
        *out_ << '\n' << std::flush;
      } catch (...) {
      }
    }
  }

  snapshot_fn snapshot_;
  std::chrono::milliseconds period_;
  std::ostream* out_;
  mutable std::mutex mutex_;  // guards stopping_ and refreshes_; never held while printing
  std::condition_variable wake_;
  bool stopping_ = false;
  std::uint64_t refreshes_ = 0;
  std::thread thread_;  // last: starts after every other member is initialized
};

}  // namespace conveyor::metrics
