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
// slowest one, which then loses the time the light one runs. bench_pipeline's
// overlap/spin figure is bimodal for that reason: 0.82-0.89 in the runs where the 100 us
// stage splits its items between the 300 us stage's core and the other, 0.94-0.96 where
// it stays off it; pinned by hand (300 us alone, 200 + 100 together) it is 0.966-0.982
// in every run (see benchmarks/RESULTS.md).
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
// the runs for stages of nanoseconds (bench_pipeline's trivial chain: medians 25 -> 34
// M items/s, benchmarks/RESULTS.md, "Runs of neighbours"), LPT for stages of
// microseconds. Then it pins each thread to its CPU. Once all are pinned, a new plan is
// applied only when it costs at least 10% less per item.
//
// Automatic (pipeline_options::placement = automatic, the default): the same plan, but
// applied only while it cannot hurt anyone else. Every round the placer also measures
// what took the cores it may use: the stage threads (their CPU clocks), the rest of this
// process (its CPU clock) and other processes (the allowed CPUs' lines of /proc/stat).
// It pins only while the stage threads fill the cores and nothing else takes a
// noticeable part of them (auto_pin_rule), and puts every thread back on all allowed CPUs
// as soon as other work arrives: a pinned thread cannot dodge it, an unpinned one can.
// On a machine with more cores than the pipeline keeps busy it never pins at all.
//
// Thread-safety: thread_registry from any thread (a mutex: each worker adds and removes
// itself once). load_placer's constructor and stop() from the owning thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "conveyor/base/clock.hpp"
#include "conveyor/counters/stage_stats.hpp"
#include "conveyor/stage/detail/worker_registry.hpp"
#include "conveyor/base/cpu_relax.hpp"

namespace conveyor::detail {

// LPT: threads (by load, heaviest first; ties by index) each go to the CPU with the
// least load so far (ties: the lowest). Returns the CPU index (0 .. cpus-1) of each.
inline std::vector<std::size_t> plan_placement(const std::vector<double>& loads, std::size_t cpus) {
  std::vector<std::size_t> order(loads.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return loads[a] > loads[b]; });
  std::vector<double> cpu_load(std::max<std::size_t>(cpus, 1), 0.0);
  std::vector<std::size_t> plan(loads.size(), 0);
  for (const std::size_t t : order) {
    const auto least = static_cast<std::size_t>(
        std::min_element(cpu_load.begin(), cpu_load.end()) - cpu_load.begin());
    plan[t] = least;
    cpu_load[least] += std::max(loads[t], 0.0);
  }
  return plan;
}

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
inline std::vector<std::size_t> plan_runs(const std::vector<double>& loads,
                                          const std::vector<thread_spot>& spots, std::size_t cpus) {
  const std::size_t n = loads.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return spots[a] < spots[b]; });
  std::vector<double> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = std::max(loads[order[i]], 0.0);
  const std::size_t runs = std::min(std::max<std::size_t>(cpus, 1), n);
  std::vector<std::size_t> plan(n, 0);
  if (runs == 0) return plan;
  // Cuts (the first thread of each run after the first), greedily under a bound: each
  // run takes threads while it stays within it.
  const auto cut = [&](double bound) {
    std::vector<std::size_t> starts{0};
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (i > 0 && sum + w[i] > bound) {
        starts.push_back(i);
        sum = 0;
      }
      sum += w[i];
    }
    return starts;
  };
  // The lightest bound that needs no more runs than CPUs: bisection between the heaviest
  // thread (no run can be lighter) and all of them together (one run).
  double lo = *std::max_element(w.begin(), w.end());
  double hi = std::max(std::accumulate(w.begin(), w.end(), 0.0), lo);
  for (int i = 0; i < 64 && hi - lo > 1e-9 * hi; ++i) {
    const double mid = lo + (hi - lo) / 2;
    (cut(mid).size() <= runs ? hi : lo) = mid;
  }
  std::vector<std::size_t> starts = cut(hi);
  // Fewer runs than CPUs (the bound left some idle): split the heaviest run that has two
  // threads or more where its heavier half is lightest, until every CPU has a run.
  const auto sum_of = [&](std::size_t from, std::size_t to) {
    return std::accumulate(w.begin() + static_cast<std::ptrdiff_t>(from),
                           w.begin() + static_cast<std::ptrdiff_t>(to), 0.0);
  };
  while (starts.size() < runs) {
    std::size_t best = starts.size();
    double heaviest = -1;
    for (std::size_t r = 0; r < starts.size(); ++r) {
      const std::size_t end = r + 1 < starts.size() ? starts[r + 1] : n;
      if (end - starts[r] >= 2 && sum_of(starts[r], end) > heaviest) {
        heaviest = sum_of(starts[r], end);
        best = r;
      }
    }
    const std::size_t from = starts[best], end = best + 1 < starts.size() ? starts[best + 1] : n;
    std::size_t at = from + 1;
    double lightest = heaviest + 1;
    for (std::size_t c = from + 1; c < end; ++c) {
      const double worse = std::max(sum_of(from, c), sum_of(c, end));
      if (worse < lightest) {
        lightest = worse;
        at = c;
      }
    }
    starts.insert(starts.begin() + static_cast<std::ptrdiff_t>(best) + 1, at);
  }
  for (std::size_t r = 0; r < starts.size(); ++r) {
    const std::size_t end = r + 1 < starts.size() ? starts[r + 1] : n;
    for (std::size_t i = starts[r]; i < end; ++i) plan[order[i]] = r;
  }
  return plan;
}

