// conveyor/stage/batch.hpp: group items into batches, and split batches back up.
//
//   conveyor::batch(64)                                   // fixed: 64 items, or fewer at the end
//   conveyor::batch(64).max_delay(std::chrono::milliseconds(2))   // dynamic: leave when full,
//                                                         //   or 2 ms after the first item came
//   conveyor::batch(64).target_p99(std::chrono::milliseconds(5))  // latency target: the
//                                                         //   batcher chooses wait and size
//   conveyor::unbatch()                                   // std::vector<T> -> T, in order
//
// batch turns T into std::vector<T>. A fixed batch waits until it is full; a dynamic batch
// (Triton's dynamic batcher) also leaves when max_delay has passed since its first item,
// so a trickle of requests is not held back. A partial batch always leaves at the end of
// input and on stop(drain).
// A batch with a latency target (target_p99(d) or target_p95(d), instead of max_delay)
// chooses, batch by batch, how long to wait and how large to cut (never above max), from
// the time the stages after it took per batch size, the time items take to reach it, and
// the items' latency from entry to delivery at the pipeline's end, so that the items' P99
// (P95) stays at or below d with batches as large as that allows. The rule is stated in
// stage/detail/latency_controller.hpp; the report shows the sizes and waits it chose over
// time and whether the target was met (report::latency_target). One batch stage per
// pipeline may have a target.
// Thread-safety: each runs on one thread of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/counters/batch_stats.hpp"
#include "conveyor/counters/latency_target.hpp"
#include "conveyor/stage/detail/batch_feedback.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/latency_controller.hpp"
#include "conveyor/stage/detail/link.hpp"
#include "conveyor/stage/detail/worker_probe.hpp"

namespace conveyor {

class batch_stage {
 public:
  template <class In>
  static constexpr bool accepts = std::is_move_constructible_v<In>;
  template <class In>
  using output = std::vector<In>;

  explicit batch_stage(std::size_t max_size) : max_size_(max_size) {}
  batch_stage& max_delay(std::chrono::nanoseconds d) & {
    max_delay_ = d;
    return *this;
  }
  batch_stage&& max_delay(std::chrono::nanoseconds d) && {
    max_delay_ = d;
    return std::move(*this);
  }
  // A latency target instead of a fixed delay: the items' P99 (target_p99) or P95
  // (target_p95) latency, from entry into the pipeline to delivery at its end, at or
  // below d. Set one target, and no max_delay.
  batch_stage& target_p99(std::chrono::nanoseconds d) & { return set_target(d, 0.99); }
  batch_stage&& target_p99(std::chrono::nanoseconds d) && { return std::move(set_target(d, 0.99)); }
  batch_stage& target_p95(std::chrono::nanoseconds d) & { return set_target(d, 0.95); }
  batch_stage&& target_p95(std::chrono::nanoseconds d) && { return std::move(set_target(d, 0.95)); }
  batch_stage& name(std::string n) & {
    name_ = std::move(n);
    return *this;
  }
  batch_stage&& name(std::string n) && {
    name_ = std::move(n);
    return std::move(*this);
  }

  std::size_t max_size() const noexcept { return max_size_; }
  std::optional<std::chrono::nanoseconds> max_delay() const noexcept { return max_delay_; }
  // The latency target and its percentile (0.99 or 0.95); nullopt: none.
  std::optional<std::chrono::nanoseconds> target() const noexcept { return target_; }
  double target_quantile() const noexcept { return quantile_; }
  // How many targets were set (more than one is a config_error at construction).
  int targets_set() const noexcept { return targets_set_; }
  const std::string& name() const noexcept { return name_; }

 private:
  batch_stage& set_target(std::chrono::nanoseconds d, double q) {
    target_ = d;
    quantile_ = q;
    ++targets_set_;
    return *this;
  }

  std::size_t max_size_;
  std::optional<std::chrono::nanoseconds> max_delay_;
  std::optional<std::chrono::nanoseconds> target_;
  double quantile_ = 0.99;
  int targets_set_ = 0;
  std::string name_ = "batch";
};

// Fixed-size batches of max_size items (dynamic with .max_delay()).
inline batch_stage batch(std::size_t max_size) { return batch_stage(max_size); }

class unbatch_stage {
 public:
  template <class In>
  static constexpr bool accepts = detail::is_vector_v<In>;
  template <class In>
  using output = typename In::value_type;

