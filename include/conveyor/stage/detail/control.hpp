// conveyor/stage/detail/control.hpp: what every stage of one running pipeline shares: the
// stop signal and first error, the start gate, item accounting, the trace, and what each
// item's id stands for.
//
//   detail::control ctl{/*metrics=*/true, /*trace_events=*/4096};   // one per pipeline
//   ctl.on_stop([&] { ring.close(); });           // setup: what a stop must wake
//   ctl.await_gate();                             // each stage thread, before its loop
//   try { f(x); } catch (...) { ctl.fail_current("decode", meta, 1); }  // stops everything
//   try { f(x); } catch (...) { go_on = ctl.fail_items("decode", stats, meta, metas, 1); }
//   if (ctl.has_tickets() && ctl.is_expired(meta)) ctl.expire(stats, meta);  // a service's
//   if (ctl.is_stopping()) ...
//
// The members that are not on an item's path are compiled once, in the library
// (src/conveyor/control.cpp).
// Thread-safety: the atomics and fail_current()/fail_items()/expire()/stop()/cancel()
// from any thread; on_stop(), make_track(), use_tickets(), count_completions_of(),
// count_productions_of(), feedback, isolate_failures and settle_alone during setup only
// (before any stage thread runs).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/base/first_error.hpp"
#include "conveyor/counters/batch_stats.hpp"
#include "conveyor/counters/failure_log.hpp"
#include "conveyor/counters/lane_stats.hpp"
#include "conveyor/counters/latency_target.hpp"
#include "conveyor/counters/stage_stats.hpp"
#include "conveyor/counters/trace.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/latency_samples.hpp"
#include "conveyor/stage/detail/worker_registry.hpp"

namespace conveyor::detail {

using metrics::stage_kind;

class batch_feedback;  // stage/detail/batch_feedback.hpp

// What a running stage tells the report: its identity and its counters.
struct stage_info {
  stage_info(std::string n, stage_kind k, std::size_t capacity, const metrics::stage_stats* s)
      : name(std::move(n)), kind(k), input_capacity(capacity), stats(s) {}

  std::string name;
  stage_kind kind = stage_kind::map;
  std::size_t input_capacity = 0;  // 0: no input ring (a source)
  const metrics::stage_stats* stats = nullptr;
  metrics::gpu_stats* gpu = nullptr;                    // the GPU segment's lanes
  const metrics::batch_stats* batches = nullptr;        // a batch stage's fill
  const metrics::latency_target_log* target = nullptr;  // a batch stage's latency target
  std::string_view runtime;                             // the GPU segment's runtime name
};

// Shared by every stage of one pipeline run.
class control {
 public:
  // metrics: stages read the clock and keep busy / starved / blocked time, occupancy,
  // latency and lane timings (false: only item counts). trace_events: events kept per
  // trace track; 0 = no trace (needs metrics). @throws config_error on a bad combination.
  explicit control(bool measure = true, std::size_t trace_events = 0);
  ~control();
  control(const control&) = delete;
  control& operator=(const control&) = delete;

  const bool metrics_on;
  const std::unique_ptr<metrics::trace_buffer> trace;  // null: tracing off

  // Setup only: a new trace track, or nullptr when tracing is off.
  metrics::trace_track* make_track(std::string name);

  // Setup only: where stage workers register while they run (the pipeline's placer);
  // null: nobody asks.
  worker_registry* workers = nullptr;

  // Setup only: the batch stage with a latency target (at most one per pipeline), to
  // which the terminal stage reports when each batch's first item is delivered; null:
  // none.
  batch_feedback* feedback = nullptr;

