// conveyor/pipeline/placement.hpp: pins a pipeline's stage threads to CPUs by what each
// stage costs per item (pipeline_options::placement = by_load), or does so only while
// they alone fill the cores (automatic, the default).
//
//   detail::thread_registry placed;                  // every stage worker adds itself
//   ctl.placed = &placed;                            //   (worker_probe does, on its thread)
//   detail::load_placer placer{placed, 200ms,        // re-plans every period
//                              detail::pin_policy::automatic};
//   ...                                              // the stages run
//   placer.stop();
//
// Why: with more busy stage threads than cores, where a thread runs is the scheduler's
// call, and its wake-up heuristics get it wrong in a way that lasts. A stage that waits
// for its input sleeps after every item and is woken by the stage before it; Linux then
// often wakes it on the waker's core, so a light stage keeps landing on the core of the
// slowest one, which then loses the time the light one runs (bench_pipeline's
// overlap/spin rows show it; docs/tuning.md).
//
// What it does: every period (the first round 10 ms after the start) it reads each
// worker thread's CPU time (its thread CPU clock), the rounds it spun in waits and the
// items its stage moved, and takes the CPU time per item over the last `window` periods,
// less the spinning, as the worker's load: what it needs for the pipeline to move one
// item. Per item, not per period: a stage squeezed onto a shared core moves fewer items
// and uses less CPU, but not less per item, so the measure does not depend on the
// placement it is meant to correct, and a stage that runs ahead of a slower one while
// its output ring fills does not look heavier than it is. (Wall-clock busy time cannot
// serve: two stages sharing a core both look 100% busy.) It then assigns the workers to
// the CPUs this process may run on, in one of two ways: heaviest first, each to the CPU
// with the least load so far (LPT), or the threads in chain order cut into runs of
// neighbours, one run per CPU, the heaviest run as light as a cut can make it. LPT
// balances best; the runs hand items over within a core, where LPT tends to alternate
// neighbours between cores (four equal stages on two: every hop crosses). A hop across
// cores costs an item more than one within a core (the ring slot's cache lines travel),
// so it takes the plan whose busiest CPU's load plus cross_hop_ns per crossing is lower:
// the runs for stages of nanoseconds, LPT for stages of microseconds. Then it pins each thread to its CPU. Once all are pinned, a new plan is
// applied only when it costs at least 10% less per item.
//
// Automatic (pipeline_options::placement = automatic, the default): the same plan, but
// applied only while it cannot hurt anyone else. Every round the placer also measures
// what took the cores it may use: the stage threads (their CPU clocks), the rest of this
// process (its CPU clock) and other processes (the allowed CPUs' lines of /proc/stat).
// It pins only while the stage threads fill the cores and nothing else takes a
// noticeable part of them (auto_pin_rule), and puts every thread back on all allowed CPUs
// as soon as other work arrives: a pinned thread cannot dodge it, an unpinned one can.
// On a machine with more cores than the pipeline keeps busy it pins only a chain of light
// stages, and only where packing it onto fewer CPUs is measured to move more items
// (packing_trial); everything else it leaves to the OS.
//
// Compiled once, in the library (src/placement.cpp); Linux only (elsewhere the registry
// registers nobody and the placer never runs).
// Thread-safety: thread_registry from any thread (a mutex: each worker adds and removes
// itself once). load_placer's constructor and stop() from the owning thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "conveyor/counters/stage_stats.hpp"
#include "conveyor/stage/detail/worker_registry.hpp"