// How many times an item crosses from one CPU to another under a plan, on average: for
// each pair of neighbouring stages, the share of their thread pairs that the plan puts on
// different CPUs (items spread evenly over a stage's workers).
inline double cross_hops(const std::vector<thread_spot>& spots, const std::vector<std::size_t>& plan) {
  double hops = 0;
  for (std::size_t a = 0; a < spots.size(); ++a) {
    if (spots[a].stage == thread_spot::no_stage) continue;
    std::size_t pairs = 0, split = 0;
    for (std::size_t b = 0; b < spots.size(); ++b) {
      if (spots[b].stage != spots[a].stage + 1) continue;
      ++pairs;
      if (plan[a] != plan[b]) ++split;
    }
    if (pairs == 0) continue;
    std::size_t here = 0;  // threads of a's stage
    for (const thread_spot& s : spots) here += s.stage == spots[a].stage ? 1 : 0;
    hops += static_cast<double>(split) / static_cast<double>(pairs * here);
  }
  return hops;
}

// What a hop between two CPUs costs an item beyond one within a CPU, in the loads' unit
// (ns of CPU time per item): the ring slot's cache lines travel. On 2 vCPUs here, ~7 ns
// of core time per crossing (the trivial chain pinned by hand, benchmarks/RESULTS.md,
// "Runs of neighbours"); counted at 20 for machines where the lines travel farther
// (another CCX, another socket). It decides only between plans whose balance differs by
// less than a few crossings: for stages of tens of ns, never for stages of microseconds.
inline constexpr double cross_hop_ns = 20.0;

// A plan's cost per item: its busiest CPU's load plus the hops between CPUs.
inline double plan_cost(const std::vector<double>& loads, const std::vector<thread_spot>& spots,
                        const std::vector<std::size_t>& plan, std::size_t cpus) {
  std::vector<double> per_cpu(std::max<std::size_t>(cpus, 1), 0.0);
  for (std::size_t i = 0; i < loads.size(); ++i) per_cpu[plan[i]] += std::max(loads[i], 0.0);
  return *std::max_element(per_cpu.begin(), per_cpu.end()) + cross_hop_ns * cross_hops(spots, plan);
}

// The plan placement by load applies: LPT (the lightest busiest CPU) or runs of
// neighbours (the fewest hops between CPUs), whichever costs less per item; ties go to
// the runs. Stages of microseconds per item get LPT's balance, stages of nanoseconds
// the runs' short hops.
inline std::vector<std::size_t> plan_threads(const std::vector<double>& loads,
                                             const std::vector<thread_spot>& spots,
                                             std::size_t cpus) {
  std::vector<std::size_t> runs = plan_runs(loads, spots, cpus);
  std::vector<std::size_t> lpt = plan_placement(loads, cpus);
  return plan_cost(loads, spots, lpt, cpus) < plan_cost(loads, spots, runs, cpus) ? lpt : runs;
}

// A worker's load over a window: CPU time spent per item its stage moved. A window in
// which the stage moved nothing counts as one item (a stage busy with its first, or one
// long item, is heavy; one that only waited used next to no CPU). spun_ns: what of the
// CPU time went into spinning in waits; it is not load. A thread that has a core to
// itself spins while it waits, so without this its load would grow to fill whatever
// core it was given, and a plan that gave a light stage a core alone would confirm itself.
inline double load_per_item(std::int64_t cpu_ns, std::uint64_t items, double spun_ns = 0) noexcept {
  return std::max(static_cast<double>(cpu_ns) - std::max(spun_ns, 0.0), 0.0) /
         static_cast<double>(std::max<std::uint64_t>(items, 1));
}