  // What an item's id stands for (see item_meta). A service pipeline (submit()) has one
  // entry per ticket, written by submit() before the item enters the first ring and
  // read by the stage threads that pop it (the rings' release/acquire hops order the
  // two), rewritten only once the ticket has come back (after the result was delivered,
  // or after every thread has joined). A source pipeline has none.
  struct ticket_entry {
    std::uint64_t seq = 0;
    std::int64_t t0_ns = 0;        // 0: not timed (metrics off)
    std::int64_t deadline_ns = 0;  // on the now_ns() clock; 0: none
  };
  // Setup only: makes this a service pipeline's control, with `tickets` tickets.
  void use_tickets(std::size_t tickets) { tickets_.resize(tickets); }
  // submit() only, before the item enters: what ticket `ticket`'s item is.
  void enter_ticket(std::uint32_t ticket, std::uint64_t seq, std::int64_t t0_ns,
                    std::int64_t deadline_ns) noexcept {
    tickets_[ticket] = {seq, t0_ns, deadline_ns};
  }
  // A service item's deadline (0: none); a source pipeline's items have none.
  std::int64_t deadline_of(const item_meta& m) const noexcept {
    return tickets_.empty() ? 0 : tickets_[m.id].deadline_ns;
  }
  // Whether the item's deadline has passed (a clock read only for an item that has one).
  bool is_expired(const item_meta& m) const noexcept {
    const std::int64_t d = deadline_of(m);
    return d != 0 && now_ns() >= d;
  }
  // The item's sequence number (for errors: "item N").
  std::uint64_t seq_of(const item_meta& m) const noexcept {
    return tickets_.empty() ? m.id : tickets_[m.id].seq;
  }
  // When the item entered the pipeline (0: not timed) and how many items its latency
  // stands for. A service item's entry is its ticket's, which delivering its result
  // frees for the next submit(): ask before delivering it.
  struct entry_time {
    std::int64_t t0_ns = 0;
    std::uint32_t weight = 0;
  };
  // A service pipeline's: every item has a ticket, and each one is timed (with metrics).
  bool has_tickets() const noexcept { return !tickets_.empty(); }
  entry_time entered(const item_meta& m) const noexcept {
    if (!tickets_.empty()) return {tickets_[m.id].t0_ns, 1};
    const std::uint32_t weight = latency_sample_weight(m.id);
    if (weight == 0) return {};
    return {samples_.take(m.id), weight};
  }
  // The source thread only: item seq, a timed one, entered at t0_ns.
  void sampled(std::uint64_t seq, std::int64_t t0_ns) noexcept { samples_.put(seq, t0_ns); }

  std::atomic<bool> stopping{false};     // cancel or failure: stop taking new work
  std::atomic<bool> stop_source{false};  // drain: the source ends as if its input did
  first_error error;

  // Item accounting, without a locked instruction per item on the hot path (it would
  // drain the writer's store buffer behind the ring slots it just wrote): a source's
  // items are counted by the source stage itself (its item count; produced_items()
  // reads it), submit()'s in `produced` (its callers, who may be many, use fetch_add: a
  // pipeline has a source or an input, never both); completed is counted by the
  // terminal stage's workers, each in its own counter slot (the stage's item counts;
  // completed() sums them). failed and cancelled change once per failure or stop, so
  // fetch_add is fine there.
  alignas(cache_line_size) std::atomic<std::uint64_t> produced{0};
  alignas(cache_line_size) std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::uint64_t> expired{0};
  // The first failures (stage, item, message) and how many there were.
  metrics::failure_log failures;

  // Setup only: a stage's failure on an item fails that item alone (error_policy::isolate;
  // false: it stops the pipeline).
  bool isolate_failures = false;
  // Setup only, a service's: settles one item's future or callback with an error (an
  // item that failed alone, or expired), on the calling stage thread. It must hand the
  // item's ticket back. Empty in a source pipeline: such items are only counted.
  std::function<void(const item_meta&, std::exception_ptr)> settle_alone;

  // Setup only (before any stage thread runs): the source stage, whose item count is the
  // produced count of a source pipeline.
  void count_productions_of(const metrics::stage_stats& source) noexcept { productions_ = &source; }
  // Any thread: items that entered the pipeline (from its source, or by submit()); exact
  // after join.
  std::uint64_t produced_items() const noexcept {
    // relaxed: a counter read after join (exact) or as a snapshot.
    return produced.load(std::memory_order_relaxed) + (productions_ ? productions_->items() : 0);
  }
  // Setup only (before any stage thread runs): the stage whose items are the completed
  // ones. Each of its workers counts into its own slot after a successful delivery.
  void count_completions_of(const metrics::stage_stats& terminal) noexcept {
    completions_ = &terminal;
  }
  // Any thread: items delivered by the terminal stage; exact after join.
  std::uint64_t completed() const noexcept { return completions_ ? completions_->items() : 0; }

  // Registered at construction (before any thread runs): closes a ring, cancels a pool.
  void on_stop(std::function<void()> closer);

