// conveyor/stage/detail/latency_controller.hpp: how a batch stage with a latency target
// (batch(max).target_p99(d), target_p95(d)) decides, batch by batch, how long to wait and
// where to cut.
//
//   detail::latency_controller c{{.target_ns = 5'000'000, .quantile = 0.99, .max_size = 32}};
//   c.arrived(t, t - t0);                      // each item the batcher takes (t0: its entry)
//   std::int64_t leave = c.deadline(first_at, batch_size, backlog);  // < 0: leave now;
//                                              // hold: wait for more while the backlog lasts
//   c.cut(batch_size, c.wait_ns(1));           // a batch left
//   if (c.completed({n, cut_ns, done_ns, latency_ns})) log.record(c.last_window(), ...);
//
// Pure logic, deterministic: no clock, no thread. The batch stage feeds it now_ns()
// readings and the results that came back (detail::batch_feedback); a test feeds it a
// recorded or synthetic trace and gets the same decisions every time.
//
// The control rule. What it measures (moving averages, each sample weighted 1/2^shift):
//   s(n)   the time from a batch's cut to its first result, per batch size: one average
//          per power-of-two size bucket (1, 2-3, 4-7, ...) with the mean size it saw; a
//          size between measured ones is scaled linearly from the bucket below (a larger
//          batch costs at most proportionally more) or taken from the bucket above (a
//          smaller batch costs no more): both err towards a longer prediction. A bucket
//          without a sample in the last 4 windows gives way to fresh ones (its figure may
//          date from a stall, and while it says "too slow" no batch of its size comes to
//          correct it).
//   u      the time from an item's entry into the pipeline to its arrival at the batch.
//   gap    the time between arrivals at the batch (1/gap: the arrival rate, reported).
// The budget of the first (oldest) item of a batch, from its arrival at the batch to its
// result, is B = d - u. A batch holding k items leaves
//   - at once when k = max, or when a batch of k + 1 would not fit: s(k + 1) > B;
//   - else at its first item's arrival + slack * (B - s(k + 1)), or when full;
//   - but while there is a backlog (the ring after the batch still holds a batch that
//     the stages after it have not taken), it waits for more items until that one is
//     taken or it is full, whatever the two rules above say: leaving now would only queue
//     behind it.
// So the wait shrinks as the batch grows (a larger batch takes longer downstream), a
// batch is never cut larger than what the stages after it can serve within the target,
// and never larger than max. With no measurement yet, s = 0. The backlog rule is what
// keeps a service that falls behind (a stall, a burst) on full batches, its most
// efficient, until it has caught up: s includes the queueing after the batch, so when
// the stages after it fall behind s grows, and the first two rules alone would cut ever
// smaller batches, which fall further behind (a collapse).
// slack, in [min_slack, 1], covers what the averages miss (the tail of s, queueing after
// the batch, the spread of u). It changes once per window of window_batches batches
// whose results came back, from the window's measured latency at the target's percentile
// (each batch stands for its items: its first item's latency, measured at the end of
// the pipeline, spread down to its last item's by how much later that one arrived):
// over d: slack *= decrease (multiplicative decrease); at most raise_below * d:
// slack += increase (additive increase); between: unchanged (a dead band). A window
// whose batches were mostly cut before the last change (the change has not shown yet)
// changes nothing. That is AIMD with a dead band, on a signal averaged
// over a window: it cannot flip every batch, a step in the load moves the averages
// within a few dozen batches, and a violation costs at most one window before the
// budget shrinks by 30%.
//
// Thread-safety: none; one thread (the batcher's) owns it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "conveyor/counters/latency_target.hpp"

namespace conveyor::detail {

struct latency_target_config {
  std::int64_t target_ns = 0;  // d
  double quantile = 0.99;      // the percentile that must stay at or below d
  std::size_t max_size = 1;    // batches never hold more
};

// A batch whose first result came back.
struct batch_outcome {
  std::size_t size = 0;         // items in the batch
  std::int64_t cut_ns = 0;      // when it left the batch stage
  std::int64_t done_ns = 0;     // when its first item's result was delivered
  std::int64_t latency_ns = 0;  // that item's latency: entry into the pipeline to delivery
  // How much later than the first the batch's last item arrived at the batch: the
  // batch's items' latencies spread from latency_ns down to latency_ns - spread_ns.
  std::int64_t spread_ns = 0;
};

class latency_controller {
 public:
  static constexpr std::size_t window_batches = 32;
  static constexpr std::size_t points_per_batch = 8;
  static constexpr double initial_slack = 0.5;
  static constexpr double min_slack = 0.02;
  static constexpr double decrease = 0.7;
  static constexpr double increase = 0.05;
  static constexpr double raise_below = 0.7;

  explicit latency_controller(const latency_target_config& c) noexcept : c_(c) {}

  const latency_target_config& config() const noexcept { return c_; }