  unbatch_stage& name(std::string n) & {
    name_ = std::move(n);
    return *this;
  }
  unbatch_stage&& name(std::string n) && {
    name_ = std::move(n);
    return std::move(*this);
  }
  const std::string& name() const noexcept { return name_; }

 private:
  std::string name_ = "unbatch";
};

inline unbatch_stage unbatch() { return {}; }

namespace detail {

inline constexpr std::size_t max_batch_size = std::size_t{1} << 20;

template <class In>
class batch_node {
 public:
  using out_type = std::vector<In>;

  batch_node(batch_stage stage, control& ctl, link<In>* in, link<out_type>* out)
      : stage_(std::move(stage)),
        ctl_(ctl),
        in_(in),
        out_(out),
        stats_((validate(stage_), 1)),
        batches_(stage_.max_size()),
        ring_name_(ring_track_name(stage_.name())),
        track_(ctl_.make_track(stage_.name())) {
    if (const auto d = stage_.target()) {
      CONVEYOR_EXPECTS(ctl_.feedback == nullptr,
                       "batch '" + stage_.name() +
                           "': only one batch stage of a pipeline may have a latency target; "
                           "give the other batch stages max_delay instead");
      target_ = std::make_unique<targeted>(
          latency_target_config{d->count(), stage_.target_quantile(), stage_.max_size()});
      ctl_.feedback = &target_->feedback;
    }
  }

  stage_info info() {
    stage_info i{stage_.name(), stage_kind::batch, in_->capacity(), &stats_};
    i.batches = &batches_;
    if (target_) i.target = &target_->log;
    return i;
  }
  const metrics::batch_stats& batches() const noexcept { return batches_; }
  std::size_t max_size() const noexcept { return stage_.max_size(); }

  void start(thread_group& threads) {
    may_expire_ = ctl_.has_tickets();
    if (target_)
      spawn_stage_thread(threads, [this] { run(target_fill{*this}); });
    else
      spawn_stage_thread(threads, [this] { run(fixed_fill{*this}); });
  }

 private:
  // A batch stage with a latency target: its controller, the way back from the
  // pipeline's end, and what the report reads.
  struct targeted {
    explicit targeted(const latency_target_config& c)
        : controller(c), log(c.target_ns, c.quantile) {}
    latency_controller controller;
    batch_feedback feedback;
    metrics::latency_target_log log;
  };

  static std::chrono::steady_clock::time_point at(std::int64_t ns) noexcept {
    return std::chrono::steady_clock::time_point{
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::nanoseconds{ns})};
  }

  // While the ring after the batch holds a batch, the batch waits in steps of this long
  // (it looks at the ring again after each).
  static constexpr std::int64_t hold_step_ns = 50'000;