namespace conveyor::detail {

// LPT: threads (by load, heaviest first; ties by index) each go to the CPU with the
// least load so far (ties: the lowest). Returns the CPU index (0 .. cpus-1) of each.
std::vector<std::size_t> plan_placement(const std::vector<double>& loads, std::size_t cpus);

// Where a stage thread sits in the pipeline: its stage's position in the chain (0: the
// first stage; no_stage: unknown, it then counts as talking to nobody) and which of the
// stage's workers it is.
struct thread_spot {
  static constexpr std::size_t no_stage = ~std::size_t{0};
  std::size_t stage = no_stage;
  std::size_t worker = 0;
  friend bool operator<(const thread_spot& a, const thread_spot& b) noexcept {
    return a.stage != b.stage ? a.stage < b.stage : a.worker < b.worker;
  }
};

// Runs: the threads in chain order (by spot), cut into min(cpus, threads) runs of
// consecutive threads, run r on CPU r, so that the heaviest run is as light as it can be.
// A run of neighbours hands most items over within one core. Returns the CPU index of each.
std::vector<std::size_t> plan_runs(const std::vector<double>& loads,
                                   const std::vector<thread_spot>& spots, std::size_t cpus);

// How many times an item crosses from one CPU to another under a plan, on average: for
// each pair of neighbouring stages, the share of their thread pairs that the plan puts on
// different CPUs (items spread evenly over a stage's workers).
double cross_hops(const std::vector<thread_spot>& spots, const std::vector<std::size_t>& plan);

// What a hop between two CPUs costs an item beyond one within a CPU, in the loads' unit
// (ns of CPU time per item): the ring slot's cache lines travel. A few ns between two
// cores that share a cache; counted at 20 for machines where the lines travel farther
// (another CCX, another socket). It decides only between plans whose balance differs by
// less than a few crossings: for stages of tens of ns, never for stages of microseconds.
inline constexpr double cross_hop_ns = 20.0;

// A plan's cost per item: its busiest CPU's load plus the hops between CPUs.
double plan_cost(const std::vector<double>& loads, const std::vector<thread_spot>& spots,
                 const std::vector<std::size_t>& plan, std::size_t cpus);

// The plan placement by load applies: LPT (the lightest busiest CPU) or runs of
// neighbours (the fewest hops between CPUs), whichever costs less per item; ties go to
// the runs. Stages of microseconds per item get LPT's balance, stages of nanoseconds
// the runs' short hops.
std::vector<std::size_t> plan_threads(const std::vector<double>& loads,
                                      const std::vector<thread_spot>& spots, std::size_t cpus);

// A worker's load over a window: CPU time spent per item its stage moved. A window in
// which the stage moved nothing counts as one item (a stage busy with its first, or one
// long item, is heavy; one that only waited used next to no CPU). spun_ns: what of the
// CPU time went into spinning in waits; it is not load. A thread that has a core to
// itself spins while it waits, so without this its load would grow to fill whatever
// core it was given, and a plan that gave a light stage a core alone would confirm itself.
double load_per_item(std::int64_t cpu_ns, std::uint64_t items, double spun_ns = 0) noexcept;

// What one round of a wait's spin costs (a pause and a re-check), as measured once per
// process: the fastest of a few timed runs of pauses and relaxed loads. The fastest, so
// that a preempted run cannot make it large: too large, it would take work for spinning.
double spin_round_ns();

// What took the cores a pipeline may use during one placer round, each as a fraction of
// their capacity (CPUs x wall time): its own stage threads, the whole process (they
// included), every process on those CPUs (the process included; negative: unknown).
// The first two come from CPU clocks (exact); the machine's from /proc/stat, which
// counts in ticks (10 ms per CPU): over a round of a few ticks it is off by up to a
// tick per CPU, `tick` as a share.
struct core_shares {
  double own = 0;
  double process = 0;
  double machine = -1;
  double tick = 0;

  // The part that is not this pipeline's: the rest of the process, and other processes
  // beyond what the ticks' resolution can tell from nothing. An unknown machine share
  // counts as all of it (nothing to go by, so never pin).
  double others() const noexcept {
    if (machine < 0) return 1.0;
    return std::max(process - own, 0.0) + std::max(machine - process - tick, 0.0);
  }
};

// When placement = automatic pins, round by round. Pins when the stage threads fill the
// cores (own >= fill: more CPU-hungry threads than cores, where the OS's wake-up
// placement costs the pipeline its slowest stage's core) and nothing else takes more than
// `quiet` of them. Lets go at once when other work takes more than `busy` (the gap to
// `quiet` is measurement noise: /proc/stat counts in 10 ms ticks), and when the stage
// threads no longer fill the cores (own < idle) for two rounds in a row.
class auto_pin_rule {
 public:
  static constexpr double fill = 0.8, quiet = 0.1, busy = 0.2, idle = 0.5;

