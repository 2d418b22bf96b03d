// conveyor/stage/sink.hpp: where items leave the pipeline.
//
//   auto out = conveyor::sink([&](label l) { results.push_back(l); });      // one thread
//   auto db  = conveyor::sink([&](row r) { db.insert(r); }).workers(4);     // four threads
//
// A sink with one worker sees items in the order the stage before it emits them (so
// after an ordered map, in input order). An item counts as completed when the sink's
// function returns; its latency is measured from when it entered the pipeline.
// Thread-safety: with several workers the function is called concurrently.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/counters/nvtx.hpp"
#include "conveyor/stage/detail/batch_feedback.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/link.hpp"
#include "conveyor/stage/detail/reorder_buffer.hpp"
#include "conveyor/stage/detail/worker_probe.hpp"

namespace conveyor {

template <class F>
class sink_stage {
 public:
  template <class In>
  static constexpr bool accepts = std::is_invocable_v<F&, In&&>;
  template <class In>
  using output = void;

  explicit sink_stage(F fn) : fn_(std::move(fn)) {}
  sink_stage& workers(std::size_t n) & {
    workers_ = n;
    return *this;
  }
  sink_stage&& workers(std::size_t n) && {
    workers_ = n;
    return std::move(*this);
  }
  sink_stage& name(std::string n) & {
    name_ = std::move(n);
    return *this;
  }
  sink_stage&& name(std::string n) && {
    name_ = std::move(n);
    return std::move(*this);
  }

  std::size_t workers() const noexcept { return workers_; }
  const std::string& name() const noexcept { return name_; }
  F& function() noexcept { return fn_; }

 private:
  F fn_;
  std::size_t workers_ = 1;
  std::string name_ = "sink";
};

template <class F>
sink_stage<std::decay_t<F>> sink(F&& fn) {
  return sink_stage<std::decay_t<F>>(std::forward<F>(fn));
}

namespace detail {

// The end of a pipeline: calls `deliver(envelope&)` for each arriving envelope on
// `workers` threads (it may take the value; the metas stay for the accounting), with the accounting every end shares. Deliver returns normally
// when the item completed; a throw fails the item (and, unless the error policy
// isolates failures, the pipeline). A Deliver with a
// noexcept stopped_delivering() has it called by each worker as the worker ends.
template <class In, class Deliver>
class terminal_node {
 public:
  terminal_node(std::string name, std::size_t workers, Deliver deliver, control& ctl, link<In>* in,
                latency_recorder* latency)
      : name_(std::move(name)),
        deliver_(std::move(deliver)),
        ctl_(ctl),
        in_(in),
        latency_(latency),
        stats_((check_workers(name_, workers), workers)),
        ring_name_(ring_track_name(name_)) {
    for (std::size_t w = 0; w < workers; ++w)
      tracks_.push_back(ctl_.make_track(worker_track_name(name_, w, workers)));
    ctl_.count_completions_of(stats_);  // why not a shared counter: see there
  }
  // control keeps the address of stats_: built in place, never moved.
  terminal_node(const terminal_node&) = delete;
  terminal_node& operator=(const terminal_node&) = delete;

  stage_info info() { return {name_, stage_kind::sink, in_->capacity(), &stats_}; }
  Deliver& deliver() noexcept { return deliver_; }

  void start(thread_group& threads) {
    for (std::size_t w = 0; w < stats_.workers(); ++w)
      spawn_stage_thread(threads, [this, w] { run(w); });
  }

