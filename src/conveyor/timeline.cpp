// src/conveyor/timeline.cpp: the verdict timeline and its phases
// (conveyor/report/timeline.hpp).
#include "conveyor/report/timeline.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/report/progress.hpp"

namespace conveyor::metrics {

verdict_period verdict_timeline::make_period(const report& later, const report& earlier) const {
  const report w = window(later, earlier);
  verdict_period p;
  p.start_s = earlier.wall_s;
  p.end_s = later.wall_s;
  p.verdict = w.verdict;
  p.process_cpu_load = process_cpu_load(w);
  p.other_cpu_load = other_cpu_load(w);
  return p;
}

void verdict_timeline::add(report cumulative, bool last) {
  cumulative.timeline.clear();  // a snapshot's own timeline is not needed to diagnose it
  if (!bounds_.empty() && !(cumulative.wall_s > bounds_.back().wall_s)) return;
  if (last && bounds_.size() >= 2) {
    const double tail = cumulative.wall_s - bounds_.back().wall_s;
    const double period = periods_.back().end_s - periods_.back().start_s;
    if (tail < period / 2) {  // the drain alone: it extends the last period
      bounds_.back() = std::move(cumulative);
      periods_.back() = make_period(bounds_.back(), bounds_[bounds_.size() - 2]);
      return;
    }
  }
  bounds_.push_back(std::move(cumulative));
  if (bounds_.size() >= 2)
    periods_.push_back(make_period(bounds_.back(), bounds_[bounds_.size() - 2]));
  if (periods_.size() > max_periods) merge_pairs();
}

// Keeps every other boundary (the first and the last always) and diagnoses the merged
// periods again.
void verdict_timeline::merge_pairs() {
  std::vector<report> kept;
  kept.reserve(bounds_.size() / 2 + 2);
  for (std::size_t i = 0; i < bounds_.size(); i += 2) kept.push_back(std::move(bounds_[i]));
  if ((bounds_.size() - 1) % 2 != 0) kept.push_back(std::move(bounds_.back()));
  bounds_ = std::move(kept);
  periods_.clear();
  for (std::size_t i = 1; i < bounds_.size(); ++i)
    periods_.push_back(make_period(bounds_[i], bounds_[i - 1]));
}

namespace {

bool named(const verdict& v) noexcept {
  return !v.stage.empty() && v.kind != verdict_kind::balanced && v.kind != verdict_kind::idle &&
         v.kind != verdict_kind::unmeasured;
}

// A phase is a stage: the kind may change within it (compute, then copies, on the gpu
// stage) without the bottleneck moving.
bool same_bottleneck(const bottleneck_phase& a, const bottleneck_phase& b) noexcept {
  return a.stage == b.stage;
}

}  // namespace

std::vector<bottleneck_phase> bottleneck_phases(const std::vector<verdict_period>& timeline,
                                                double phase_share) {
  std::vector<bottleneck_phase> runs;
  double longest_period = 0.0;  // of the current run, whose kind and advice it keeps
  for (const verdict_period& p : timeline) {
    bottleneck_phase ph;
    ph.start_s = p.start_s;
    ph.end_s = p.end_s;
    ph.periods = 1;
    if (named(p.verdict)) {
      ph.kind = p.verdict.kind;
      ph.stage = p.verdict.stage;
      ph.advice = p.verdict.advice;
    }
    if (!runs.empty() && same_bottleneck(runs.back(), ph)) {
      runs.back().end_s = ph.end_s;
      ++runs.back().periods;
      if (p.end_s - p.start_s > longest_period) {
        runs.back().kind = ph.kind;
        runs.back().advice = ph.advice;
        longest_period = p.end_s - p.start_s;
      }
    } else {
      runs.push_back(std::move(ph));
      longest_period = p.end_s - p.start_s;
    }
  }
  if (runs.empty()) return runs;
  const double total = runs.back().end_s - runs.front().start_s;
  const auto too_short = [&](const bottleneck_phase& r) {
    return r.periods < 2 || r.duration_s() < phase_share * total;
  };
  const auto absorb = [](bottleneck_phase& into, const bottleneck_phase& from) {
    into.start_s = std::min(into.start_s, from.start_s);
    into.end_s = std::max(into.end_s, from.end_s);
    into.periods += from.periods;
  };
  while (runs.size() > 1) {
    std::size_t shortest = runs.size();
    for (std::size_t i = 0; i < runs.size(); ++i)
      if (too_short(runs[i]) &&
          (shortest == runs.size() || runs[i].duration_s() < runs[shortest].duration_s()))
        shortest = i;
    if (shortest == runs.size()) break;
    const std::size_t i = shortest;
    if (i > 0 && i + 1 < runs.size() && same_bottleneck(runs[i - 1], runs[i + 1])) {
      absorb(runs[i - 1], runs[i]);
      absorb(runs[i - 1], runs[i + 1]);
      runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(i),
                 runs.begin() + static_cast<std::ptrdiff_t>(i + 2));
      continue;
    }
    const bool left =
        i + 1 == runs.size() || (i > 0 && runs[i - 1].duration_s() >= runs[i + 1].duration_s());
    const std::size_t into = left ? i - 1 : i + 1;
    absorb(runs[into], runs[i]);
    runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return runs;
}

// ---- the recorder ----------------------------------------------------------------

struct timeline_recorder::impl {
  impl(snapshot_fn f, std::chrono::milliseconds p) : snapshot(std::move(f)), period(p) {
    timeline.add(snapshot());
    thread = std::thread([this] { loop(); });
  }

  void loop() noexcept {
    try {
      std::unique_lock<std::mutex> lock{mutex};
      // Not a timing assumption: the wait only paces the snapshots; stop() wakes it.
      while (!wake.wait_for(lock, period, [this] { return stopping; })) {
        lock.unlock();
        report now = snapshot();  // no lock held: the snapshot may read periods()
        lock.lock();
        timeline.add(std::move(now));
      }
    } catch (...) {
      // A failing snapshot ends the timeline where it is; the pipeline reports its errors.
    }
  }

  snapshot_fn snapshot;
  std::chrono::milliseconds period;
  mutable std::mutex mutex;  // guards stopping, stopped and timeline
  std::condition_variable wake;
  bool stopping = false;
  bool finished = false;
  verdict_timeline timeline;
  std::thread thread;  // last: starts after every other member is initialized
};

namespace {
void check(const timeline_recorder::snapshot_fn& f, std::chrono::milliseconds period) {
  CONVEYOR_EXPECTS(static_cast<bool>(f), "timeline_recorder: pass a snapshot function");
  CONVEYOR_EXPECTS(period >= timeline_recorder::min_period,
                   "timeline_recorder: period must be >= 10 ms");
}
}  // namespace

timeline_recorder::timeline_recorder(snapshot_fn snapshot, std::chrono::milliseconds period)
    : impl_((check(snapshot, period), std::make_unique<impl>(std::move(snapshot), period))) {}

timeline_recorder::~timeline_recorder() { stop(); }

void timeline_recorder::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock{impl_->mutex};
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void timeline_recorder::stop(report final) {
  stop();
  std::lock_guard<std::mutex> lock{impl_->mutex};
  if (impl_->finished) return;
  impl_->finished = true;
  impl_->timeline.add(std::move(final), true);
}

std::vector<verdict_period> timeline_recorder::periods() const {
  std::lock_guard<std::mutex> lock{impl_->mutex};
  return impl_->timeline.periods();
}

}  // namespace conveyor::metrics
