// conveyor/stage/batch.hpp: group items into batches, and split batches back up.
//
//   conveyor::batch(64)                                   // fixed: 64 items, or fewer at the end
//   conveyor::batch(64).max_delay(std::chrono::milliseconds(2))   // dynamic: leave when full,
//                                                         //   or 2 ms after the first item came
//   conveyor::unbatch()                                   // std::vector<T> -> T, in order
//
// batch turns T into std::vector<T>. A fixed batch waits until it is full; a dynamic batch
// (Triton's dynamic batcher) also leaves when max_delay has passed since its first item,
// so a trickle of requests is not held back. A partial batch always leaves at the end of
// input and on stop(drain).
// Thread-safety: each runs on one thread of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/counters/batch_stats.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
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
  const std::string& name() const noexcept { return name_; }

 private:
  std::size_t max_size_;
  std::optional<std::chrono::nanoseconds> max_delay_;
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
        ring_name_("ring " + stage_.name()),
        track_(ctl_.make_track(stage_.name())) {}

  stage_info info() {
    stage_info i{stage_.name(), stage_kind::batch, in_->capacity(), &stats_};
    i.batches = &batches_;
    return i;
  }
  const metrics::batch_stats& batches() const noexcept { return batches_; }
  std::size_t max_size() const noexcept { return stage_.max_size(); }

  void start(thread_group& threads) {
    spawn_stage_thread(threads, [this] { run(); });
  }

 private:
  void run() noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, 0, track_, stage_.name().c_str(), ring_name_.c_str()};
    const std::size_t max = stage_.max_size();
    const auto delay = stage_.max_delay();
    const bool may_expire = ctl_.has_tickets();
    for (;;) {
      auto first = probe.pop(*in_);
      if (!first || ctl_.is_stopping()) {
        if (first) ctl_.cancel(first->items());
        break;
      }
      probe.occupancy(*in_);
      // A service's items whose deadline passed are dropped as they come, and again as
      // the batch leaves (they may expire while it fills).
      if (may_expire && drop_expired(ctl_, stats_, *first) == 0) continue;
      envelope<out_type> b{out_type{}, first->meta, {}};
      b.value.reserve(max);
      b.metas.reserve(max);
      add(b, std::move(*first));
      const auto deadline =
          std::chrono::steady_clock::now() + (delay ? *delay : std::chrono::nanoseconds::zero());
      bool timed_out = false;
      while (b.value.size() < max) {
        probe.busy();
        auto next = delay ? in_->pop_until(deadline) : in_->pop();
        probe.starved();
        if (!next) {
          timed_out = delay.has_value() && !in_->closed();
          break;
        }
        if (!may_expire || drop_expired(ctl_, stats_, *next) != 0) add(b, std::move(*next));
        // The ring may hand over an item after the deadline (its spin and yield phases
        // do not look at the clock, and on a busy core they can outlast the gap between
        // items): the batch still leaves now, or it would stay open for as long as items
        // keep coming.
        if (delay && b.value.size() < max && std::chrono::steady_clock::now() >= deadline) {
          timed_out = true;
          break;
        }
      }
      probe.busy();
      if (may_expire && drop_expired(ctl_, stats_, b) == 0) continue;
      const std::uint64_t n = b.items();
      batches_.record(b.value.size(), timed_out);
      probe.items(n);
      if (ctl_.is_stopping() || !probe.push(*out_, std::move(b))) {
        ctl_.cancel(n);
        break;
      }
    }
    out_->close();
  }

  static void validate(const batch_stage& s) {
    CONVEYOR_EXPECTS(s.max_size() >= 1 && s.max_size() <= max_batch_size,
                     "batch '" + s.name() + "': max size must be in [1, 2^20], got " +
                         std::to_string(s.max_size()));
    CONVEYOR_EXPECTS(!s.max_delay() || s.max_delay()->count() > 0,
                     "batch '" + s.name() +
                         "': max_delay must be positive; leave it unset "
                         "for fixed-size batches");
  }

  static void add(envelope<out_type>& b, envelope<In>&& item) {
    b.value.push_back(std::move(item.value));
    if (item.metas.empty()) {
      b.metas.push_back(item.meta);
    } else {
      // Batching a batch: the items keep their identities; the batch counts them all.
      b.metas.append(item.metas);
    }
  }

  batch_stage stage_;
  control& ctl_;
  link<In>* in_;
  link<out_type>* out_;
  metrics::stage_stats stats_;
  metrics::batch_stats batches_;
  std::string ring_name_;        // the trace counter of the input ring
  metrics::trace_track* track_;  // nullptr: no trace
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
          go_on = ctl_.fail_items(stage_.name(), stats_, b->meta, b->metas, b->items());
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
        envelope<out_type> e{std::move(b->value[i]), b->metas[pushed], {}};
        if (*split == per_element::inner_batch) e.metas.append(b->metas.begin() + pushed, k);
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
