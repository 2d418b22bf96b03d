// conveyor/pipeline/detail/service.hpp: the tickets of a service pipeline: each submitted
// item holds one from submit() until its result, its error or its cancellation reaches
// the caller's future or callback, exactly once.
//
//   detail::check_service_capacity(n);                      // config_error unless it fits
//   detail::service_tickets<request, response> desk{1024, ctl};
//   std::uint32_t t = desk.take();                          // blocks while all are out
//   desk.enter(t, std::move(x), arm, input_link, ctl, 0);   // the item goes in under t
//   desk.deliver(result_envelope);                          // the result node's function
//   ctl.settle_alone(meta, error);                          // a stage: one item failed
//   desk.stop_delivering(ctl);                              // its last act: after a failure,
//                                                           // the rest fail now
//   desk.settle_rest(ctl);                                  // after join: the rest fail
//
// Settling: the result node delivers each result while it runs. An item that fails
// alone (error_policy::isolate) or expires is settled by the stage that found it, through
// control::settle_alone, which this class provides. Once the result node ends because a
// stage failed, no item still out will get a result, so it settles them all at once with
// that failure: a client's future does not wait for stop() or wait(). An item entering
// while that happens is settled by exactly one of its enter() and stop_delivering() (see
// enter()). After a stop() or a drain, the thread in stop() or wait() settles what is
// left once every thread has joined (settle_rest()): by then an item that was failing as
// the stop came has recorded its failure, and gets it rather than closed_error.
//
// Thread-safety: take(), take_until(), try_take() and enter() from any number of
// submitting threads; deliver() and then stop_delivering() from the result node's one
// thread; settle_alone() from any stage thread; settle_rest() after every stage thread
// has joined. Exactly one of the racers settles each item (the exchange on in_use).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <type_traits>
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

// What submit(x, d) takes as a deadline rather than as a callback.
template <class T>
inline constexpr bool is_chrono_v = false;
template <class Rep, class Period>
inline constexpr bool is_chrono_v<std::chrono::duration<Rep, Period>> = true;
template <class Clock, class Duration>
inline constexpr bool is_chrono_v<std::chrono::time_point<Clock, Duration>> = true;
template <class T>
inline constexpr bool is_deadline_v = is_chrono_v<std::remove_cvref_t<T>>;

// input<T>().capacity(n): how many items a service holds at once (its tickets, and the
// slots of its input ring). @throws config_error unless n is a power of two in [2, 2^30].
void check_service_capacity(std::size_t n);

// Why the pipeline stopped, for the messages of refused items and calls: "because stage
// 'decode' failed on item 17: ..." (the first error's message), or empty: nothing failed.
std::string failure_reason(const control& ctl);

// The error of an item the pipeline stopped before accepting: closed_error, with
// failure_reason() when a stage failed.
std::exception_ptr not_accepted_error(const control& ctl);

