// conveyor/counters/latency_target.hpp: what a batch stage with a latency target
// (batch(max).target_p99(d)) chose over time, and whether its items met the target.
//
//   metrics::latency_target_log log{5'000'000, 0.99};   // target 5 ms at the P99
//   log.record(window);                                  // the batcher, per closed window
//   metrics::latency_target_counters c = log.snapshot(); // any thread (the report)
//   c.windows_met; c.history; c.last_miss;
//
// A window is a run of consecutive batches (detail::latency_controller closes one every
// latency_controller::window_batches batches whose results came back): the batch sizes
// and waits chosen in it, the latency of its items at the target's percentile as the
// batcher measured it, and whether that met the target. The log keeps the counts of all
// windows and a history of at most max_history periods (two neighbours merge into one
// as a run grows, so a long run still shows its whole course), plus what the last missed
// window missed by.
//
// Thread-safety: record() from one thread (the batcher's), snapshot() from any. A mutex,
// not atomics: a window closes every few dozen batches (never per item), the history is
// a vector that the report copies whole, and the only other taker is the report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace conveyor::metrics {

// Why a window missed the target (or none: it met it).
enum class target_miss : std::uint8_t {
  none,
  // The stages after the batch alone, with a batch of one item, take longer than the
  // target leaves (after the time items take to reach the batch): no wait or size helps.
  infeasible,
  // The batches left full (max size) and their results still came back late: the stages
  // after the batch are at capacity at this arrival rate.
  at_capacity,
  // The latency tail was longer than the measured service times predicted (variance,
  // queueing): the controller cut its wait budget.
  tail,
};

// One window of batches, or several merged (history): times on the now_ns() clock.
struct target_window {
  std::int64_t start_ns = 0;  // the first batch's cut
  std::int64_t end_ns = 0;    // the last result's return
  std::uint64_t windows = 1;  // closed windows merged into this one
  std::uint64_t windows_met = 0;
  std::uint64_t batches = 0;  // batches whose results came back
  std::uint64_t items = 0;
  std::uint64_t cuts = 0;        // batches cut (their results may come back later)
  std::size_t largest = 0;       // the largest batch cut
  std::int64_t wait_sum_ns = 0;  // sum over the cuts of the wait budget at the first item
  std::int64_t observed_ns = 0;  // the items' latency at the target percentile (merged: max)
  double slack = 1.0;            // the controller's budget factor at the end (0, 1]
  target_miss miss = target_miss::none;  // merged: the later window's, if it missed

  double mean_size() const noexcept {
    return batches == 0 ? 0.0 : static_cast<double>(items) / static_cast<double>(batches);
  }
  double mean_wait_ns() const noexcept {
    return cuts == 0 ? 0.0 : static_cast<double>(wait_sum_ns) / static_cast<double>(cuts);
  }
};

// The numbers behind the last missed window's reason (the report words them).
struct target_miss_cause {
  target_miss kind = target_miss::none;
  std::int64_t service_one_ns = 0;  // the stages after the batch, for a batch of 1 (least seen)
  std::int64_t upstream_ns = 0;     // item entry -> arrival at the batch (moving average)
  std::int64_t observed_ns = 0;     // that window's latency at the percentile
  std::int64_t wait_ns = 0;         // that window's mean wait budget
  double mean_size = 0.0;           // that window's mean batch size
  double rate_per_s = 0.0;          // arrivals at the batch (moving average)
};

struct latency_target_counters {
  std::int64_t target_ns = 0;
  double quantile = 0.99;  // 0.99: target_p99, 0.95: target_p95
  std::uint64_t windows = 0;
  std::uint64_t windows_met = 0;
  std::vector<target_window> history;  // oldest first, at most max_history
  target_miss_cause last_miss;         // kind none: no window missed
};

class latency_target_log {
 public:
  static constexpr std::size_t max_history = 32;

  // @throws std::bad_alloc (the history's storage is taken here, at setup: recording
  // allocates nothing).
  latency_target_log(std::int64_t target_ns, double quantile)
      : target_ns_(target_ns), quantile_(quantile) {
    history_.reserve(max_history);
  }

  // The batcher, once per closed window.
  void record(const target_window& w, const target_miss_cause& cause) noexcept {
    const std::lock_guard lock{mutex_};
    ++windows_;
    windows_met_ += w.windows_met;
    if (w.miss != target_miss::none) last_miss_ = cause;
    if (history_.size() == max_history) merge_pairs();
    history_.push_back(w);
  }

  latency_target_counters snapshot() const {
    const std::lock_guard lock{mutex_};
    return {target_ns_, quantile_, windows_, windows_met_, history_, last_miss_};
  }

  std::int64_t target_ns() const noexcept { return target_ns_; }
  double quantile() const noexcept { return quantile_; }

  // a then b (adjacent, a first) as one period.
  static target_window merged(const target_window& a, const target_window& b) noexcept {
    target_window m = b;
    m.start_ns = a.start_ns;
    m.windows = a.windows + b.windows;
    m.windows_met = a.windows_met + b.windows_met;
    m.batches = a.batches + b.batches;
    m.items = a.items + b.items;
    m.cuts = a.cuts + b.cuts;
    m.largest = a.largest > b.largest ? a.largest : b.largest;
    m.wait_sum_ns = a.wait_sum_ns + b.wait_sum_ns;
    m.observed_ns = a.observed_ns > b.observed_ns ? a.observed_ns : b.observed_ns;
    if (b.miss == target_miss::none) m.miss = a.miss;
    return m;
  }

 private:
  void merge_pairs() noexcept {
    std::size_t out = 0;
    for (std::size_t i = 0; i + 1 < history_.size(); i += 2)
      history_[out++] = merged(history_[i], history_[i + 1]);
    if (history_.size() % 2 != 0) history_[out++] = history_.back();
    history_.resize(out);
  }

  const std::int64_t target_ns_;
  const double quantile_;
  mutable std::mutex mutex_;
  std::uint64_t windows_ = 0;
  std::uint64_t windows_met_ = 0;
  std::vector<target_window> history_;
  target_miss_cause last_miss_;
};

}  // namespace conveyor::metrics
