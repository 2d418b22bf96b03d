// conveyor/runtime/event_clock.hpp: a stream's event times on the host clock (now_ns()),
// in 64-bit nanoseconds, exact over runs of any length.
//
//   conveyor::event_clock<R::event> clock;      // owns the anchor event (timing enabled)
//   clock.anchor(stream);                       // before the run: record, wait, read now_ns()
//   ... a batch's timing events e0 .. e3 on that stream completed ...
//   const std::int64_t t0 = clock.to_ns(e0), t3 = clock.to_ns(e3);
//   clock.advance(e3, t3);   // once the anchor is a period (1 s) old, e3 becomes it
//
// Where the runtime has elapsed_ns() (the host runtime), conversions are exact. CUDA's
// elapsed_ms() is a float: 24 significant bits, so an event an hour after the anchor is
// known to ~0.25 ms and one a day after to ~8 ms. advance() keeps the anchor recent: it
// swaps the anchor event with a completed event whose time was just converted from the
// old anchor (so no new record and no wait), and the conversions that follow measure
// from there. With the 1 s period each conversion is exact to the float's ~61 ns step at
// 1 s, whatever the run's length: phase times and the gaps between batches stay exact
// to well under a microsecond. What accumulates is the anchor's own position: each
// advance adds one conversion's rounding (at most ~31 ns, and of either sign), a random
// walk of a few microseconds over a day of 1 s periods, below the drift between a GPU's
// clock and the host's.
// Thread-safety: one thread at a time (a lane's completion thread, after start()).
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "conveyor/base/clock.hpp"
#include "conveyor/runtime/event_timing.hpp"

namespace conveyor {

template <class Event>
class event_clock {
 public:
  static constexpr std::int64_t default_period_ns = 1'000'000'000;  // advance() at most 1/s

  explicit event_clock(std::int64_t period_ns = default_period_ns)
      : anchor_(event_timing::enabled), period_ns_(period_ns) {}

  // Records the anchor on s, waits for it, and pins it to now_ns().
  // @note blocks until s has run everything enqueued before. @throws the runtime's error.
  template <class StreamRef>
  void anchor(StreamRef s) {
    anchor_.record(s);
    anchor_.synchronize();
    set_anchor_ns(now_ns());
  }

  // The anchor event, and the host time at which it completed.
  Event& anchor_event() noexcept { return anchor_; }
  std::int64_t anchor_ns() const noexcept { return anchor_ns_; }
  void set_anchor_ns(std::int64_t host_ns) noexcept { anchor_ns_ = host_ns; }

  // e's time on the host clock; e and the anchor must have completed.
  // @throws the runtime's elapsed_ms() error otherwise.
  std::int64_t to_ns(const Event& e) const {
    if constexpr (requires {
                    { elapsed_ns(anchor_, e) } -> std::convertible_to<std::int64_t>;
                  })
      return anchor_ns_ + elapsed_ns(anchor_, e);  // exact where the runtime keeps ticks
    else
      return anchor_ns_ + ms_to_ns(static_cast<double>(elapsed_ms(anchor_, e)));
  }

  // When the anchor is at least a period older than e (e_ns: to_ns(e), just converted),
  // e becomes the anchor and the old anchor event goes into e, free to be recorded
  // again. Returns whether it did.
  bool advance(Event& e, std::int64_t e_ns) noexcept(std::is_nothrow_swappable_v<Event>) {
    if (e_ns - anchor_ns_ < period_ns_) return false;
    using std::swap;
    swap(anchor_, e);
    anchor_ns_ = e_ns;
    return true;
  }

 private:
  Event anchor_;
  std::int64_t anchor_ns_ = 0;
  std::int64_t period_ns_;
};

}  // namespace conveyor