  // An item arrived at the batch at at_ns, upstream_ns after it entered the pipeline
  // (< 0: not known; the batch stage passes it for the first item of each batch).
  void arrived(std::int64_t at_ns, std::int64_t upstream_ns) noexcept {
    if (last_arrival_ns_ != 0 && at_ns >= last_arrival_ns_)
      gap_.add(static_cast<double>(at_ns - last_arrival_ns_), 4);
    last_arrival_ns_ = at_ns;
    if (upstream_ns >= 0) upstream_.add(static_cast<double>(upstream_ns), 3);
  }

  // The predicted time from the cut of a batch of n items to its first result.
  std::int64_t service_ns(std::size_t n) const noexcept;
  static constexpr std::uint64_t stale_after = 4 * window_batches;  // results

  // The first item's budget from its arrival at the batch to its result: d - u.
  std::int64_t budget_ns() const noexcept {
    return c_.target_ns - static_cast<std::int64_t>(upstream_.value);
  }

  // How long after its first item's arrival a batch holding `size` items may still
  // wait for more; < 0: it leaves now (see the control rule above).
  std::int64_t wait_ns(std::size_t size) const noexcept {
    if (size >= c_.max_size) return -1;
    const std::int64_t budget = budget_ns();
    const std::int64_t next = service_ns(size + 1);
    if (next > budget) return -1;
    return static_cast<std::int64_t>(slack_ * static_cast<double>(budget - next));
  }
  // What a batch whose first item arrived at first_at_ns and that holds `size` items
  // does now: leave (< 0), wait until the time returned for more items (then leave), or,
  // with a backlog after the batch, wait for more while the backlog lasts (hold).
  static constexpr std::int64_t hold = std::numeric_limits<std::int64_t>::max();
  std::int64_t deadline(std::int64_t first_at_ns, std::size_t size,
                        bool backlog = false) const noexcept {
    if (size >= c_.max_size) return -1;
    if (backlog) return hold;
    const std::int64_t w = wait_ns(size);
    return w < 0 ? -1 : first_at_ns + w;
  }

  // A batch of `size` items left; wait_ns: the budget it had at its first item
  // (wait_ns(1) then), for the window's record.
  void cut(std::size_t size, std::int64_t wait_ns) noexcept;

  // A batch's first result came back. true: that closed a window (last_window(),
  // last_cause()).
  bool completed(const batch_outcome& o) noexcept;

  double slack() const noexcept { return slack_; }
  double arrival_rate_per_s() const noexcept { return gap_.value > 0 ? 1e9 / gap_.value : 0.0; }
  std::int64_t upstream_ns() const noexcept { return static_cast<std::int64_t>(upstream_.value); }

  const metrics::target_window& last_window() const noexcept { return last_; }
  const metrics::target_miss_cause& last_cause() const noexcept { return cause_; }

  // The latency at quantile q of samples {latency, weight}: the least latency whose
  // samples (and the shorter ones) weigh at least q of the whole.
  struct sample {
    std::int64_t latency_ns = 0;
    double weight = 0;
  };
  // v: at least n samples; reorders the first n.
  static std::int64_t weighted_quantile(std::span<sample> v, std::size_t n, double q) noexcept;

 private:
  static constexpr std::size_t buckets = 22;  // sizes up to 2^21 - 1 (max is at most 2^20)
  static std::size_t bucket(std::size_t n) noexcept;

  // A moving average whose first sample sets it.
  struct average {
    double value = 0;
    bool seen = false;
    bool known() const noexcept { return seen; }
    void add(double x, int shift) noexcept {
      if (!seen) {
        value = x;
        seen = true;
        return;
      }
      value += (x - value) / static_cast<double>(1 << shift);
    }
  };
  struct service_bucket {
    average time;                   // cut -> first result
    average size;                   // the sizes it saw
    std::uint64_t last_result = 0;  // results_ at its last sample
    void add(double t, double n) noexcept {
      time.add(t, 2);
      size.add(n, 2);
    }
    // A batch of n from this bucket's figures: proportionally more above its mean size,
    // the same below.
    std::int64_t predict(std::size_t n) const noexcept;
  };

  void close_window() noexcept;
  // s(1) for a missed window's cause: the least one-item time seen, else the prediction.
  std::int64_t one_item_ns() const noexcept;

  metrics::target_miss why_missed(const metrics::target_window& w) const noexcept;

  latency_target_config c_;
  std::array<service_bucket, buckets> svc_{};
  average upstream_;
  average gap_;
  std::int64_t last_arrival_ns_ = 0;
  std::int64_t floor_one_ = 0;  // the least s(1) seen
  std::uint64_t results_ = 0;   // results that came back
  double slack_ = initial_slack;
  std::int64_t changed_at_ns_ = 0;  // when slack last changed (a result's return time)
  metrics::target_window window_{};
  std::array<sample, window_batches * points_per_batch> samples_{};
  std::size_t n_samples_ = 0;
  std::size_t batches_in_window_ = 0;
  std::size_t fresh_ = 0;  // samples of batches cut at or after changed_at_ns_
  metrics::target_window last_{};
  metrics::target_miss_cause cause_{};
};

}  // namespace conveyor::detail
