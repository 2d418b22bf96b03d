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
// so the order keeps itself with no shared write between the workers (the trivial
// benchmark with 2 workers per map: ~10 -> ~17 M items/s). A worker then runs about a
// ring's capacity of items ahead of a stalled one, and each of its lanes holds up to the
// ring's capacity.
// Thread-safety: the function is called concurrently from all workers; it must be safe
// for that (a pure function is).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/counters/nvtx.hpp"
#include "conveyor/ring/detail/storage.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/stage/detail/context.hpp"

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
  map_stage& workers(std::size_t n) & { workers_ = n; return *this; }
  map_stage&& workers(std::size_t n) && { workers_ = n; return std::move(*this); }
  map_stage& ordered(bool on = true) & { ordered_ = on; return *this; }
  map_stage&& ordered(bool on = true) && { ordered_ = on; return std::move(*this); }
  map_stage& name(std::string n) & { name_ = std::move(n); return *this; }
  map_stage&& name(std::string n) && { name_ = std::move(n); return std::move(*this); }

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

inline constexpr std::size_t max_workers = 1024;

inline void check_workers(const std::string& stage, std::size_t n) {
  CONVEYOR_EXPECTS(n >= 1 && n <= max_workers,
                   "stage '" + stage + "': workers must be in [1, 1024], got " +
                       std::to_string(n) + "; pass .workers(1) or more (usually <= cores)");
}

// Restores input order behind parallel workers. Worker with input position p deposits
// its result in slot p % window; whoever deposits the oldest missing position becomes
// the emitter and pushes every consecutive ready result downstream. A worker may start
// position p only when p < emitted + window, so the buffer never overflows and the
// oldest item can always be deposited (no deadlock).
template <class T>
class reorder_buffer {
 public:
  // window: a power of two (a slot is found with a mask, not a division per item).
  reorder_buffer(std::size_t window, link<T>* out, control& ctl)
      : window_(window), mask_(window - 1), slots_(window), out_(out), ctl_(ctl) {
    CONVEYOR_EXPECTS(window >= 2 && (window & (window - 1)) == 0,
                     "conveyor internal error: a reorder window must be a power of two >= 2, "
                     "got " + std::to_string(window) + "; please report it");
  }

  // Blocks until position p may be deposited; false if the pipeline is stopping. A wait
  // runs through wait_via(w), which must call w(timing) (timing may be null): the
  // caller's metrics measure it (worker_probe::wait_as).
  template <class WaitVia>
  bool admit(std::size_t p, WaitVia&& wait_via) noexcept {
    auto ok = [&] {
      // acquire: pairs with the release store of emitted_ in emit().
      return p < emitted_.load(std::memory_order_acquire) + window_ || ctl_.is_stopping();
    };
    if (!ok()) {
      wait_via([&](wait_timing* timing) noexcept {
        room_.wait(ok, timing);
        return true;
      });
    }
    return !ctl_.is_stopping();
  }
  bool admit(std::size_t p) noexcept {
    return admit(p, [](auto&& wait) noexcept { return wait(nullptr); });
  }

  // Stores the result for position p (admitted) and emits whatever became consecutive,
  // through push(envelope<T>&&) -> bool: a push downstream that blocks while there is no
  // room, false once the ring is closed (the caller's, so its metrics see the wait).
  template <class Push>
  void deposit(std::size_t p, envelope<T>&& v, Push&& push) noexcept {
    slot& s = slots_[p & mask_];
    s.value.emplace(std::move(v));
    // seq_cst: Dekker with the emitter's release of emitting_ and its re-check of this
    // slot in emit(): either it sees this store, or our exchange below sees it gone.
    s.ready.store(p + 1, std::memory_order_seq_cst);
    emit(push);
  }
  void deposit(std::size_t p, envelope<T>&& v) noexcept {
    deposit(p, std::move(v), [this](envelope<T>&& e) noexcept { return out_->push(std::move(e)); });
  }

  // Wakes admit() waiters after a stop.
  void wake() noexcept { room_.notify(); }

  void close_output() noexcept { out_->close(); }

  // After every thread has joined: drops what is still held back (a stop left a gap
  // before it) and returns how many items that was, for the cancelled count.
  std::uint64_t discard() noexcept {
    std::uint64_t n = 0;
    for (slot& s : slots_) {
      if (s.value) n += s.value->items();
      s.value.reset();
      s.ready.store(0, std::memory_order_relaxed);  // relaxed: no other thread is left
    }
    return n;
  }

 private:
  struct slot {
    std::atomic<std::size_t> ready{0};  // position + 1 of the value held, 0 if none
    std::optional<envelope<T>> value;
  };

  template <class Push>
  void emit(Push& push) noexcept {
    for (;;) {
      // acquire: pairs with the release store of emitting_ below by the previous
      // emitter; its writes to next_ and the slots are visible to us.
      if (emitting_.exchange(true, std::memory_order_seq_cst)) return;  // someone emits
      std::size_t next = next_;
      for (;;) {
        slot& s = slots_[next & mask_];
        // acquire: pairs with the store of ready in deposit(); the value is written.
        if (s.ready.load(std::memory_order_acquire) != next + 1) break;
        envelope<T> v = std::move(*s.value);
        s.value.reset();
        s.ready.store(0, std::memory_order_relaxed);  // relaxed: only the emitter reads it next
        ++next;
        next_ = next;
        // release: pairs with the acquire in admit(); the slot is free for reuse.
        emitted_.store(next, std::memory_order_release);
        room_.notify();
        const std::uint64_t n = v.items();
        if (!push(std::move(v))) ctl_.cancel(n);  // stopping: the rest is drained later
      }
      // seq_cst: see deposit(); after releasing, re-check the slot we stopped at, since
      // its depositor may have found emitting_ still set and left it to us.
      emitting_.store(false, std::memory_order_seq_cst);
      if (slots_[next & mask_].ready.load(std::memory_order_seq_cst) != next + 1) return;
    }
  }