// What one round of a wait's spin costs (a pause and a re-check), as measured once per
// process: the fastest of a few timed runs of pauses and relaxed loads. The fastest, so
// that a preempted run cannot make it large: too large, it would take work for spinning.
inline double spin_round_ns() {
  static const double ns = [] {
    std::atomic<std::uint64_t> word{0};
    constexpr int rounds = 2000;
    double best = 1e9;
    for (int run = 0; run < 5; ++run) {
      const std::int64_t from = conveyor::now_ns();
      for (int i = 0; i < rounds; ++i) {
        if (word.load(std::memory_order_relaxed) == 1) break;  // never: the spin's re-check
        cpu_relax();
      }
      best = std::min(best, static_cast<double>(conveyor::now_ns() - from) / rounds);
    }
    return best;
  }();
  return ns;
}

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

// Busy and total time of some CPUs, in /proc/stat's ticks.
struct cpu_ticks {
  std::uint64_t busy = 0;   // user, nice, system, irq, softirq (guest time is in user)
  std::uint64_t total = 0;  // busy, idle, iowait and steal
};

// Sums the lines of /proc/stat's text (`stat`) for the given CPU numbers; nullopt when a
// CPU has no line (or a malformed one): the machine's share is then unknown.
inline std::optional<cpu_ticks> parse_cpu_ticks(std::string_view stat, const std::vector<int>& cpus) {
  cpu_ticks sum;
  for (const int cpu : cpus) {
    const std::string label = "cpu" + std::to_string(cpu) + " ";
    std::size_t at = stat.starts_with(label) ? 0 : stat.find("\n" + label);
    if (at == std::string_view::npos) return std::nullopt;
    at += at == 0 ? label.size() : label.size() + 1;
    std::uint64_t f[8] = {};  // user nice system idle iowait irq softirq steal
    for (std::uint64_t& v : f) {
      while (at < stat.size() && stat[at] == ' ') ++at;
      if (at >= stat.size() || stat[at] < '0' || stat[at] > '9') return std::nullopt;
      for (; at < stat.size() && stat[at] >= '0' && stat[at] <= '9'; ++at)
        v = v * 10 + static_cast<std::uint64_t>(stat[at] - '0');
    }
    const std::uint64_t busy = f[0] + f[1] + f[2] + f[5] + f[6];
    sum.busy += busy;
    sum.total += busy + f[3] + f[4] + f[7];
  }
  return sum;
}

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
};

// Whether the ring between two stage threads pinned to one CPU should move to its
// reserve (a ring `reserve` deep). The two take turns on the CPU: the producer runs until
// the ring is full, the consumer until it is empty, and every turn costs a context
// switch. At 1024 items of stages of tens of ns a turn lasts ~20-30 us: the trivial
// chain switched once per ~210 items and spent 51 ns of CPU per item, against 44 ns with
// rings of 8192 (benchmarks/RESULTS.md, "Rings that grow where stages share a core").
// It moves while its consumer works through the reserve's worth within
// shared_core_hold_s of its own CPU time (consumer_ns: its CPU time per element, the
// placer's load): the deeper ring adds about that to an element's wait when it is full
// and the consumer has the CPU, and a ring in front of a stage that needs more than
// shared_core_hold_s / reserve per element (122 ns for 8192) never grows.
// By CPU time, not by the rate the consumer took elements at: on a shared core that
// rate is what the small ring's turns leave, so a chain whose turns cost it half its
// speed (a slower host: 10 M elements/s where 20 M is possible) never measured the rate
// that would have let its rings grow (benchmarks/RESULTS.md, "Growing by CPU time").
inline constexpr double shared_core_hold_s = 1e-3;
inline bool shared_core_grows(std::size_t reserve, double consumer_ns) noexcept {
  return consumer_ns > 0 &&
         static_cast<double>(reserve) * consumer_ns <= shared_core_hold_s * 1e9;
}

#if defined(__linux__)

// /proc/stat's ticks for the given CPUs (nullopt: unreadable, or a CPU missing).
inline std::optional<cpu_ticks> read_cpu_ticks(const std::vector<int>& cpus) {
  std::FILE* const f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return std::nullopt;
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return parse_cpu_ticks(text, cpus);
}