  // The loop both kinds of batch share: take a first item, open a batch with it, let
  // `fill` add to it until it leaves (fill.fill(probe, b) returns whether it left on
  // time rather than full), then send it on (fill.leaving(b) first). A service's items
  // whose deadline passed are dropped as they come, and again as the batch leaves (they
  // may expire while it fills).
  template <class Fill>
  void run(Fill fill) noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, 0, track_, stage_.name().c_str(), ring_name_.c_str()};
    for (;;) {
      auto first = probe.pop(*in_);
      if (!first || ctl_.is_stopping()) {
        if (first) ctl_.cancel(first->items());
        break;
      }
      probe.occupancy(*in_);
      if (may_expire_ && drop_expired(ctl_, stats_, *first) == 0) continue;
      envelope<out_type> b{out_type{}, meta_list{}};
      b.value.reserve(stage_.max_size());
      b.metas.reserve(stage_.max_size());
      add(b, std::move(*first));
      const bool timed_out = fill.fill(probe, b);
      probe.busy();
      if (may_expire_ && drop_expired(ctl_, stats_, b) == 0) continue;
      const std::uint64_t n = b.items();
      fill.leaving(b);
      batches_.record(b.value.size(), timed_out);
      probe.items(n);
      if (ctl_.is_stopping() || !probe.push(*out_, std::move(b))) {
        ctl_.cancel(n);
        break;
      }
    }
    out_->close();
  }

  // Takes an item into the batch unless it expired (a service's deadline).
  void take(envelope<out_type>& b, envelope<In>&& item) {
    if (!may_expire_ || drop_expired(ctl_, stats_, item) != 0) add(b, std::move(item));
  }

  // A fixed batch: full at max_size, or (with max_delay) when the delay has passed since
  // its first item.
  struct fixed_fill {
    batch_node& node;
    bool fill(worker_probe& probe, envelope<out_type>& b) noexcept {
      const std::size_t max = node.stage_.max_size();
      const auto delay = node.stage_.max_delay();
      const auto deadline =
          std::chrono::steady_clock::now() + (delay ? *delay : std::chrono::nanoseconds::zero());
      while (b.value.size() < max) {
        probe.busy();
        auto next = delay ? node.in_->pop_until(deadline) : node.in_->pop();
        probe.starved();
        if (!next) return delay.has_value() && !node.in_->closed();
        node.take(b, std::move(*next));
        // The ring may hand over an item after the deadline (its spin and yield phases
        // do not look at the clock, and on a busy core they can outlast the gap between
        // items): the batch still leaves now, or it would stay open for as long as items
        // keep coming.
        if (delay && b.value.size() < max && std::chrono::steady_clock::now() >= deadline)
          return true;
      }
      return false;
    }
    void leaving(const envelope<out_type>&) noexcept {}
  };

  // A batch with a latency target: it waits and is cut as the controller says
  // (detail/latency_controller.hpp), which learns from what comes back.
  struct target_fill {
    batch_node& node;
    latency_controller& lc = node.target_->controller;
    // The batch being filled: when its first item came, when that item entered the
    // pipeline, the wait budget the controller gave it, when its last item came.
    std::int64_t first_at = 0, t0 = 0, budget = 0, last_at = 0;

    bool fill(worker_probe& probe, envelope<out_type>& b) noexcept {
      control& ctl = node.ctl_;
      first_at = now_ns();
      while (const auto o = node.target_->feedback.take())
        if (lc.completed(*o)) node.target_->log.record(lc.last_window(), lc.last_cause());
      const control::entry_time entry = ctl.entered(b.meta());
      lc.arrived(first_at, entry.t0_ns != 0 ? first_at - entry.t0_ns : -1);
      // The first item's entry: measured, or estimated from the items before it.
      t0 = entry.t0_ns != 0 ? entry.t0_ns : first_at - lc.upstream_ns();
      budget = lc.wait_ns(1);
      std::int64_t now = first_at;
      last_at = first_at;
      for (;;) {
        // A backlog: the ring after the batch still holds a batch that the stages after
        // it have not taken (the controller then holds this one until that is taken).
        const bool backlog = node.out_->size_approx() != 0 && !ctl.is_stopping();
        const std::int64_t leave = lc.deadline(first_at, b.value.size(), backlog);
        if (leave < 0) return false;
        probe.busy();
        std::optional<envelope<In>> next;
        if (leave != latency_controller::hold && now < leave) {
          next = node.in_->pop_until(at(leave));
        } else {
          // Past the deadline the batch still takes what waits in the ring (those items
          // would only wait for the next batch); holding, it waits a step at a time and
          // looks at the backlog again.
          next = node.in_->try_pop();
          if (!next && leave == latency_controller::hold)
            next = node.in_->pop_until(at(now + hold_step_ns));
        }
        probe.starved();
        now = now_ns();
        if (!next) {
          if (node.in_->closed()) return false;
          if (leave == latency_controller::hold || now < leave) continue;
          return true;
        }
        lc.arrived(now, -1);
        last_at = now;
        node.take(b, std::move(*next));
      }
    }
    void leaving(const envelope<out_type>& b) noexcept {
      lc.cut(b.value.size(), budget);
      node.target_->feedback.sent(node.ctl_.seq_of(b.meta()),
                                  {now_ns(), t0, b.items(), last_at - first_at});
    }
  };

  static void validate(const batch_stage& s) {
    CONVEYOR_EXPECTS(s.max_size() >= 1 && s.max_size() <= max_batch_size,
                     "batch '" + s.name() + "': max size must be in [1, 2^20], got " +
                         std::to_string(s.max_size()));
    CONVEYOR_EXPECTS(!s.max_delay() || s.max_delay()->count() > 0,
                     "batch '" + s.name() +
                         "': max_delay must be positive; leave it unset "
                         "for fixed-size batches");
    if (!s.target()) return;
    CONVEYOR_EXPECTS(s.targets_set() == 1,
                     "batch '" + s.name() +
                         "': set one latency target, target_p99(d) or target_p95(d), not both");
    CONVEYOR_EXPECTS(s.target()->count() > 0, "batch '" + s.name() +
                                                  "': the latency target must be positive, got " +
                                                  std::to_string(s.target()->count()) + " ns");
    CONVEYOR_EXPECTS(!s.max_delay(),
                     "batch '" + s.name() +
                         "': set either max_delay (a fixed wait) or a latency target "
                         "(target_p99/target_p95: the batcher chooses the wait), not both");
  }

  static void add(envelope<out_type>& b, envelope<In>&& item) {
    b.value.push_back(std::move(item.value));
    b.metas.append(item.metas);  // a batch of batches: the items keep their identities
  }

  batch_stage stage_;
  control& ctl_;
  link<In>* in_;
  link<out_type>* out_;
  metrics::stage_stats stats_;
  metrics::batch_stats batches_;
  std::string ring_name_;             // the trace counter of the input ring
  metrics::trace_track* track_;       // nullptr: no trace
  std::unique_ptr<targeted> target_;  // null: no latency target
  bool may_expire_ = false;           // a service's items carry deadlines (set in start())
};