  const std::size_t window_;
  const std::size_t mask_;  // window_ - 1
  std::vector<slot> slots_;
  link<T>* out_;
  control& ctl_;
  std::size_t next_ = 0;  // emitter only (guarded by emitting_)
  alignas(cache_line_size) std::atomic<bool> emitting_{false};
  alignas(cache_line_size) std::atomic<std::size_t> emitted_{0};
  detail::wait_point room_;
};

template <class F, class In>
class map_node {
 public:
  using out_type = typename map_stage<F>::template output<In>;

  map_node(map_stage<F> stage, control& ctl, link<In>* in, link<out_type>* out)
      : stage_(std::move(stage)), ctl_(ctl), in_(in), out_(out),
        stats_((check_workers(stage_.name(), stage_.workers()), stage_.workers())),
        ring_name_("ring " + stage_.name()) {
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
    if (stage_.is_ordered() && stage_.workers() > 1 && !lanes_) {
      const std::size_t window =
          std::max(in_->capacity(), next_power_of_two(4 * stage_.workers() + 60));
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
    live_.store(stats_.workers(), std::memory_order_relaxed);  // relaxed: before spawn
    for (std::size_t w = 0; w < stats_.workers(); ++w)
      threads.spawn([this, w] { lanes_ ? run_lanes(w) : run(w); });
  }

 private:
  // A worker on its own lanes: pop, call, push, the loop of a one-worker stage.
  void run_lanes(std::size_t w) noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, w, tracks_[w], stage_.name().c_str(),
                       ring_name_.c_str()};
    auto in = in_->port(w);
    auto out = out_->port(w);
    while (auto v = probe.pop(in)) {
      probe.occupancy(in);
      const std::uint64_t n = v->items();
      if (ctl_.is_stopping()) {
        ctl_.cancel(n);
        break;
      }
      std::optional<out_type> r;
      if (!apply(probe, *v, r)) break;
      if (!probe.emplace(out, std::move(*r), v->meta, std::move(v->metas))) {
        ctl_.cancel(n);
        break;
      }
    }
    leave();
  }

  void run(std::size_t w) noexcept {
    ctl_.await_gate();
    worker_probe probe{ctl_, stats_, w, tracks_[w], stage_.name().c_str(),
                       ring_name_.c_str()};
    const bool ordered = reorder_.has_value();
    // An item taken without the reorder window: through the function and downstream.
    // false: the worker stops (the pipeline is stopping, the function threw, or the
    // ring behind the stage closed), the item accounted for.
    bool stopped = false;
    const auto forward = [&](envelope<In>&& in) noexcept {
      const std::uint64_t n = in.items();
      std::optional<out_type> out;
      if (ctl_.is_stopping()) {
        ctl_.cancel(n);
      } else if (apply(probe, in, out)) {
        if (probe.emplace(*out_, std::move(*out), in.meta, std::move(in.metas))) return true;
        ctl_.cancel(n);
      }
      stopped = true;
      return false;
    };
    // The one worker of an SPSC link takes what its ring holds in bursts, and waits
    // (pops) only when it holds nothing (see worker_probe::drain).
    const bool bursts = !ordered && in_->can_drain();
    for (;;) {
      if (bursts && probe.drain(*in_, forward) != 0) {
        if (stopped) break;
        continue;
      }
      std::size_t pos = 0;
      auto in = probe.pop(*in_, ordered ? &pos : nullptr);
      if (!in) break;
      probe.occupancy(*in_);
      if (!ordered) {
        if (!forward(std::move(*in))) break;
        continue;
      }
      // Waiting for the reorder window counts as waiting for input.
      const auto wait_for_window = [&](auto&& wait) { return probe.wait_as(worker_probe::wait_for::input, wait); };
      if (ctl_.is_stopping() || !reorder_->admit(pos, wait_for_window)) {
        ctl_.cancel(in->items());
        break;
      }
      std::optional<out_type> out;
      if (!apply(probe, *in, out)) break;
      // Depositing may emit downstream, through this worker's probe.
      reorder_->deposit(pos, envelope<out_type>{std::move(*out), in->meta, std::move(in->metas)},
                        [&](envelope<out_type>&& e) { return probe.push(*out_, std::move(e)); });
    }
    leave();
  }

  // Calls the function on one input into `out` and counts the work; false if it threw
  // (the failure is recorded: the pipeline stops). The result stays out of an envelope
  // until it goes downstream: emplace() builds the envelope in the ring's slot (see
  // worker_probe::emplace). `out` is the caller's: an optional returned by value here
  // was copied through the stack with a store-forwarding stall (perf: half of a trivial
  // map's samples on that one load).
  CONVEYOR_HOT_INLINE bool apply(worker_probe& probe, envelope<In>& in,
                                 std::optional<out_type>& out) noexcept {
    try {
      metrics::nvtx_range range{probe.span_name()};
      out.emplace(stage_.function()(std::move(in.value)));
    } catch (...) {
      probe.busy();
      ctl_.fail_current(stage_.name(), in.meta, in.items());
      return false;
    }
    probe.work_done();
    probe.items(in.items());
    return true;
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
  std::atomic<std::size_t> live_{0};
};

}  // namespace detail
}  // namespace conveyor