// The stage workers running now, each with its thread's CPU clock and its stage's
// counters. A worker adds itself when it starts and removes itself before its thread
// ends, so a handle in here always names a live thread: the placer never reads the clock
// of, or pins, a thread that has gone (whose kernel id may already belong to another).
class thread_registry final : public worker_registry {
 public:
  struct entry {
    pthread_t thread;
    clockid_t cpu_clock;
    const metrics::stage_stats* stage;
    std::size_t worker;  // which of the stage's workers
  };

  // Setup only (before any worker runs): the stages in chain order, by their counters, so
  // the placer knows which threads hand items to which (see spot()).
  void set_chain(std::vector<const metrics::stage_stats*> stages) { chain_ = std::move(stages); }
  std::size_t chain_size() const noexcept { return chain_.size(); }
  // Where a worker sits in the chain; stage no_stage when its stage is not in it.
  thread_spot spot(const entry& e) const noexcept {
    const auto at = std::find(chain_.begin(), chain_.end(), e.stage);
    return {at == chain_.end() ? thread_spot::no_stage
                               : static_cast<std::size_t>(at - chain_.begin()),
            e.worker};
  }

  // Adds the calling thread, worker `worker` of `stage`. false: not added (no CPU clock,
  // out of memory); the worker then runs where the OS puts it.
  bool enter(const metrics::stage_stats& stage, std::size_t worker) noexcept override {
    entry e{pthread_self(), {}, &stage, worker};
    if (pthread_getcpuclockid(e.thread, &e.cpu_clock) != 0) return false;
    try {
      const std::lock_guard lock{mutex_};
      live_.push_back(e);
      return true;
    } catch (...) {
      return false;
    }
  }
  // Removes the calling thread.
  void leave() noexcept override {
    const pthread_t t = pthread_self();
    const std::lock_guard lock{mutex_};
    std::erase_if(live_, [&](const entry& e) { return pthread_equal(e.thread, t) != 0; });
  }

  // Calls f(live workers) under the lock: they cannot end while f runs.
  template <class F>
  void with_live(F&& f) {
    const std::lock_guard lock{mutex_};
    f(live_);
  }

 private:
  std::mutex mutex_;
  std::vector<entry> live_;
  std::vector<const metrics::stage_stats*> chain_;
};

class load_placer {
 public:
  // What was measured in a round (automatic only), for a test to replace.
  using shares_override = std::function<core_shares(const core_shares& measured)>;
  // Told, at the end of every round, where the chain's stages run now (on the placer's
  // thread, which stop() joins).
  using listener = std::function<void(const chain_placement&)>;

  // Starts re-planning every period, on a thread of its own. Does nothing (no thread)
  // when this process may run on fewer than two CPUs.
  load_placer(thread_registry& workers, std::chrono::milliseconds period,
              pin_policy policy = pin_policy::always, shares_override override_shares = {},
              listener on_round = {})
      : workers_(workers),
        period_(period),
        cpus_(conveyor::allowed_cpus()),
        policy_(policy),
        override_(std::move(override_shares)),
        on_round_(std::move(on_round)) {
    if (cpus_.size() < 2) return;
    if (policy_ == pin_policy::automatic) {
      last_ticks_ = read_cpu_ticks(cpus_);
      last_wall_ns_ = conveyor::now_ns();
      last_process_ns_ = conveyor::process_cpu_ns();
    }
    thread_ = std::thread([this] { loop(); });
  }
  load_placer(const load_placer&) = delete;
  load_placer& operator=(const load_placer&) = delete;
  ~load_placer() { stop(); }

