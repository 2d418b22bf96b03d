// conveyor/stage/source.hpp: where items come from.
//
//   auto frames = conveyor::source([&]() -> std::optional<frame> { return camera.next(); });
//   auto nums   = conveyor::from_range(std::views::iota(0, 1000));    // a range works too
//   auto svc    = conveyor::input<request>().capacity(256);          // items arrive by submit()
//
// A source runs on one thread and calls its function until it returns std::nullopt (end
// of input); that closes the ring behind it, and the stages after it drain and finish.
// `input<T>()` starts a service pipeline instead: no thread, items come from submit().
// Thread-safety: the function is called from one thread at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <iterator>
#include <optional>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/counters/nvtx.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/link.hpp"
#include "conveyor/stage/detail/worker_probe.hpp"

namespace conveyor {

namespace detail {
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
}  // namespace detail

template <class F>
class source_stage {
  static_assert(std::is_invocable_v<F&>, "conveyor::source: the function must take no arguments");
  static_assert(
      detail::is_optional<std::invoke_result_t<F&>>::value,
      "conveyor::source: the function must return std::optional<T> (nullopt ends the input)");

 public:
  using out_type = typename std::invoke_result_t<F&>::value_type;
  static constexpr bool starts_chain = true;  // see stage/concepts.hpp

  explicit source_stage(F fn) : fn_(std::move(fn)) {}
  source_stage& name(std::string n) & {
    name_ = std::move(n);
    return *this;
  }
  source_stage&& name(std::string n) && {
    name_ = std::move(n);
    return std::move(*this);
  }

  const std::string& name() const noexcept { return name_; }
  F& function() noexcept { return fn_; }

 private:
  F fn_;
  std::string name_ = "source";
};

// Items from a callable returning std::optional<T>; nullopt ends the input.
template <class F>
source_stage<std::decay_t<F>> source(F&& fn) {
  return source_stage<std::decay_t<F>>(std::forward<F>(fn));
}

// Items from a range, in order. The range is moved into the stage (views are cheap).
template <std::ranges::input_range R>
auto from_range(R&& range) {
  using value = std::ranges::range_value_t<R>;
  return source([r = std::forward<R>(range), it = std::optional<std::ranges::iterator_t<R>>{},
                 first = true]() mutable -> std::optional<value> {
    if (first) {
      it.emplace(std::ranges::begin(r));
      first = false;
    }
    if (*it == std::ranges::end(r)) return std::nullopt;
    std::optional<value> v{**it};
    ++*it;
    return v;
  });
}

// The head of a service pipeline: items arrive through pipeline::submit(). capacity(n):
// how many items the service holds at once, each from its submit() until it is settled
// (submit() waits, try_submit() refuses, while it holds n); a power of two in [2, 2^30],
// else the pipeline's constructor throws config_error. 1024 unless set.
template <class T>
class input_stage {
 public:
  using out_type = T;
  static constexpr bool starts_chain = true;  // see stage/concepts.hpp
  input_stage& capacity(std::size_t n) & {
    capacity_ = n;
    return *this;
  }
  input_stage&& capacity(std::size_t n) && {
    capacity_ = n;
    return std::move(*this);
  }
  std::size_t capacity() const noexcept { return capacity_; }
  const std::string& name() const noexcept { return name_; }

 private:
  std::size_t capacity_ = 1024;
  std::string name_ = "input";
};

template <class T>
input_stage<T> input() {
  return {};
}

namespace detail {

template <class F>
class source_node {
 public:
  using out_type = typename source_stage<F>::out_type;

  source_node(source_stage<F> stage, control& ctl, link<out_type>* out)
      : stage_(std::move(stage)),
        ctl_(ctl),
        out_(out),
        stats_(1),
        track_(ctl_.make_track(stage_.name())) {
    ctl_.count_productions_of(stats_);  // its item count is the produced count
  }
  // control keeps the address of stats_: built in place, never moved.
  source_node(const source_node&) = delete;
  source_node& operator=(const source_node&) = delete;

  stage_info info() { return {stage_.name(), stage_kind::source, 0, &stats_}; }

  void start(thread_group& threads) {
    spawn_stage_thread(threads, [this] { run(); });
  }

 private:
  void run() noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, 0, track_, stage_.name().c_str(), nullptr};
    const bool timed = probe.on();
    std::uint64_t seq = 0;
    // acquire: pairs with the release store in pipeline::stop(drain).
    while (!ctl_.is_stopping() && !ctl_.stop_source.load(std::memory_order_acquire)) {
      // The time between items outside the user function (a push that did not wait) is
      // charged as busy with the next call.
      std::optional<out_type> v;
      try {
        metrics::nvtx_range range{probe.span_name()};
        v = stage_.function()();
      } catch (...) {
        probe.busy();
        ctl_.fail_current(stage_.name(), seq, 0);  // no item was produced
        break;
      }
      probe.work_done();
      if (!v) break;
      probe.items(1);  // produced (control::produced_items())
      // entered: the end of the call; timed for a sample of the items (see
      // latency_sample_weight), its time kept in control for the terminal stage (the
      // push below publishes it). Per item a test on registers, the rest out of line
      // (as in the sink).
      if (timed && latency_sample_weight(seq) != 0) [[unlikely]]
        sampled(seq);
      const item_meta meta{seq++};
      if (!probe.emplace(*out_, std::move(*v), meta)) {
        ctl_.cancel(1);  // refused: the pipeline is stopping
        break;
      }
    }
    out_->close();
  }
  [[gnu::noinline]] void sampled(std::uint64_t seq) noexcept { ctl_.sampled(seq, now_ns()); }

  source_stage<F> stage_;
  control& ctl_;
  link<out_type>* out_;
  metrics::stage_stats stats_;
  metrics::trace_track* track_;  // nullptr: no trace
};

}  // namespace detail
}  // namespace conveyor
