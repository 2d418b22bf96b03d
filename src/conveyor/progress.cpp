// src/conveyor/progress.cpp: the live progress line (conveyor/report/progress.hpp).
#include "conveyor/report/progress.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <ostream>
#include <thread>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/report/verdict.hpp"

namespace conveyor::metrics {

report window(const report& later, const report& earlier) {
  const auto sub = [](std::uint64_t a, std::uint64_t b) {
    return a > b ? a - b : std::uint64_t{0};
  };
  const auto subd = [](double a, double b) { return a > b ? a - b : 0.0; };
  report w = later;
  w.wall_s = subd(later.wall_s, earlier.wall_s);
  if (!(w.wall_s > 0.0)) return later;
  w.produced = sub(later.produced, earlier.produced);
  w.completed = sub(later.completed, earlier.completed);
  w.failed = sub(later.failed, earlier.failed);
  w.cancelled = sub(later.cancelled, earlier.cancelled);
  w.expired = sub(later.expired, earlier.expired);
  w.process_cpu_s = subd(later.process_cpu_s, earlier.process_cpu_s);
  w.machine_cpu_s = subd(later.machine_cpu_s, earlier.machine_cpu_s);
  w.machine_busy_cpu_s = subd(later.machine_busy_cpu_s, earlier.machine_busy_cpu_s);
  w.timeline.clear();  // the window is one period
  w.placement.rounds = sub(later.placement.rounds, earlier.placement.rounds);
  w.placement.pinned_rounds = sub(later.placement.pinned_rounds, earlier.placement.pinned_rounds);
  if (later.stages.size() == earlier.stages.size()) {
    for (std::size_t i = 0; i < w.stages.size(); ++i) {
      w.stages[i].items = sub(later.stages[i].items, earlier.stages[i].items);
      w.stages[i].busy_s = subd(later.stages[i].busy_s, earlier.stages[i].busy_s);
      w.stages[i].starved_s = subd(later.stages[i].starved_s, earlier.stages[i].starved_s);
      w.stages[i].blocked_s = subd(later.stages[i].blocked_s, earlier.stages[i].blocked_s);
      w.stages[i].cpu_s = subd(later.stages[i].cpu_s, earlier.stages[i].cpu_s);
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
      w.lanes[i].stage_in_s = subd(later.lanes[i].stage_in_s, earlier.lanes[i].stage_in_s);
      w.lanes[i].enqueue_s = subd(later.lanes[i].enqueue_s, earlier.lanes[i].enqueue_s);
      w.lanes[i].drained_batches =
          sub(later.lanes[i].drained_batches, earlier.lanes[i].drained_batches);
      w.lanes[i].stage_out_s = subd(later.lanes[i].stage_out_s, earlier.lanes[i].stage_out_s);
      w.lanes[i].stage_out_cpu_s =
          subd(later.lanes[i].stage_out_cpu_s, earlier.lanes[i].stage_out_cpu_s);
    }
  }
  w.gpu_busy_fraction = std::clamp(
      subd(later.gpu_busy_fraction * later.wall_s, earlier.gpu_busy_fraction * earlier.wall_s) /
          w.wall_s,
      0.0, 1.0);
  if (later.batching && earlier.batching) {
    batch_report& b = *w.batching;
    b.batches = sub(later.batching->batches, earlier.batching->batches);
    b.flushed_on_timeout =
        sub(later.batching->flushed_on_timeout, earlier.batching->flushed_on_timeout);
    const double items =
        subd(later.batching->mean_size * static_cast<double>(later.batching->batches),
             earlier.batching->mean_size * static_cast<double>(earlier.batching->batches));
    b.mean_size = b.batches == 0 ? 0.0 : items / static_cast<double>(b.batches);
  }
  complete_report(w);
  return w;
}

std::string format_progress(const report& now, const report& previous) {
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

struct progress_line::impl {
  impl(snapshot_fn f, std::chrono::milliseconds p, std::ostream& o)
      : snapshot(std::move(f)), period(p), out(&o) {
    thread = std::thread([this] { loop(); });
  }

  void loop() noexcept {
    std::size_t last_len = 0;
    try {
      report previous = snapshot();
      std::unique_lock<std::mutex> lock{mutex};
      for (;;) {
        // Not a timing assumption: the wait only paces the refreshes; stop() wakes it.
        if (wake.wait_for(lock, period, [this] { return stopping; })) break;
        lock.unlock();
        report now = snapshot();
        std::string line = format_progress(now, previous);
        const std::size_t len = line.size();
        if (len < last_len) line.append(last_len - len, ' ');  // erase the longer old line
        *out << '\r' << line << std::flush;
        last_len = len;
        previous = std::move(now);
        lock.lock();
        ++refreshes;
      }
    } catch (...) {
      // A failing snapshot ends the progress line; the pipeline reports its own errors.
    }
    if (last_len != 0) {
      try {
        *out << '\n' << std::flush;
      } catch (...) {
      }
    }
  }

  snapshot_fn snapshot;
  std::chrono::milliseconds period;
  std::ostream* out;
  mutable std::mutex mutex;  // guards stopping and refreshes; never held while printing
  std::condition_variable wake;
  bool stopping = false;
  std::uint64_t refreshes = 0;
  std::thread thread;  // last: starts after every other member is initialized
};

namespace {
void check(const progress_line::snapshot_fn& f, std::chrono::milliseconds period) {
  CONVEYOR_EXPECTS(static_cast<bool>(f), "progress_line: pass a snapshot function");
  CONVEYOR_EXPECTS(period >= progress_line::min_period,
                   "progress_line: period must be >= 250 ms (at most 4 refreshes a second)");
}
}  // namespace

progress_line::progress_line(snapshot_fn snapshot, std::chrono::milliseconds period)
    : progress_line(std::move(snapshot), period, std::cerr) {}

progress_line::progress_line(snapshot_fn snapshot, std::chrono::milliseconds period,
                             std::ostream& out)
    : impl_((check(snapshot, period), std::make_unique<impl>(std::move(snapshot), period, out))) {}

progress_line::~progress_line() { stop(); }

void progress_line::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock{impl_->mutex};
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::uint64_t progress_line::refreshes() const noexcept {
  std::lock_guard<std::mutex> lock{impl_->mutex};
  return impl_->refreshes;
}

}  // namespace conveyor::metrics