// The error a stranded item gets: the first stage failure, or closed_error.
std::exception_ptr stop_error(const control& ctl);

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
    ctl.settle_alone = [this](const item_meta& m, std::exception_ptr e) noexcept {
      settle_alone(static_cast<std::uint32_t>(m.id), std::move(e));
    };
  }

  // A free ticket, which bounds the items in flight. nullopt: the service stopped.
  // @note blocks while every ticket is out.
  std::optional<std::uint32_t> take() { return free_.pop(); }
  // As take(), but nullopt at once when every ticket is out (or the service stopped).
  std::optional<std::uint32_t> try_take() { return free_.try_pop(); }
  // As take(), but nullopt once `deadline` passes first (or the service stopped).
  std::optional<std::uint32_t> take_until(std::chrono::steady_clock::time_point deadline) {
    return free_.pop_until(deadline);
  }

  // arm(slot) sets the ticket's promise or callback, then x enters the pipeline through
  // `input` under it. If arming or wrapping x throws (bad_alloc in a std::function, a
  // throwing move), the ticket goes back unused: nothing is counted, no callback runs,
  // and the pipeline keeps its capacity. If the pipeline stopped first (the input refuses
  // x), the item is settled here with closed_error; if the result node stopped
  // delivering as x went in, by whichever of this call and stop_delivering() sees the
  // other's flag.
  template <class Arm>
  void enter(std::uint32_t ticket, In&& x, Arm&& arm, link<In>& input, control& ctl,
             std::int64_t deadline_ns) {
    slot& s = slots_[ticket];
    std::optional<envelope<In>> e;
    try {
      arm(s);
      // The item's id is its ticket; its number and entry time go with the ticket.
      ctl.enter_ticket(ticket, next_seq_.fetch_add(1, std::memory_order_relaxed),
                       ctl.metrics_on ? now_ns() : 0, deadline_ns);
      e.emplace(envelope<In>{std::move(x), item_meta{ticket}});
    } catch (...) {
      s.done = nullptr;
      (void)free_.try_push(std::uint32_t{ticket});  // never full: one slot per ticket
      throw;
    }
    // seq_cst: the store half of a store-then-load pair with stop_delivering() (Dekker):
    // here in_use is stored, then settling_ loaded (below); there settling_ is stored,
    // then in_use loaded. In the single total order of seq_cst operations one of the two
    // stores comes first, so at least one side sees the other's: an item that enters as
    // the result node stops is never missed by both (if both see, the exchange on in_use
    // picks one). As a release, it also makes the promise or callback that arm() wrote
    // visible to a settler whose load of in_use reads this store.
    s.in_use.store(true, std::memory_order_seq_cst);
    ctl.produced.fetch_add(1, std::memory_order_relaxed);  // relaxed: read after join
    // release (via the ring's push): the promise or callback written before is visible
    // to whichever thread pops this envelope and settles it.
    if (!input.push(std::move(*e))) {
      ctl.cancel(1);
      settle(s, [&ctl] { return not_accepted_error(ctl); });
      (void)free_.try_push(std::uint32_t{ticket});  // never full: one slot per ticket
      return;
    }
    // seq_cst: the load half of the pair above. true: the result node delivers no more
    // (settling_ is stored after its last delivery, by it or after join; this load,
    // reading that store, acquires it), and that pass over the tickets may have missed
    // this one. The item stays in the ring until the threads join (then counted as
    // cancelled), and its ticket out of circulation (the free list is closed by then,
    // or about to be).
    if (settling_.load(std::memory_order_seq_cst)) settle(s, [&ctl] { return stop_error(ctl); });
  }

  // The result node's function: settles the item's future or callback with its result.
  void deliver(envelope<Result>& e) {
    if (e.metas.is_list())
      throw error(
          "a service pipeline must deliver one result per submitted item; end "
          "the chain with unbatch() after a batch");
    const auto ticket = static_cast<std::uint32_t>(e.meta().id);  // see detail::item_meta
    slot& s = slots_[ticket];
    // No claim needed: nothing else settles an item that reaches here. enter() settles
    // only items the input refused, or items that entered once settling_ was set, which
    // this thread does after its last delivery (stop_delivering()).
    s.succeed(std::move(e.value));
    s.in_use.store(false, std::memory_order_relaxed);  // relaxed: the ring push publishes
    free_.push(std::uint32_t{ticket});
  }

  // A stage found that the item under `ticket` will get no result (it failed alone, or
  // expired): its future or callback gets e now, on this thread, and the ticket goes
  // back to the free list.
  void settle_alone(std::uint32_t ticket, std::exception_ptr e) noexcept {
    if (!settle(slots_[ticket], [&e] { return std::move(e); })) return;  // a stop's pass did
    (void)free_.try_push(std::uint32_t{ticket});  // never full; closed: the service stopped
  }

  // The result node's last act, on its thread once it delivers no more. If a stage
  // failed, every item still out will never get a result: each is settled now with that
  // failure. Otherwise (a stop(), a drain) settle_rest() settles the rest after join.
  void stop_delivering(const control& ctl) noexcept {
    // The failure is visible here if it stopped the pipeline: its capture precedes the
    // stop (control::fail_current()) that this thread saw, by the acquire of the
    // stopping flag or of a closed ring, before it stopped delivering. (Were it not,
    // settle_rest() would still settle every item, only later.)
    if (ctl.error.failed()) settle_now(ctl);
  }

  // After every stage thread has joined: closes the free list and settles what is still
  // out with the error that stopped the pipeline, or closed_error (cancelled).
  void settle_rest(const control& ctl) noexcept {
    free_.close();
    settle_now(ctl);
  }

  std::size_t size() const noexcept { return slots_.size(); }

 private:
  // Settles every item still out (see stop_delivering() and settle_rest()).
  void settle_now(const control& ctl) noexcept {
    // seq_cst: the store half of the pair with enter() (see there): an enter() whose
    // store of in_use this pass does not see will see this store, and settle its item.
    settling_.store(true, std::memory_order_seq_cst);
    std::exception_ptr why;  // made once, shared by every item it settles
    for (slot& s : slots_)
      // seq_cst: the load half of the pair with enter(). A ticket seen free here that an
      // enter() takes afterwards is that enter()'s to settle.
      if (s.in_use.load(std::memory_order_seq_cst))
        settle(s, [&] { return why ? why : (why = stop_error(ctl)); });
  }

  // Settles s with make_error() if this thread is the one that takes in_use from true to
  // false (acq_rel: exactly one of the racing settlers does, and acquire makes the
  // promise or callback that arm() wrote before its seq_cst store visible to it). Returns
  // whether it was.
  template <class MakeError>
  static bool settle(slot& s, MakeError&& make_error) {
    if (!s.in_use.exchange(false, std::memory_order_acq_rel)) return false;
    s.fail(make_error());
    return true;
  }

  mpmc_ring<std::uint32_t> free_;
  std::vector<slot> slots_;
  std::atomic<std::uint64_t> next_seq_{0};
  // Set once the result node delivers no more (see stop_delivering()).
  std::atomic<bool> settling_{false};
};

}  // namespace conveyor::detail
