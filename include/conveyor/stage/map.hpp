// conveyor/stage/map.hpp: a CPU stage with N worker threads.
//
//   auto prep = conveyor::map([](image im) { return normalize(decode(im)); })
//                   .workers(3)        // three threads share the input
//                   .ordered()         // restore input order after them (bounded window)
//                   .name("decode+normalize");
//
// The function takes the previous stage's output by value (or const&/&&) and returns the
// next stage's input. With several workers, items leave in completion order unless
// .ordered() is set; then they leave in the order they arrived, with at most a reorder
// window of items held back: a worker waits before starting an item that far ahead of
// the oldest one still in flight. The window is the input ring's capacity (at least
// 4 x workers + 60, rounded up to a power of two), so the stage may hold one ring's worth
// of items besides its ring.
// Where the stage before takes items in order from one thread (a source, a batch, a
// one-worker map, or an ordered map on lanes itself) and the stage after pops from one
// thread or is such a map, an ordered map runs on lanes instead (detail/link.hpp): item
// n goes to worker n % workers through a ring of its own, and leaves through another,
// so the order keeps itself with no shared write between the workers. A worker then runs about a
// ring's capacity of items ahead of a stalled one, and each of its lanes holds up to the
// ring's capacity.
// Thread-safety: the function is called concurrently from all workers; it must be safe
// for that (a pure function is).
#pragma once

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/base/power_of_two.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/counters/nvtx.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/link.hpp"
#include "conveyor/stage/detail/reorder_buffer.hpp"
#include "conveyor/stage/detail/worker_probe.hpp"

namespace conveyor {

namespace detail {
// True when F can take an In rvalue and returns a value. invoke_result_t is named only
// once invocability is known, so a mismatch yields `false` (and the readable
// static_assert in check_connection) instead of a hard error inside <type_traits>.
template <class F, class In>
constexpr bool invocable_with_value() {
  if constexpr (std::is_invocable_v<F&, In&&>)
    return !std::is_void_v<std::invoke_result_t<F&, In&&>>;
  else
    return false;
}
}  // namespace detail

template <class F>
class map_stage {
 public:
  // The stage accepts In when the function can be called with an In rvalue and returns
  // a value (not void: a stage that consumes without output is a sink).
  template <class In>
  static constexpr bool accepts = detail::invocable_with_value<F, In>();
  template <class In>
  using output = std::decay_t<std::invoke_result_t<F&, In&&>>;

  explicit map_stage(F fn) : fn_(std::move(fn)) {}

  // @throws config_error (at pipeline construction) for 0 or more than 1024 workers.
  map_stage& workers(std::size_t n) & {
    workers_ = n;
    return *this;
  }
  map_stage&& workers(std::size_t n) && {
    workers_ = n;
    return std::move(*this);
  }
  map_stage& ordered(bool on = true) & {
    ordered_ = on;
    return *this;
  }
  map_stage&& ordered(bool on = true) && {
    ordered_ = on;
    return std::move(*this);
  }
  map_stage& name(std::string n) & {
    name_ = std::move(n);
    return *this;
  }
  map_stage&& name(std::string n) && {
    name_ = std::move(n);
    return std::move(*this);
  }

  std::size_t workers() const noexcept { return workers_; }
  bool is_ordered() const noexcept { return ordered_; }
  const std::string& name() const noexcept { return name_; }
  F& function() noexcept { return fn_; }

 private:
  F fn_;
  std::size_t workers_ = 1;
  bool ordered_ = false;
  std::string name_ = "map";
};

template <class F>
map_stage<std::decay_t<F>> map(F&& fn) {
  return map_stage<std::decay_t<F>>(std::forward<F>(fn));
}

namespace detail {

template <class F, class In>
class map_node {
 public:
  using out_type = typename map_stage<F>::template output<In>;

