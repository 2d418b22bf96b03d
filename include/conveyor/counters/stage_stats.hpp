// conveyor/counters/stage_stats.hpp: per-stage counters: items, busy / starved / blocked
// time per worker, and the occupancy of the stage's input ring.
//
//   metrics::stage_stats stats{workers};                 // at construction: allocates
//   auto& w = stats.worker(i);                           // worker thread i only
//   metrics::phase_clock clock{w};                       // marks now
//   auto x = in.pop();             clock.starved();      // waited on the input ring
//   w.sample_occupancy(in.size_approx());
//   auto y = f(std::move(*x));     clock.busy(); w.add_items(1);
//   out.push(std::move(y));        clock.blocked();      // waited for room downstream
//   stage_counters c = stats.snapshot();                 // any thread, any time
//
// Definitions (what the report and the verdict rely on):
//   busy     time a worker spends doing the stage's own work
//   starved  time a worker waits for its input ring to give it something
//   blocked  time a worker waits for room in its output ring (or for a free slot)
// A worker that runs for the whole pipeline wall time W has busy+starved+blocked ~= W;
// phase_clock charges every nanosecond between two marks to exactly one of them.
// Occupancy is sampled by the caller (typically once per pop, of the input ring): the
// mean is item-weighted, the max is exact over the samples.
//
// Thread-safety: each worker_stats slot has exactly one writer thread (its worker) and
// sits on its own cache line (conveyor::cache_line_size), so workers never share a
// written line. Writers use relaxed load + store (no read-modify-write: one writer).
// snapshot() may be called from any thread at any time; it reads every counter once
// (relaxed), so its numbers are each exact as of some instant during the call but not
// all of the same instant; after the workers are joined they are exact.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"

namespace conveyor::metrics {

// What kind of stage a stage_stats belongs to (the report and the verdict read it).
enum class stage_kind { source, map, batch, unbatch, gpu, sink };

inline std::string_view to_string(stage_kind k) noexcept {
  switch (k) {
    case stage_kind::source:
      return "source";
    case stage_kind::map:
      return "map";
    case stage_kind::batch:
      return "batch";
    case stage_kind::unbatch:
      return "unbatch";
    case stage_kind::gpu:
      return "gpu";
    case stage_kind::sink:
      return "sink";
  }
  return "?";
}

// A stage's totals at one moment (see stage_stats::snapshot()).
struct stage_counters {
  std::uint64_t items = 0;
  std::int64_t busy_ns = 0;
  std::int64_t starved_ns = 0;
  std::int64_t blocked_ns = 0;
  std::uint64_t occupancy_sum = 0;
  std::uint64_t occupancy_samples = 0;
  std::uint64_t occupancy_max = 0;
  std::int64_t cpu_ns = 0;  // the workers' thread CPU time, as last read (0: not read)

  double occupancy_mean() const noexcept {
    return occupancy_samples == 0
               ? 0.0
               : static_cast<double>(occupancy_sum) / static_cast<double>(occupancy_samples);
  }
};

// One worker's counters: one cache line, one writer thread.
class alignas(cache_line_size) worker_stats {
 public:
  // All writers: the owning worker thread only. Negative durations count as 0.
  void add_items(std::uint64_t n = 1) noexcept { bump(items_, n); }
  void add_busy(std::int64_t ns) noexcept { bump(busy_ns_, positive(ns)); }
  void add_starved(std::int64_t ns) noexcept { bump(starved_ns_, positive(ns)); }
  void add_blocked(std::int64_t ns) noexcept { bump(blocked_ns_, positive(ns)); }
  // Rounds spun in blocking waits (a pause and a re-check each): CPU time the worker
  // burnt waiting, which placement by load takes out of the worker's load.
  void add_spin_rounds(std::uint64_t n) noexcept { bump(spin_rounds_, n); }
  // The worker thread's CPU time so far (thread_cpu_ns()), read by the worker now and
  // then: how much of its busy time it ran on a CPU.
  void set_cpu_ns(std::int64_t ns) noexcept {
    // relaxed: single writer, an independent statistic (see bump()).
    cpu_ns_.store(static_cast<std::uint64_t>(ns > 0 ? ns : 0), std::memory_order_relaxed);
  }
  // n: the number of elements in the stage's input ring, e.g. ring.size_approx().
  void sample_occupancy(std::size_t n) noexcept {
    bump(occupancy_sum_, n);
    bump(occupancy_samples_, 1);
    // relaxed: single writer (see bump()).
    if (n > occupancy_max_.load(std::memory_order_relaxed))
      occupancy_max_.store(n, std::memory_order_relaxed);
  }