  void stop() noexcept {
    {
      const std::lock_guard lock{mutex_};
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Rounds done so far (for tests: "after a round that saw this"), and of those the ones
  // after which every live stage thread was pinned (for the report). Read rounds() first:
  // pinned_rounds() is then at least what was counted with those rounds.
  std::uint64_t rounds() const noexcept { return rounds_.load(std::memory_order_acquire); }
  std::uint64_t pinned_rounds() const noexcept {
    return pinned_rounds_.load(std::memory_order_relaxed);
  }

 private:
  static constexpr std::size_t unpinned = ~std::size_t{0};
  // Loads are measured over the last `window` periods: long enough that a stage whose
  // items come in bursts is seen at its average, short enough to follow a change.
  static constexpr std::size_t window = 8;
  struct look {
    std::int64_t cpu_ns;
    std::uint64_t items;
    std::uint64_t spin_rounds;  // the worker's, in waits
  };
  struct seen {
    pthread_t thread;
    std::vector<look> looks;  // the last looks, oldest first
    std::size_t cpu;          // index into cpus_ it is pinned to, or unpinned
  };

  // The first round comes 10 ms after the start, whatever the period: a load per item
  // needs only a few items, until the first plan the OS's placement (right or wrong)
  // stands, and a run of a few tens of milliseconds should not spend most of it there.
  // Over 10 ms /proc/stat's ticks cannot tell other processes' share from nothing (the
  // tick allowance is about 1), so automatic goes by the stage threads' own share then:
  // at `fill` or more, other work had less than the rest. The next round, a period
  // later, sees the machine's share again.
  static constexpr std::chrono::milliseconds first_round{10};
  void loop() {
    round_ns_ = spin_round_ns();
    std::unique_lock lock{mutex_};
    auto wait = std::min(first_round, period_);
    while (!wake_.wait_for(lock, wait, [this] { return stopping_; })) {
      lock.unlock();
      place();
      if (on_round_) on_round_(where_);
      // relaxed: published by the release below.
      if (all_pinned()) pinned_rounds_.fetch_add(1, std::memory_order_relaxed);
      // release: a test that reads rounds() (acquire) sees this round's pins, and a
      // report that reads it sees the pinned rounds counted with it.
      rounds_.fetch_add(1, std::memory_order_release);
      lock.lock();
      wait = period_;
    }
  }

  static constexpr double min_gain = 0.9;  // re-pin only for a plan 10% cheaper per item

  // The shares of the allowed cores since the last round; own_ns: the stage threads'
  // CPU time in it.
  core_shares measure(std::int64_t own_ns) {
    const std::int64_t wall = conveyor::now_ns();
    const std::int64_t process = conveyor::process_cpu_ns();
    const std::optional<cpu_ticks> ticks = read_cpu_ticks(cpus_);
    const double capacity =
        static_cast<double>(std::max<std::int64_t>(wall - last_wall_ns_, 1)) *
        static_cast<double>(cpus_.size());
    core_shares s;
    s.own = static_cast<double>(own_ns) / capacity;
    s.process = static_cast<double>(process - last_process_ns_) / capacity;
    if (ticks && last_ticks_ && ticks->total > last_ticks_->total) {
      const auto total = static_cast<double>(ticks->total - last_ticks_->total);
      s.machine = static_cast<double>(ticks->busy - last_ticks_->busy) / total;
      s.tick = static_cast<double>(cpus_.size()) / total;
    }
    last_wall_ns_ = wall;
    last_process_ns_ = process;
    last_ticks_ = ticks;
    return override_ ? override_(s) : s;
  }

  // Whether the last round left every stage thread it saw pinned (and saw one at least).
  bool all_pinned() const noexcept {
    return !seen_.empty() &&
           std::all_of(seen_.begin(), seen_.end(), [](const seen& s) { return s.cpu != unpinned; });
  }

  // Every thread back on all the CPUs this process was allowed when the placer started.
  void unpin(std::vector<seen>& threads) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const int c : cpus_) CPU_SET(c, &set);
    for (seen& s : threads) {
      if (s.cpu == unpinned) continue;
      if (pthread_setaffinity_np(s.thread, sizeof(set), &set) == 0) s.cpu = unpinned;
    }
  }

  // One round: every live worker's load over the window, a plan, the pins; then where
  // the chain's stages run (where_).
  void place() {
    workers_.with_live([this](const std::vector<thread_registry::entry>& live) {
      plan_and_pin(live);
      describe(live);
    });
  }

  // The stages' CPUs and loads after a round, from seen_ and loads_ (the round's
  // threads, in the order of `live`).
  void describe(const std::vector<thread_registry::entry>& live) {
    where_.cpu.assign(workers_.chain_size(), chain_placement::not_pinned);
    where_.load_ns.assign(workers_.chain_size(), 0.0);
    std::vector<std::size_t> threads(workers_.chain_size(), 0);
    for (std::size_t i = 0; i < live.size() && i < seen_.size(); ++i) {
      const std::size_t at = workers_.spot(live[i]).stage;
      if (at >= where_.cpu.size()) continue;
      const seen& s = seen_[i];
      ++threads[at];
      where_.cpu[at] = threads[at] == 1 && s.cpu != unpinned ? s.cpu : chain_placement::not_pinned;
      where_.load_ns[at] = threads[at] == 1 && i < loads_.size() ? loads_[i] : 0.0;
    }
  }