  // Stop taking work and wake every blocked thread. Idempotent.
  void stop() noexcept;

  // The start gate: every stage thread waits here until the pipeline has spawned all of
  // them, so the run's wall clock and every worker's phase clock start together, after
  // the spawning (milliseconds per thread under sanitizers) rather than during it.
  void open_gate() noexcept;
  // @note blocks the calling stage thread until open_gate().
  void await_gate() const noexcept;
  bool is_stopping() const noexcept { return stopping.load(std::memory_order_acquire); }

  // Call from inside a catch block: records the exception being handled, wrapped in a
  // stage_error naming the stage and the item, as the run's error if it is the first,
  // and stops everything. `items` were lost with it and count as failed.
  void fail_current(const std::string& stage, std::uint64_t item, std::uint64_t items) noexcept;
  // As above, for the item (or the batch: its first item) whose meta is `item`.
  void fail_current(const std::string& stage, const item_meta& item, std::uint64_t items) noexcept {
    fail_current(stage, seq_of(item), items);
  }

  // Call from inside a catch block, for the `items` items the stage threw on: `metas`
  // (one per item; the first names them in the error). Counted on `stats` either way. With
  // isolate_failures they fail alone: logged, counted as failed, each settled with the
  // stage_error (settle_alone), and the stage goes on: returns true. Otherwise as
  // fail_current() (the pipeline stops): returns false.
  bool fail_items(const std::string& stage, metrics::stage_stats& stats, const meta_list& metas,
                  std::uint64_t items) noexcept;

  // A service item whose deadline passed, found by `stats`'s stage before its work: it
  // counts as expired and its future or callback gets deadline_error.
  void expire(metrics::stage_stats& stats, const item_meta& m) noexcept;

  void cancel(std::uint64_t items) noexcept {
    cancelled.fetch_add(items, std::memory_order_relaxed);  // relaxed: read after join
  }

 private:
  std::vector<std::function<void()>> closers_;
  const metrics::stage_stats* completions_ = nullptr;
  const metrics::stage_stats* productions_ = nullptr;
  std::vector<ticket_entry> tickets_;  // a service pipeline's; empty: a source's
  latency_samples samples_;            // a source pipeline's timed items
  std::atomic<bool> gate_{false};
};

// Before a stage's work on e (a service's item or batch): its items whose deadline has
// passed expire (control::expire()). A batch that is a std::vector with one element per
// item loses the expired elements; any other batch expires only when all its items
// have. Returns the items left: 0 when nothing is left to work on (drop e).
template <class T>
std::uint64_t drop_expired(control& ctl, metrics::stage_stats& stats, envelope<T>& e) {
  if (!e.metas.is_list()) {
    if (!ctl.is_expired(e.meta())) return 1;
    ctl.expire(stats, e.meta());
    return 0;
  }
  const std::size_t n = e.metas.size();
  std::int64_t now = 0;  // read once, at the first item with a deadline
  const auto gone = [&](const item_meta& m) {
    const std::int64_t d = ctl.deadline_of(m);
    if (d == 0) return false;
    if (now == 0) now = now_ns();
    return now >= d;
  };
  std::size_t expired = 0;
  for (const item_meta& m : e.metas) expired += gone(m) ? 1 : 0;
  if (expired == 0) return n;
  if constexpr (is_vector_v<T>) {
    if (e.value.size() == n) {
      // One pass: expiring an item hands its ticket back, after which its deadline may
      // be another item's; each is read before its own item expires.
      std::size_t kept = 0;
      e.metas.retain([&](std::size_t i, const item_meta& m) {
        if (gone(m)) {
          ctl.expire(stats, m);
          return false;
        }
        if (kept != i) e.value[kept] = std::move(e.value[i]);
        ++kept;
        return true;
      });
      e.value.erase(e.value.begin() + static_cast<std::ptrdiff_t>(kept), e.value.end());
      return kept;
    }
  }
  if (expired < n) return n;  // not splittable: it goes on whole
  for (const item_meta& m : e.metas) ctl.expire(stats, m);
  return 0;
}

// The most workers a stage takes.
inline constexpr std::size_t max_workers = 1024;

// @throws config_error unless a stage's worker count is in [1, max_workers].
void check_workers(const std::string& stage, std::size_t n);

}  // namespace conveyor::detail