  // Any thread.
  std::uint64_t items() const noexcept { return items_.load(std::memory_order_relaxed); }
  std::uint64_t spin_rounds() const noexcept {
    return spin_rounds_.load(std::memory_order_relaxed);
  }
  stage_counters snapshot() const noexcept {
    // relaxed: every counter is an independent statistic; nothing else is published
    // through it. Each load returns a value the writer stored (atomics never tear).
    stage_counters c;
    c.items = items();
    c.busy_ns = static_cast<std::int64_t>(busy_ns_.load(std::memory_order_relaxed));
    c.starved_ns = static_cast<std::int64_t>(starved_ns_.load(std::memory_order_relaxed));
    c.blocked_ns = static_cast<std::int64_t>(blocked_ns_.load(std::memory_order_relaxed));
    c.occupancy_sum = occupancy_sum_.load(std::memory_order_relaxed);
    c.occupancy_samples = occupancy_samples_.load(std::memory_order_relaxed);
    c.occupancy_max = occupancy_max_.load(std::memory_order_relaxed);
    c.cpu_ns = static_cast<std::int64_t>(cpu_ns_.load(std::memory_order_relaxed));
    return c;
  }

 private:
  static std::uint64_t positive(std::int64_t ns) noexcept {
    return ns > 0 ? static_cast<std::uint64_t>(ns) : 0;
  }
  // relaxed load + store instead of fetch_add: the owning worker is the only writer, so
  // nobody can slip an update in between, and a plain store is several times cheaper
  // than a locked read-modify-write on the hot path. Readers only need untorn values.
  static void bump(std::atomic<std::uint64_t>& a, std::uint64_t d) noexcept {
    a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
  }

  std::atomic<std::uint64_t> items_{0};
  std::atomic<std::uint64_t> busy_ns_{0};
  std::atomic<std::uint64_t> starved_ns_{0};
  std::atomic<std::uint64_t> blocked_ns_{0};
  std::atomic<std::uint64_t> occupancy_sum_{0};
  std::atomic<std::uint64_t> occupancy_samples_{0};
  std::atomic<std::uint64_t> occupancy_max_{0};
  std::atomic<std::uint64_t> spin_rounds_{0};
  std::atomic<std::uint64_t> cpu_ns_{0};
};
static_assert(sizeof(worker_stats) == cache_line_size,
              "worker_stats: each worker's counters must own exactly one cache line");

// The counters of one stage with a fixed number of workers.
class stage_stats {
 public:
  // @throws config_error when workers is 0.
  explicit stage_stats(std::size_t workers)
      : workers_((check(workers), workers)), slots_(std::make_unique<worker_stats[]>(workers)) {}
  // Moved only before any worker runs (while a pipeline is built).
  stage_stats(stage_stats&& o) noexcept
      : workers_(o.workers_),
        slots_(std::move(o.slots_)),
        failed_(o.failed()),
        expired_(o.expired()) {}
  stage_stats& operator=(stage_stats&& o) noexcept {
    workers_ = o.workers_;
    slots_ = std::move(o.slots_);
    failed_.store(o.failed(), std::memory_order_relaxed);
    expired_.store(o.expired(), std::memory_order_relaxed);
    return *this;
  }

  std::size_t workers() const noexcept { return workers_; }
  // The slot of worker i (0 <= i < workers()); write it from that worker's thread only.
  worker_stats& worker(std::size_t i) noexcept { return slots_[i]; }
  const worker_stats& worker(std::size_t i) const noexcept { return slots_[i]; }

