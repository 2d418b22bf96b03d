// conveyor/runtime/host/event.hpp: the host runtime's event, a marker in a stream that
// completes when the stream's thread reaches it.
//
//   conveyor::host::event done{conveyor::event_timing::enabled};
//   done.record(s);                  // async: a marker behind everything enqueued on s
//   other.ref().wait(done);          // other's later work waits for the marker
//   if (!done.query()) done.synchronize();   // poll, then block
//   float ms = elapsed_ms(start, done);      // both timing-enabled and completed
//
// An event never recorded counts as complete. Re-recording moves the event to the new
// marker; waits issued before keep waiting for the old one. An event reached behind a
// stream's sticky error carries that error from then on: synchronize() and query()
// rethrow it, and a stream that waits on it inherits it. Destroying an event with a
// record still pending is safe.
// Thread-safety: every member from any thread. Records issued concurrently from two
// threads race for which one is the latest, as in CUDA; hand the event over (a ring, a
// join) when the order matters, as slot_pool does.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/base/cpu_relax.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/runtime/detail/host_stream_state.hpp"
#include "conveyor/runtime/event_timing.hpp"
#include "conveyor/runtime/host/stream.hpp"

namespace conveyor::host {

using conveyor::event_timing;

class event {
 public:
  event() : event(event_timing::disabled) {}
  explicit event(event_timing t, event_wait w = event_wait::block)
      : state_(std::make_shared<detail::host_event_state>(t == event_timing::enabled)),
        spin_(w == event_wait::spin) {}

  event(event&&) noexcept = default;
  event& operator=(event&&) noexcept = default;
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() = default;

  // Places a marker at the end of s's queue; never blocks (unless the queue is full).
  void record(stream_ref s) {
    const std::uint64_t gen = state_->done.next();
    s.native()->push(detail::host_task{[st = state_, gen](detail::host_stream_state& stream) {
      st->set_error(stream.error());
      if (st->timing) st->stamp();
      st->done.complete(gen);
    }});
  }

  // True once the stream reached the latest record; never blocks.
  // @throws the error of the stream the event completed on, if that stream had failed.
  bool query() const {
    if (!state_->done.reached(state_->done.last_claimed())) return false;
    if (std::exception_ptr e = state_->error()) std::rethrow_exception(e);
    return true;
  }

  // @note blocks until the latest record completed: asleep (event_wait::block, the
  // default) or polling (spin).
  // @throws the error of the stream the event completed on, if that stream had failed.
  void synchronize() const {
    if (spin_) {
      while (!query()) conveyor::detail::cpu_relax();
      return;
    }
    state_->done.wait(state_->done.last_claimed());
    if (std::exception_ptr e = state_->error()) std::rethrow_exception(e);
  }

  bool timing_enabled() const noexcept { return state_->timing; }
  detail::host_event_state* native() const noexcept { return state_.get(); }

  // @throws config_error unless both events have timing enabled; error unless both were
  // recorded and have completed.
  friend float elapsed_ms(const event& start, const event& end) {
    return std::chrono::duration<float, std::milli>(between(start, end, "elapsed_ms")).count();
  }
  // The same, exact: host events keep their clock's ticks (CUDA's elapsed time is a float
  // of milliseconds). event_clock uses it where a runtime offers it. @throws as elapsed_ms.
  friend std::int64_t elapsed_ns(const event& start, const event& end) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(between(start, end, "elapsed_ns"))
        .count();
  }

 private:
  friend class stream_ref;
  static detail::host_event_state::clock::duration between(const event& start, const event& end,
                                                           const char* what) {
    CONVEYOR_EXPECTS(start.timing_enabled() && end.timing_enabled(),
                     std::string(what) + ": create both events with event_timing::enabled");
    using clock = detail::host_event_state::clock;
    const bool done = start.query() && end.query();
    const clock::rep t0 = start.state_->when(), t1 = end.state_->when();
    if (!done || t0 == detail::host_event_state::no_time || t1 == detail::host_event_state::no_time)
      throw error(std::string(what) +
                  ": both events must have been recorded and completed; synchronize() the end "
                  "event first");
    return clock::duration(t1 - t0);
  }
  std::shared_ptr<detail::host_event_state> state_;
  bool spin_ = false;
};

inline void stream_ref::wait(const event& e) const {
  const std::uint64_t gen = e.state_->done.last_claimed();
  if (gen == 0) return;  // never recorded: nothing to wait for
  state_->push(detail::host_task{[st = e.state_, gen](detail::host_stream_state& s) {
    if (!s.failed()) s.wait_for(*st, gen);
  }});
}

}  // namespace conveyor::host