template <class In>
class unbatch_node {
 public:
  using out_type = typename In::value_type;

  unbatch_node(unbatch_stage stage, control& ctl, link<In>* in, link<out_type>* out)
      : stage_(std::move(stage)),
        ctl_(ctl),
        in_(in),
        out_(out),
        stats_(1),
        ring_name_("ring " + stage_.name()),
        track_(ctl_.make_track(stage_.name())) {}

  stage_info info() { return {stage_.name(), stage_kind::unbatch, in_->capacity(), &stats_}; }

  void start(thread_group& threads) {
    spawn_stage_thread(threads, [this] { run(); });
  }

 private:
  void run() noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, 0, track_, stage_.name().c_str(), ring_name_.c_str()};
    for (;;) {
      auto b = probe.pop(*in_);
      if (!b) break;
      probe.occupancy(*in_);
      const std::size_t n = b->value.size();
      if (ctl_.is_stopping()) {
        ctl_.cancel(b->items());
        break;
      }
      const auto split = split_items(*b);
      if (!split) {
        // A batch whose element count no longer matches its items (a map changed its
        // length): the items cannot be told apart any more.
        bool go_on = false;
        try {
          throw error("unbatch: the batch holds " + std::to_string(n) + " elements for " +
                      std::to_string(b->metas.size()) +
                      " items; a stage between batch and unbatch must keep one element per item");
        } catch (...) {
          go_on = ctl_.fail_items(stage_.name(), stats_, b->metas, b->items());
        }
        if (go_on) continue;  // the batch's items failed alone
        break;
      }
      probe.busy();
      std::size_t pushed = 0;  // items, not elements
      bool refused = false;
      for (std::size_t i = 0; i < n && !refused; ++i) {
        // An element that is itself a batch takes its items' identities along.
        const std::size_t k = *split == per_element::one ? 1 : items_in(b->value[i]);
        meta_list ids{b->metas[pushed]};
        if (*split == per_element::inner_batch) {
          ids = meta_list{};
          ids.append(b->metas.begin() + pushed, k);
        }
        envelope<out_type> e{std::move(b->value[i]), std::move(ids)};
        refused = !out_->push(std::move(e));
        if (!refused) {
          pushed += k;
          probe.items(k);
        }
      }
      probe.blocked();  // the pushes: splitting costs nothing next to waiting for room
      if (refused) {
        ctl_.cancel(b->items() - pushed);
        break;
      }
    }
    out_->close();
  }

  // How the batch's items map onto its elements: one item each, or (a batch of batches,
  // whose items the batch stage listed flat) as many as each inner batch holds.
  enum class per_element { one, inner_batch };
  static std::size_t items_in(const out_type& element) noexcept {
    if constexpr (is_vector_v<out_type>)
      return element.size();
    else
      return 1;
  }
  static std::optional<per_element> split_items(const envelope<In>& b) {
    const std::size_t items = b.metas.size();
    if (items == b.value.size()) return per_element::one;
    if constexpr (is_vector_v<out_type>) {
      std::size_t sum = 0;
      for (const out_type& inner : b.value) {
        if (inner.empty()) return std::nullopt;  // an empty inner batch holds no item
        sum += items_in(inner);
      }
      if (sum == items) return per_element::inner_batch;
    }
    return std::nullopt;
  }

  unbatch_stage stage_;
  control& ctl_;
  link<In>* in_;
  link<out_type>* out_;
  metrics::stage_stats stats_;
  std::string ring_name_;        // the trace counter of the input ring
  metrics::trace_track* track_;  // nullptr: no trace
};

}  // namespace detail
}  // namespace conveyor