  // Items over all workers. Any thread; exact once they have joined.
  std::uint64_t items() const noexcept {
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < workers_; ++i) n += slots_[i].items();
    return n;
  }

  // Sum over workers (occupancy: sums, sample counts and the max of maxima). Any thread.
  stage_counters snapshot() const noexcept {
    stage_counters total;
    for (std::size_t i = 0; i < workers_; ++i) {
      const stage_counters c = slots_[i].snapshot();
      total.items += c.items;
      total.busy_ns += c.busy_ns;
      total.starved_ns += c.starved_ns;
      total.blocked_ns += c.blocked_ns;
      total.occupancy_sum += c.occupancy_sum;
      total.occupancy_samples += c.occupancy_samples;
      total.cpu_ns += c.cpu_ns;
      if (c.occupancy_max > total.occupancy_max) total.occupancy_max = c.occupancy_max;
    }
    return total;
  }

 private:
  static void check(std::size_t workers) {
    CONVEYOR_EXPECTS(workers >= 1 && workers <= 4096,
                     "stage_stats: workers must be in [1, 4096]; pass the stage's worker count");
  }

  std::size_t workers_;
  std::unique_ptr<worker_stats[]> slots_;  // over-aligned new[]: one line per slot

 public:
  // Items the stage failed on, and a service's items it found expired (dropped before
  // its work). Any thread: rare, so one shared counter each. relaxed: counts, exact
  // once the workers have joined.
  void count_failed(std::uint64_t n) noexcept { failed_.fetch_add(n, std::memory_order_relaxed); }
  void count_expired(std::uint64_t n) noexcept { expired_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t failed() const noexcept { return failed_.load(std::memory_order_relaxed); }
  std::uint64_t expired() const noexcept { return expired_.load(std::memory_order_relaxed); }

 private:
  alignas(cache_line_size) std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> expired_{0};
};

// The [start, end) of one charged phase.
using phase = interval;

// Charges the time between consecutive marks to one of busy / starved / blocked of a
// worker. Lives on the worker's stack; one clock read per phase. Worker thread only.
class phase_clock {
 public:
  explicit phase_clock(worker_stats& w) noexcept : w_(&w), mark_(now_ns()) {}
  phase_clock(worker_stats& w, std::int64_t start_ns) noexcept : w_(&w), mark_(start_ns) {}

  phase busy() noexcept { return charge(&worker_stats::add_busy); }
  // Ends the phase at end_ns (a reading of now_ns() taken since the last mark), for a
  // phase that also held waits measured without a clock read of their own (starved_ns
  // and blocked_ns, see worker_probe): those are charged to starved and blocked, at
  // most the whole phase, and the rest to busy.
  phase busy_until(std::int64_t end_ns, std::int64_t starved_ns, std::int64_t blocked_ns) noexcept {
    const phase p{mark_, end_ns > mark_ ? end_ns : mark_};
    mark_ = p.end_ns;
    std::int64_t left = p.length_ns();
    starved_ns = starved_ns < left ? starved_ns : left;
    left -= starved_ns;
    blocked_ns = blocked_ns < left ? blocked_ns : left;
    w_->add_starved(starved_ns);
    w_->add_blocked(blocked_ns);
    w_->add_busy(left - blocked_ns);
    return p;
  }
  phase starved() noexcept { return charge(&worker_stats::add_starved); }
  phase blocked() noexcept { return charge(&worker_stats::add_blocked); }
  // Moves the mark without charging anything (e.g. time spent shutting down).
  phase skip() noexcept { return charge(nullptr); }

  std::int64_t mark_ns() const noexcept { return mark_; }

 private:
  phase charge(void (worker_stats::*add)(std::int64_t) noexcept) noexcept {
    const phase p{mark_, now_ns()};
    mark_ = p.end_ns;
    if (add != nullptr) (w_->*add)(p.length_ns());
    return p;
  }

  worker_stats* w_;
  std::int64_t mark_;
};

}  // namespace conveyor::metrics