 private:
  void run(std::size_t w) noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, w, tracks_[w], name_.c_str(), ring_name_.c_str()};
    // Whether this worker records latencies, and whether every item was timed (a
    // service's, by its ticket) or a sample of them (a source pipeline's: by id).
    const bool timed = latency_ != nullptr && probe.on();
    const bool every_item = ctl_.has_tickets();
    // A batch stage with a latency target hears when its batches' first items come out.
    batch_feedback* const feedback = ctl_.feedback;
    // One item: delivered, its latency recorded. false: the worker stops (the pipeline
    // is stopping, or the delivery threw), the item accounted for.
    bool stopped = false;
    // The inputs delivered, and their items, not counted yet: counted once per burst
    // (worker_probe::done()).
    std::uint32_t done = 0;
    std::uint64_t done_items = 0;
    const auto deliver_one = [&](envelope<In>&& in) noexcept CONVEYOR_HOT_LAMBDA {
      const std::uint64_t n = in.items();
      if (ctl_.is_stopping()) {
        ctl_.cancel(n);
        stopped = true;
        return false;
      }
      const item_meta meta = in.meta();
      const meta_list& metas = in.metas;  // deliver() takes the value, leaves the metas
      // A single item's entry time is looked up before delivering it: a service's
      // delivery frees the item's ticket, where the time is kept (control::entered()).
      // Batches reach only a source pipeline's sinks, whose times stay put. Per item a
      // test on registers; the lookup and the record, for timed items only, out of line:
      // inline, with the test reading control every item, they made a sink of trivial
      // items the slowest stage of its core with metrics on.
      control::entry_time single{};
      if (timed && !metas.is_list() && (every_item || latency_sample_weight(meta.id) != 0))
          [[unlikely]]
        single = entry_of(meta);
      std::optional<batch_feedback::sent_batch> first_of_batch;
      if (feedback != nullptr) [[unlikely]]
        first_of_batch = feedback->claim(ctl_.seq_of(meta));
      try {
        metrics::nvtx_range range{probe.span_name()};
        deliver_(in);
      } catch (...) {
        probe.busy();
        if (ctl_.fail_items(name_, stats_, metas, n)) return true;  // failed alone
        stopped = true;
        return false;
      }
      ++done;
      done_items += n;  // counts as completed: see control::count_completions_of
      if (first_of_batch) [[unlikely]]
        feedback->returned(*first_of_batch, now_ns());
      if (timed && (single.t0_ns != 0 || metas.is_list())) [[unlikely]]
        record_latencies(single, metas);
      return true;
    };
    const auto count = [&]() noexcept CONVEYOR_HOT_LAMBDA {
      probe.done(done, done_items);
      done = 0;
      done_items = 0;
    };
    // The one worker of an SPSC link takes what its ring holds in bursts, and waits
    // (pops) only when it holds nothing (see worker_probe::drain).
    const bool bursts = in_->can_drain();
    for (;;) {
      if (bursts && probe.drain(*in_, deliver_one) != 0) {
        count();
        if (stopped) break;
        continue;
      }
      auto in = probe.pop(*in_);
      if (!in) break;
      probe.occupancy(*in_);
      const bool more = deliver_one(std::move(*in));
      count();
      if (!more) break;
    }
    // A Deliver that settles what it will never deliver (a service's result node: see
    // pipeline/detail/service.hpp) hears that this worker delivers no more; with one
    // worker, nothing is delivered after it.
    if constexpr (requires { deliver_.stopped_delivering(); }) deliver_.stopped_delivering();
  }

  [[gnu::noinline]] control::entry_time entry_of(const item_meta& meta) const noexcept {
    return ctl_.entered(meta);
  }
  // Right after a delivery: the latency of a timed single item (its entry looked up
  // before), or of each timed item of a batch.
  [[gnu::noinline]] void record_latencies(const control::entry_time& single,
                                          const meta_list& metas) noexcept {
    std::int64_t t = 0;  // the end of deliver(), read once for the timed items
    const auto record = [&](const control::entry_time& e) {
      if (e.t0_ns == 0) return;  // not timed (or its sample was overwritten)
      if (t == 0) t = now_ns();
      latency_->record(t - e.t0_ns, e.weight);
    };
    if (!metas.is_list()) return record(single);
    for (const item_meta& m : metas) record(ctl_.entered(m));
  }

  std::string name_;
  Deliver deliver_;
  control& ctl_;
  link<In>* in_;
  latency_recorder* latency_;
  metrics::stage_stats stats_;
  std::string ring_name_;                      // the trace counter of the input ring
  std::vector<metrics::trace_track*> tracks_;  // one per worker; nullptr: no trace
};

template <class F, class In>
auto make_sink_node(sink_stage<F> stage, control& ctl, link<In>* in, latency_recorder* latency) {
  auto deliver = [fn = std::move(stage.function())](envelope<In>& e) mutable {
    fn(std::move(e.value));
  };
  return terminal_node<In, decltype(deliver)>(stage.name(), stage.workers(), std::move(deliver),
                                              ctl, in, latency);
}

}  // namespace detail
}  // namespace conveyor