  // Whether the threads should be pinned after a round that measured s.
  bool next(const core_shares& s) noexcept {
    const double others = s.others();
    if (!pinned_) {
      pinned_ = s.own >= fill && others <= quiet;
      idle_rounds_ = 0;
      return pinned_;
    }
    idle_rounds_ = s.own < idle ? idle_rounds_ + 1 : 0;
    if (others > busy || idle_rounds_ >= 2) pinned_ = false;
    return pinned_;
  }
  bool pinned() const noexcept { return pinned_; }

 private:
  bool pinned_ = false;
  int idle_rounds_ = 0;
};

// Packing (automatic, more CPUs than stage threads). Left to the OS there, each stage
// thread gets a core of its own and every hop crosses cores; for stages of tens of ns per
// item the lines a crossing moves can cost more than the stages (bench_pipeline's trivial
// chain on a 16-core host, benchmarks/RESULTS.md, "Pipeline"), and two neighbours taking
// turns on one core move more items. Whether they do depends on the host and cannot be
// told from loads measured while spread (they include the crossings' stalls), so the
// placer tries it: packing_trial below.
//
// plan_packed: the threads in chain order, in pairs of neighbours, a pair to a CPU (the
// first thread on CPU 0 with the second, ...; an odd one out alone), when 2 <= n < cpus and
// every thread is lighter than light_stage_ns; else an empty plan. Heavier stages are never
// packed: their work dwarfs any crossing.
inline constexpr double light_stage_ns = 1000.0;
std::vector<std::size_t> plan_packed(const std::vector<double>& loads,
                                     const std::vector<thread_spot>& spots, std::size_t cpus);

// How many distinct CPUs a plan uses.
std::size_t cpus_used(const std::vector<std::size_t>& plan);

// The trial, round by round: `eligible` says a packed plan exists and the stage threads
// keep busy the cores they would get (the CPUs a packed plan uses, or a core each while
// spread) with nothing else taking the machine; `rate` is the items the chain moved per
// second since the last round. One round spread is the baseline, then the threads are
// packed; after a round to settle (migration, rings growing) the next round's rate
// decides: packing stays if it moved at least as many items (ties pack: fewer cores),
// else the threads go back to the OS and the next trial waits backoff rounds (doubling
// from min_backoff to max_backoff). Packing ends when the threads stop being eligible
// (heavier stages, idle threads, other work). hurried(): the placer's next round should
// come soon (first_round), so a short run gets its answer. Thread-safety: one thread (the
// placer's).
class packing_trial {
 public:
  static constexpr std::uint32_t min_backoff = 8, max_backoff = 256;

  // Whether the threads should be packed after a round with these measurements.
  bool next(bool eligible, double rate) noexcept {
    switch (state_) {
      case state::spread:
        if (wait_ > 0) {
          --wait_;
        } else if (eligible) {
          state_ = state::measuring;
        }
        return false;
      case state::measuring:  // the round just ended was spread and eligible: the baseline
        if (!eligible) return give_up(0);
        spread_rate_ = rate;
        state_ = state::settling;
        return true;
      case state::settling:
        if (!eligible) return give_up(0);
        state_ = state::trying;
        return true;
      case state::trying:
        if (eligible && rate >= spread_rate_) {
          state_ = state::kept;
          backoff_ = min_backoff;
          return true;
        }
        return give_up(eligible ? backoff_ : 0, eligible);
      case state::kept:
        if (eligible) return true;
        return give_up(0);
    }
    return false;
  }
  bool packed() const noexcept {
    return state_ == state::settling || state_ == state::trying || state_ == state::kept;
  }
  bool hurried() const noexcept {
    return state_ == state::measuring || state_ == state::settling || state_ == state::trying;
  }

 private:
  enum class state { spread, measuring, settling, trying, kept };
  // Back to the OS; a trial that lost waits `wait` rounds, and doubles the next wait.
  bool give_up(std::uint32_t wait, bool lost = false) noexcept {
    state_ = state::spread;
    wait_ = wait;
    if (lost) backoff_ = std::min(backoff_ * 2, max_backoff);
    return false;
  }

