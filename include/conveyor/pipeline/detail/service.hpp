// conveyor/pipeline/detail/service.hpp: the tickets of a service pipeline: each submitted
// item holds one from submit() until its result, its error or its cancellation reaches
// the caller's future or callback, exactly once.
//
//   detail::check_service_capacity(n);                      // config_error unless it fits
//   detail::service_tickets<request, response> desk{1024, ctl};
//   std::uint32_t t = desk.take();                          // blocks while all are out
//   desk.enter(t, std::move(x), arm, input_link, ctl);      // the item goes in under t
//   desk.deliver(std::move(result_envelope));               // the result node's function
//   desk.settle_rest(ctl);                                  // after join: the rest fail
//
// Thread-safety: take(), try_take() and enter() from any number of submitting threads;
// deliver() from the result node's one thread; settle_rest() after every stage thread has
// joined (it races only with enter() calls that lost their item to a stop, and exactly
// one of the two settles each item: see enter()).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/base/outcome.hpp"
#include "conveyor/base/power_of_two.hpp"
#include "conveyor/ring/mpmc_ring.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/link.hpp"

namespace conveyor::detail {

// input<T>().capacity(n): how many items a service holds at once (its tickets, and the
// slots of its input ring). @throws config_error unless n is a power of two in [2, 2^30].
inline void check_service_capacity(std::size_t n) {
  CONVEYOR_EXPECTS(n >= 2 && n <= max_ring_capacity && is_power_of_two(n),
                   "conveyor::input<T>().capacity(n): n is how many items the service holds at "
                   "once and must be a power of two in [2, 2^30], got " +
                       std::to_string(n) + "; pass " + std::to_string(next_power_of_two(n)) +
                       " (or leave it out: 1024)");
}

template <class In, class Result>
class service_tickets {
 public:
  // One submitted item's way back: its future's promise, or its callback. in_use is
  // true from submit() until the item is settled; exactly one thread settles it.
  struct slot {
    std::promise<Result> promise;                 // submit(x)
    std::function<void(outcome<Result>&&)> done;  // submit(x, done); else empty
    std::atomic<bool> in_use{false};

    void succeed(Result&& v) {
      if (done)
        std::exchange(done, nullptr)(outcome<Result>::success(std::move(v)));
      else
        promise.set_value(std::move(v));
    }
    void fail(std::exception_ptr e) {
      if (done)
        std::exchange(done, nullptr)(outcome<Result>::failure(std::move(e)));
      else
        promise.set_exception(std::move(e));
    }
  };

  // `tickets` items may be inside at once (see check_service_capacity()); the input ring
  // must have a slot for each.
  service_tickets(std::size_t tickets, control& ctl)
      : free_(next_power_of_two(tickets)), slots_(tickets) {
    ctl.use_tickets(slots_.size());
    for (std::uint32_t t = 0; t < slots_.size(); ++t) (void)free_.try_push(t);
    ctl.on_stop([this] { free_.close(); });
  }

  // A free ticket, which bounds the items in flight. nullopt: the service stopped.
  // @note blocks while every ticket is out.
  std::optional<std::uint32_t> take() { return free_.pop(); }
  // As take(), but nullopt at once when every ticket is out (or the service stopped).
  std::optional<std::uint32_t> try_take() { return free_.try_pop(); }

  // arm(slot) sets the ticket's promise or callback, then x enters the pipeline through
  // `input` under it. If arming or wrapping x throws (bad_alloc in a std::function, a
  // throwing move), the ticket goes back unused: nothing is counted, no callback runs,
  // and the pipeline keeps its capacity. If the pipeline stopped first, the item is
  // settled here as cancelled.
  template <class Arm>
  void enter(std::uint32_t ticket, In&& x, Arm&& arm, link<In>& input, control& ctl) {
    slot& s = slots_[ticket];
    std::optional<envelope<In>> e;
    try {
      arm(s);
      // The item's id is its ticket; its number and entry time go with the ticket.
      ctl.enter_ticket(ticket, next_seq_.fetch_add(1, std::memory_order_relaxed),
                       ctl.metrics_on ? now_ns() : 0);
      e.emplace(envelope<In>{std::move(x), {ticket}, {}});
    } catch (...) {
      s.done = nullptr;
      (void)free_.try_push(std::uint32_t{ticket});  // never full: one slot per ticket
      throw;
    }
    // release: pairs with the acq_rel exchange in settle_rest(); if a stop() racing this
    // call settles the item from its own thread, it sees the promise or callback that
    // arm() wrote.
    s.in_use.store(true, std::memory_order_release);
    ctl.produced.fetch_add(1, std::memory_order_relaxed);  // relaxed: read after join
    // release (via the ring's push): the promise or callback written before is visible
    // to whichever thread pops this envelope and settles it.
    if (!input.push(std::move(*e))) {
      ctl.cancel(1);
      // Exactly one of this call and settle_rest() settles the item: whichever takes
      // in_use from true to false (acq_rel: pairs with the exchange there, so the loser
      // sees the winner's claim).
      if (s.in_use.exchange(false, std::memory_order_acq_rel))
        s.fail(std::make_exception_ptr(
            closed_error("conveyor::pipeline: stopped before the item was accepted")));
      (void)free_.try_push(std::uint32_t{ticket});  // never full: one slot per ticket
    }
  }

  // The result node's function: settles the item's future or callback with its result.
  void deliver(envelope<Result>&& e) {
    if (!e.metas.empty())
      throw error(
          "a service pipeline must deliver one result per submitted item; end "
          "the chain with unbatch() after a batch");
    const auto ticket = static_cast<std::uint32_t>(e.meta.id);  // see detail::item_meta
    slot& s = slots_[ticket];
    s.succeed(std::move(e.value));
    s.in_use.store(false, std::memory_order_relaxed);  // relaxed: the ring push publishes
    free_.push(std::uint32_t{ticket});
  }

  // After every stage thread has joined: settles what is still out with the error that
  // stopped the pipeline, or as cancelled.
  void settle_rest(const control& ctl) {
    free_.close();
    for (slot& s : slots_)
      if (s.in_use.exchange(false, std::memory_order_acq_rel))  // see enter()
        s.fail(ctl.error.failed() ? ctl.error.get()
                                  : std::make_exception_ptr(closed_error(
                                        "conveyor::pipeline: the item was cancelled")));
  }

  std::size_t size() const noexcept { return slots_.size(); }

 private:
  mpmc_ring<std::uint32_t> free_;
  std::vector<slot> slots_;
  std::atomic<std::uint64_t> next_seq_{0};
};

}  // namespace conveyor::detail
