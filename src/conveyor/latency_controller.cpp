// src/conveyor/latency_controller.cpp: the latency controller's rule
// (conveyor/stage/detail/latency_controller.hpp): predictions, windows, the slack's update.
#include "conveyor/stage/detail/latency_controller.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

namespace conveyor::detail {

std::int64_t latency_controller::service_ns(std::size_t n) const noexcept {
  n = std::max<std::size_t>(n, 1);
  const std::size_t b = bucket(n);
  // Fresh figures first (a bucket is stale once stale_after results came back without
  // one of its size), then stale ones.
  for (const bool fresh_only : {true, false}) {
    const auto usable = [&](std::size_t j) {
      return svc_[j].time.known() && (!fresh_only || results_ - svc_[j].last_result <= stale_after);
    };
    if (usable(b)) return svc_[b].predict(n);
    for (std::size_t j = b; j-- > 0;)
      if (usable(j)) return svc_[j].predict(n);  // scaled up from below
    for (std::size_t j = b + 1; j < buckets; ++j)
      if (usable(j)) return static_cast<std::int64_t>(svc_[j].time.value);
  }
  return 0;  // nothing measured yet
}

void latency_controller::cut(std::size_t size, std::int64_t wait_ns) noexcept {
  ++window_.cuts;
  window_.wait_sum_ns += std::max<std::int64_t>(wait_ns, 0);
  window_.largest = std::max(window_.largest, size);
}

bool latency_controller::completed(const batch_outcome& o) noexcept {
  const std::int64_t s = std::max<std::int64_t>(o.done_ns - o.cut_ns, 0);
  service_bucket& sb = svc_[bucket(std::max<std::size_t>(o.size, 1))];
  sb.add(static_cast<double>(s), static_cast<double>(o.size));
  sb.last_result = ++results_;
  if (o.size <= 1) floor_one_ = floor_one_ == 0 || s < floor_one_ ? s : floor_one_;
  if (window_.batches == 0) window_.start_ns = o.cut_ns;
  window_.end_ns = std::max(window_.end_ns, o.done_ns);
  ++window_.batches;
  window_.items += o.size;
  fresh_ += o.cut_ns >= changed_at_ns_ ? 1 : 0;
  // The batch's items, as up to points_per_batch latencies evenly over its spread, each
  // weighing its share of the items.
  const std::size_t n = std::max<std::size_t>(o.size, 1);
  const std::size_t points = std::min(n, points_per_batch);
  const std::int64_t spread = std::clamp<std::int64_t>(o.spread_ns, 0, o.latency_ns);
  for (std::size_t k = 0; k < points; ++k) {
    const std::int64_t step =
        points == 1 ? 0
                    : spread * static_cast<std::int64_t>(k) / static_cast<std::int64_t>(points - 1);
    samples_[n_samples_++] = {o.latency_ns - step,
                              static_cast<double>(n) / static_cast<double>(points)};
  }
  if (++batches_in_window_ < window_batches) return false;
  close_window();
  return true;
}

std::int64_t latency_controller::weighted_quantile(std::span<sample> v, std::size_t n,
                                                   double q) noexcept {
  if (n == 0) return 0;
  std::sort(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n),
            [](const sample& a, const sample& b) { return a.latency_ns < b.latency_ns; });
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) total += std::max(v[i].weight, 1.0);
  double acc = 0;
  for (std::size_t i = 0; i < n; ++i) {
    acc += std::max(v[i].weight, 1.0);
    if (acc >= q * total) return v[i].latency_ns;
  }
  return v[n - 1].latency_ns;
}

std::size_t latency_controller::bucket(std::size_t n) noexcept {
  return std::min<std::size_t>(static_cast<std::size_t>(std::bit_width(n)) - 1, buckets - 1);
}

std::int64_t latency_controller::service_bucket::predict(std::size_t n) const noexcept {
  const double scale = std::max(1.0, static_cast<double>(n) / std::max(size.value, 1.0));
  return static_cast<std::int64_t>(time.value * scale);
}

void latency_controller::close_window() noexcept {
  const std::int64_t observed = weighted_quantile(samples_, n_samples_, c_.quantile);
  const bool met = observed <= c_.target_ns;
  metrics::target_window w = window_;
  w.windows = 1;
  w.windows_met = met ? 1 : 0;
  w.observed_ns = observed;
  // The rule: only on a window mostly cut under the current slack.
  if (fresh_ * 2 >= batches_in_window_) {
    const double before = slack_;
    if (!met)
      slack_ = std::max(min_slack, slack_ * decrease);
    else if (static_cast<double>(observed) <= raise_below * static_cast<double>(c_.target_ns))
      slack_ = std::min(1.0, slack_ + increase);
    if (slack_ != before) changed_at_ns_ = window_.end_ns;
  }
  w.slack = slack_;
  w.miss = met ? metrics::target_miss::none : why_missed(w);
  if (!met) {
    cause_.kind = w.miss;
    cause_.service_one_ns = one_item_ns();
    cause_.upstream_ns = upstream_ns();
    cause_.observed_ns = observed;
    cause_.wait_ns = static_cast<std::int64_t>(w.mean_wait_ns());
    cause_.mean_size = w.mean_size();
    cause_.rate_per_s = arrival_rate_per_s();
  }
  last_ = w;
  window_ = {};
  n_samples_ = 0;
  batches_in_window_ = 0;
  fresh_ = 0;
}

std::int64_t latency_controller::one_item_ns() const noexcept {
  return floor_one_ != 0 ? floor_one_ : service_ns(1);
}

metrics::target_miss latency_controller::why_missed(
    const metrics::target_window& w) const noexcept {
  if (upstream_ns() + one_item_ns() > c_.target_ns) return metrics::target_miss::infeasible;
  if (w.mean_size() >= 0.9 * static_cast<double>(c_.max_size))
    return metrics::target_miss::at_capacity;
  return metrics::target_miss::tail;
}

}  // namespace conveyor::detail