  state state_ = state::spread;
  double spread_rate_ = 0;
  std::uint32_t wait_ = 0;
  std::uint32_t backoff_ = min_backoff;
};

// Busy and total time of some CPUs, in /proc/stat's ticks.
struct cpu_ticks {
  std::uint64_t busy = 0;   // user, nice, system, irq, softirq (guest time is in user)
  std::uint64_t total = 0;  // busy, idle, iowait and steal
};

// Sums the lines of /proc/stat's text (`stat`) for the given CPU numbers; nullopt when a
// CPU has no line (or a malformed one): the machine's share is then unknown.
std::optional<cpu_ticks> parse_cpu_ticks(std::string_view stat, const std::vector<int>& cpus);

// /proc/stat's ticks for the given CPUs (nullopt: unreadable, a CPU missing, or not Linux).
std::optional<cpu_ticks> read_cpu_ticks(const std::vector<int>& cpus);

// When a load_placer pins: always (by_load), or only by auto_pin_rule (automatic).
enum class pin_policy { always, automatic };

// What a placer round left, by stage position in the chain (thread_registry::set_chain):
// the CPU (index into the allowed CPUs) that the stage's one worker is pinned to, or
// not_pinned (not pinned, several workers, or none running).
struct chain_placement {
  static constexpr std::size_t not_pinned = ~std::size_t{0};
  std::vector<std::size_t> cpu;
  // The CPU time per item of each stage's one worker (ns, its spinning left out: the
  // placer's load, see load_per_item) over the placer's window; 0: not known, or not
  // one worker. Empty when the placer measured nothing.
  std::vector<double> load_ns;
  double load(std::size_t a) const noexcept { return a < load_ns.size() ? load_ns[a] : 0.0; }

  // True when stages `a` and `a + 1` each run on one thread, both pinned to one CPU.
  bool share_cpu(std::size_t a) const noexcept {
    return a + 1 < cpu.size() && cpu[a] != not_pinned && cpu[a] == cpu[a + 1];
  }
  // True when stages `a` and `a + 1` each run on one thread, pinned to two CPUs.
  bool pinned_apart(std::size_t a) const noexcept {
    return a + 1 < cpu.size() && cpu[a] != not_pinned && cpu[a + 1] != not_pinned &&
           cpu[a] != cpu[a + 1];
  }
};

// The stage workers running now, each with its thread's CPU clock and its stage's
// counters. A worker enters when it starts and leaves before its thread ends, so a
// handle in here always names a live thread: the placer never reads the clock of, or
// pins, a thread that has gone (whose kernel id may already belong to another).
class thread_registry final : public worker_registry {
 public:
  thread_registry();
  ~thread_registry();
  thread_registry(const thread_registry&) = delete;
  thread_registry& operator=(const thread_registry&) = delete;

  // Setup only (before any worker runs): the stages in chain order, by their counters, so
  // the placer knows which threads hand items to which.
  void set_chain(std::vector<const metrics::stage_stats*> stages);
  std::size_t chain_size() const noexcept;

  // Adds the calling thread, worker `worker` of `stage`. false: not added (no CPU clock,
  // out of memory, not Linux); the worker then runs where the OS puts it.
  bool enter(const metrics::stage_stats& stage, std::size_t worker) noexcept override;
  // Removes the calling thread.
  void leave() noexcept override;

  struct state;  // the live workers, under a mutex (src/placement.cpp)
  state& live() noexcept { return *state_; }

 private:
  std::unique_ptr<state> state_;
};

// Re-plans the registered workers' placement every period, on a thread of its own.
class load_placer {
 public:
  // What was measured in a round (automatic only), for a test to replace.
  using shares_override = std::function<core_shares(const core_shares& measured)>;
  // Told, at the end of every round, where the chain's stages run now (on the placer's
  // thread, which stop() joins).
  using listener = std::function<void(const chain_placement&)>;

  // Starts re-planning every period, on a thread of its own. Does nothing (no thread)
  // when this process may run on fewer than two CPUs, or not on Linux.
  load_placer(thread_registry& workers, std::chrono::milliseconds period,
              pin_policy policy = pin_policy::always, shares_override override_shares = {},
              listener on_round = {});
  load_placer(const load_placer&) = delete;
  load_placer& operator=(const load_placer&) = delete;
  ~load_placer();

  // Stops and joins the placer's thread. Idempotent.
  void stop() noexcept;

  // Rounds done so far (for tests: "after a round that saw this"), and of those the ones
  // after which every live stage thread was pinned (for the report). Read rounds() first:
  // pinned_rounds() is then at least what was counted with those rounds.
  std::uint64_t rounds() const noexcept;
  std::uint64_t pinned_rounds() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace conveyor::detail