  map_node(map_stage<F> stage, control& ctl, link<In>* in, link<out_type>* out)
      : stage_(std::move(stage)),
        ctl_(ctl),
        in_(in),
        out_(out),
        stats_((check_workers(stage_.name(), stage_.workers()), stage_.workers())),
        ring_name_(ring_track_name(stage_.name())) {
    for (std::size_t w = 0; w < stage_.workers(); ++w)
      tracks_.push_back(ctl_.make_track(worker_track_name(stage_.name(), w, stage_.workers())));
    // One worker keeps the input order by itself (it pops and pushes in FIFO order):
    // only several need the reorder window, and its per-item handshakes. The window is
    // as deep as the input ring: when one worker is preempted holding the oldest item
    // (more threads than cores), the others go on for a ring's worth of items, about
    // what one time slice gets through, instead of stopping a few dozen items later
    // and spinning on a core the preempted worker needs.
    // On lanes (see detail/link.hpp: the pipeline chose them for both of this stage's
    // rings) each worker has its own lane in and out, and the order keeps itself.
    CONVEYOR_EXPECTS(!lanes_ || out_->is_lanes(),
                     "conveyor internal error: a map on lanes needs lanes behind it too; "
                     "please report it");
    if (stage_.is_ordered() && stage_.workers() > 1 && !lanes_) {
      const std::size_t least = next_power_of_two(4 * stage_.workers() + 60);
      const std::size_t window = in_->capacity() > least ? in_->capacity() : least;
      reorder_.emplace(window, out_, ctl_);
      ctl_.on_stop([this] { reorder_->wake(); });
    }
  }

  stage_info info() { return {stage_.name(), stage_kind::map, in_->capacity(), &stats_}; }

  // After join: items held in the reorder window are cancelled.
  void after_join() noexcept {
    if (reorder_) ctl_.cancel(reorder_->discard());
  }

  void start(thread_group& threads) {
    may_expire_ = ctl_.has_tickets();                          // set up by now
    live_.store(stats_.workers(), std::memory_order_relaxed);  // relaxed: before spawn
    for (std::size_t w = 0; w < stats_.workers(); ++w)
      spawn_stage_thread(threads, [this, w] { lanes_ ? run_lanes(w) : run(w); });
  }

 private:
  // A worker on its own lanes: pop, call, push, the loop of a one-worker stage.
  void run_lanes(std::size_t w) noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, w, tracks_[w], stage_.name().c_str(), ring_name_.c_str()};
    auto in = in_->lane_port(w);
    auto out = out_->lane_port(w);
    while (auto v = probe.pop(in)) {
      probe.occupancy(in);
      std::uint64_t n = v->items();
      if (ctl_.is_stopping()) {
        ctl_.cancel(n);
        break;
      }
      // Lanes are chosen only where nothing is dropped (see pipeline_options::errors):
      // each lane's next element is the next item of its count.
      std::optional<out_type> r;
      if (apply(probe, *v, r, n) != step::done) break;
      probe.done(1, n);
      if (!probe.emplace(out, std::move(*r), std::move(v->metas))) {
        ctl_.cancel(n);
        break;
      }
    }
    leave();
  }