  // Measures every live worker, plans, pins (the body of a round).
  void plan_and_pin(const std::vector<thread_registry::entry>& live) {
    std::vector<seen> now;
    std::vector<double>& loads = loads_;  // kept for describe()
    loads.clear();
    std::vector<thread_spot> spots;
    std::int64_t own_ns = 0;  // the stage threads' CPU time since the last round
    for (const auto& w : live) {
      const look current{conveyor::cpu_clock_ns(w.cpu_clock), w.stage->snapshot().items,
                         w.stage->worker(w.worker).spin_rounds()};
      const auto before = std::find_if(seen_.begin(), seen_.end(), [&](const seen& s) {
        return pthread_equal(s.thread, w.thread) != 0;
      });
      // A worker seen for the first time is measured from its start.
      seen s{w.thread, {}, unpinned};
      if (before != seen_.end()) s = std::move(*before);
      const look oldest = s.looks.empty() ? look{0, 0, 0} : s.looks.front();
      own_ns += current.cpu_ns - (s.looks.empty() ? 0 : s.looks.back().cpu_ns);
      loads.push_back(load_per_item(
          current.cpu_ns - oldest.cpu_ns, current.items - oldest.items,
          static_cast<double>(current.spin_rounds - oldest.spin_rounds) * round_ns_));
      if (s.looks.size() == window) s.looks.erase(s.looks.begin());
      s.looks.push_back(current);
      now.push_back(std::move(s));
      spots.push_back(workers_.spot(w));
    }
    if (policy_ == pin_policy::automatic && !rule_.next(measure(own_ns))) {
      unpin(now);
      seen_ = std::move(now);
      return;
    }
    const std::vector<std::size_t> plan = plan_threads(loads, spots, cpus_.size());
    const bool pinned_now = std::all_of(now.begin(), now.end(),
                                        [](const seen& s) { return s.cpu != unpinned; });
    if (pinned_now && !now.empty()) {
      std::vector<std::size_t> current(now.size());
      for (std::size_t i = 0; i < now.size(); ++i) current[i] = now[i].cpu;
      if (plan_cost(loads, spots, plan, cpus_.size()) >=
          min_gain * plan_cost(loads, spots, current, cpus_.size())) {
        seen_ = std::move(now);  // no clear gain: nothing moves
        return;
      }
    }
    for (std::size_t i = 0; i < now.size(); ++i) {
      if (now[i].cpu == plan[i]) continue;
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus_[plan[i]], &set);
      // A failure (the mask was restricted from outside) leaves the thread where it is.
      if (pthread_setaffinity_np(now[i].thread, sizeof(set), &set) == 0) now[i].cpu = plan[i];
    }
    seen_ = std::move(now);
  }

  thread_registry& workers_;
  const std::chrono::milliseconds period_;
  const std::vector<int> cpus_;
  const pin_policy policy_;
  const shares_override override_;
  const listener on_round_;

  // The placer thread only (after the constructor):
  std::vector<seen> seen_;  // the last round's threads, in the registry's order then
  std::vector<double> loads_;  // their loads in that round (load_per_item), in that order
  chain_placement where_;
  double round_ns_ = 0;  // spin_round_ns(), measured here rather than in start()
  auto_pin_rule rule_;
  std::int64_t last_wall_ns_ = 0, last_process_ns_ = 0;
  std::optional<cpu_ticks> last_ticks_;
  std::atomic<std::uint64_t> rounds_{0};
  std::atomic<std::uint64_t> pinned_rounds_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

#else

// Elsewhere nothing is pinned: the OS places the threads.
class thread_registry final : public worker_registry {
 public:
  void set_chain(std::vector<const metrics::stage_stats*>) {}
  bool enter(const metrics::stage_stats&, std::size_t) noexcept override { return false; }
  void leave() noexcept override {}
};
class load_placer {
 public:
  using shares_override = std::function<core_shares(const core_shares& measured)>;
  using listener = std::function<void(const chain_placement&)>;
  load_placer(thread_registry&, std::chrono::milliseconds, pin_policy = pin_policy::always,
              shares_override = {}, listener = {}) {}
  void stop() noexcept {}
  std::uint64_t rounds() const noexcept { return 0; }
  std::uint64_t pinned_rounds() const noexcept { return 0; }
};

#endif

}  // namespace conveyor::detail