  void run(std::size_t w) noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, w, tracks_[w], stage_.name().c_str(), ring_name_.c_str()};
    const bool ordered = reorder_.has_value();
    // An item taken without the reorder window: through the function and downstream.
    // false: the worker stops (the pipeline is stopping, the function threw, or the
    // ring behind the stage closed), the item accounted for.
    bool stopped = false;
    // The inputs forward() passed through the function, and their items, not counted yet:
    // counted once per burst (worker_probe::done()).
    std::uint32_t done = 0;
    std::uint64_t done_items = 0;
    const auto forward = [&](envelope<In>&& in) noexcept CONVEYOR_HOT_LAMBDA {
      std::uint64_t n = in.items();
      std::optional<out_type> out;
      if (ctl_.is_stopping()) {
        ctl_.cancel(n);
      } else if (const step r = apply(probe, in, out, n); r == step::done) {
        ++done;
        done_items += n;
        if (probe.emplace(*out_, std::move(*out), std::move(in.metas))) return true;
        ctl_.cancel(n);  // what apply() left of them
      } else if (r == step::dropped) {
        return true;
      }
      stopped = true;
      return false;
    };
    // The one worker of an SPSC link takes what its ring holds in bursts, and waits
    // (pops) only when it holds nothing (see worker_probe::drain).
    const bool bursts = !ordered && in_->can_drain();
    const auto count = [&]() noexcept CONVEYOR_HOT_LAMBDA {
      probe.done(done, done_items);
      done = 0;
      done_items = 0;
    };
    for (;;) {
      if (bursts && probe.drain(*in_, forward) != 0) {
        count();
        if (stopped) break;
        continue;
      }
      std::size_t pos = 0;
      auto in = probe.pop(*in_, ordered ? &pos : nullptr);
      if (!in) break;
      probe.occupancy(*in_);
      if (!ordered) {
        const bool more = forward(std::move(*in));
        count();
        if (!more) break;
        continue;
      }
      // Waiting for the reorder window counts as waiting for input.
      const auto wait_for_window = [&](auto&& wait) {
        return probe.wait_as(worker_probe::wait_for::input, wait);
      };
      if (ctl_.is_stopping() || !reorder_->admit(pos, wait_for_window)) {
        ctl_.cancel(in->items());
        break;
      }
      std::optional<out_type> out;
      std::uint64_t n = in->items();
      const step r = apply(probe, *in, out, n);
      if (r == step::stop) break;
      if (r == step::done) probe.done(1, n);
      // Depositing may emit downstream, through this worker's probe.
      const auto push = [&](envelope<out_type>&& e) { return probe.push(*out_, std::move(e)); };
      if (r == step::dropped) {
        reorder_->skip(pos, push);  // the items after it do not wait for it
        continue;
      }
      reorder_->deposit(pos, envelope<out_type>{std::move(*out), std::move(in->metas)}, push);
    }
    leave();
  }

  // What became of one input: its result is in `out`; it left nothing (it failed alone,
  // or expired); or the worker stops (it failed and the pipeline stops).
  enum class step { done, dropped, stop };

  // Calls the function on one input into `out`; the caller counts the work of a done one
  // (per input, or once per burst: worker_probe::done()). A service's items whose
  // deadline passed expire first (see drop_expired()). A failure is recorded and
  // handled by the error policy (control::fail_items()). The result stays out of an
  // envelope until it goes downstream: emplace() builds the envelope in the ring's slot
  // (see worker_probe::emplace). `out` is the caller's: an optional returned by value
  // here was copied through the stack, and the load behind that copy stalled on the store.
  // n: the input's items, counted once by the caller; apply() leaves there those left
  // after expiry (fewer where some of a batch expired).
  CONVEYOR_HOT_INLINE step apply(worker_probe& probe, envelope<In>& in,
                                 std::optional<out_type>& out, std::uint64_t& n) noexcept {
    if (may_expire_) {
      n = drop_expired(ctl_, stats_, in);
      if (n == 0) [[unlikely]] {
        probe.busy();
        return step::dropped;
      }
    }
    try {
      metrics::nvtx_range range{probe.span_name()};
      out.emplace(stage_.function()(std::move(in.value)));
    } catch (...) {
      probe.busy();
      return ctl_.fail_items(stage_.name(), stats_, in.metas, n) ? step::dropped : step::stop;
    }
    return step::done;
  }

  void leave() noexcept {
    // acq_rel: the last worker out closes the ring behind the stage, after every
    // worker's pushes (release by each, acquire by the last).
    if (live_.fetch_sub(1, std::memory_order_acq_rel) == 1) out_->close();
  }

  map_stage<F> stage_;
  control& ctl_;
  link<In>* in_;
  link<out_type>* out_;
  metrics::stage_stats stats_;
  std::string ring_name_;                      // the trace counter of the input ring
  std::vector<metrics::trace_track*> tracks_;  // one per worker; nullptr: no trace
  const bool lanes_ = in_->is_lanes() && stage_.workers() > 1;
  std::optional<reorder_buffer<out_type>> reorder_;
  bool may_expire_ = false;  // a service's items carry deadlines (set in start())
  std::atomic<std::size_t> live_{0};
};

}  // namespace detail
}  // namespace conveyor
