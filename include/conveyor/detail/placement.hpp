// conveyor/detail/placement.hpp: pins a pipeline's stage threads to CPUs by what each
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
// What it does: every period it reads each worker thread's CPU time (its thread CPU
// clock) and the items its stage moved, and takes the CPU time per item over the last
// `window` periods as the worker's load: what it needs for the pipeline to move one
// item. Per item, not per period: a stage squeezed onto a shared core moves fewer items
// and uses less CPU, but not less per item, so the measure does not depend on the
// placement it is meant to correct, and a stage that runs ahead of a slower one while
// its output ring fills does not look heavier than it is. (Wall-clock busy time cannot
// serve: two stages sharing a core both look 100% busy.) It then assigns the workers to
// the CPUs this process may run on, heaviest first, each to the CPU with the least load
// so far (LPT), and pins each thread to its CPU. Once all are pinned, a new plan is
// applied only when it makes the busiest CPU at least 10% lighter.
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

#include "conveyor/metrics/clock.hpp"
#include "conveyor/metrics/stage_stats.hpp"

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

// A worker's load over a window: CPU time spent per item its stage moved. A window in
// which the stage moved nothing counts as one item (a stage busy with its first, or one
// long item, is heavy; one that only waited used next to no CPU).
inline double load_per_item(std::int64_t cpu_ns, std::uint64_t items) noexcept {
  return static_cast<double>(std::max<std::int64_t>(cpu_ns, 0)) /
         static_cast<double>(std::max<std::uint64_t>(items, 1));
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
class thread_registry {
 public:
  struct entry {
    pthread_t thread;
    clockid_t cpu_clock;
    const metrics::stage_stats* stage;
  };

  // Adds the calling thread. false: not added (no CPU clock, out of memory); the worker
  // then runs where the OS puts it.
  bool add(const metrics::stage_stats& stage) noexcept {
    entry e{pthread_self(), {}, &stage};
    if (pthread_getcpuclockid(e.thread, &e.cpu_clock) != 0) return false;
    try {
      const std::lock_guard lock{mutex_};
      live_.push_back(e);
      return true;
    } catch (...) {
      return false;
    }
  }
  void remove(pthread_t t) noexcept {
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
};

// A stage worker's membership in the registry, for as long as it runs: construct it on
// the worker's thread (registry null: placement is off, nothing happens).
class placement_entry {
 public:
  placement_entry(thread_registry* registry, const metrics::stage_stats& stage) noexcept
      : registry_(registry != nullptr && registry->add(stage) ? registry : nullptr) {}
  ~placement_entry() {
    if (registry_ != nullptr) registry_->remove(pthread_self());
  }
  placement_entry(const placement_entry&) = delete;
  placement_entry& operator=(const placement_entry&) = delete;

 private:
  thread_registry* registry_;
};

class load_placer {
 public:
  // What was measured in a round (automatic only), for a test to replace.
  using shares_override = std::function<core_shares(const core_shares& measured)>;

  // Starts re-planning every period, on a thread of its own. Does nothing (no thread)
  // when this process may run on fewer than two CPUs.
  load_placer(thread_registry& workers, std::chrono::milliseconds period,
              pin_policy policy = pin_policy::always, shares_override override_shares = {})
      : workers_(workers),
        period_(period),
        cpus_(metrics::allowed_cpus()),
        policy_(policy),
        override_(std::move(override_shares)) {
    if (cpus_.size() < 2) return;
    if (policy_ == pin_policy::automatic) {
      last_ticks_ = read_cpu_ticks(cpus_);
      last_wall_ns_ = metrics::now_ns();
      last_process_ns_ = metrics::process_cpu_ns();
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

  // Rounds done so far (for tests: "after a round that saw this").
  std::uint64_t rounds() const noexcept { return rounds_.load(std::memory_order_acquire); }

 private:
  static constexpr std::size_t unpinned = ~std::size_t{0};
  // Loads are measured over the last `window` periods: long enough that a stage whose
  // items come in bursts is seen at its average, short enough to follow a change.
  static constexpr std::size_t window = 8;
  struct look {
    std::int64_t cpu_ns;
    std::uint64_t items;
  };
  struct seen {
    pthread_t thread;
    std::vector<look> looks;  // the last looks, oldest first
    std::size_t cpu;          // index into cpus_ it is pinned to, or unpinned
  };

  // The first round comes after a fifth of a period (10 ms at least): a load per item
  // needs only a few items, and until the first plan the OS's placement, right or
  // wrong, stands.
  void loop() {
    std::unique_lock lock{mutex_};
    auto wait = std::max<std::chrono::milliseconds>(period_ / 5, std::chrono::milliseconds(10));
    while (!wake_.wait_for(lock, wait, [this] { return stopping_; })) {
      lock.unlock();
      place();
      // release: a test that reads rounds() (acquire) sees this round's pins.
      rounds_.fetch_add(1, std::memory_order_release);
      lock.lock();
      wait = period_;
    }
  }

  // The load of the busiest CPU under an assignment.
  double busiest(const std::vector<double>& loads, const std::vector<std::size_t>& cpu_of) const {
    std::vector<double> per_cpu(cpus_.size(), 0.0);
    for (std::size_t i = 0; i < loads.size(); ++i) per_cpu[cpu_of[i]] += loads[i];
    return *std::max_element(per_cpu.begin(), per_cpu.end());
  }
  static constexpr double min_gain = 0.9;  // re-pin only for a 10% lighter busiest CPU

  // The shares of the allowed cores since the last round; own_ns: the stage threads'
  // CPU time in it.
  core_shares measure(std::int64_t own_ns) {
    const std::int64_t wall = metrics::now_ns();
    const std::int64_t process = metrics::process_cpu_ns();
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

  // One round: every live worker's load over the window, a plan, the pins.
  void place() {
    workers_.with_live([this](const std::vector<thread_registry::entry>& live) {
      std::vector<seen> now;
      std::vector<double> loads;
      std::int64_t own_ns = 0;  // the stage threads' CPU time since the last round
      for (const auto& w : live) {
        const look current{metrics::cpu_clock_ns(w.cpu_clock), w.stage->snapshot().items};
        const auto before = std::find_if(seen_.begin(), seen_.end(), [&](const seen& s) {
          return pthread_equal(s.thread, w.thread) != 0;
        });
        // A worker seen for the first time is measured from its start.
        seen s{w.thread, {}, unpinned};
        if (before != seen_.end()) s = std::move(*before);
        const look oldest = s.looks.empty() ? look{0, 0} : s.looks.front();
        own_ns += current.cpu_ns - (s.looks.empty() ? 0 : s.looks.back().cpu_ns);
        loads.push_back(load_per_item(current.cpu_ns - oldest.cpu_ns, current.items - oldest.items));
        if (s.looks.size() == window) s.looks.erase(s.looks.begin());
        s.looks.push_back(current);
        now.push_back(std::move(s));
      }
      if (policy_ == pin_policy::automatic && !rule_.next(measure(own_ns))) {
        unpin(now);
        seen_ = std::move(now);
        return;
      }
      const std::vector<std::size_t> plan = plan_placement(loads, cpus_.size());
      const bool all_pinned = std::all_of(now.begin(), now.end(),
                                          [](const seen& s) { return s.cpu != unpinned; });
      if (all_pinned && !now.empty()) {
        std::vector<std::size_t> current(now.size());
        for (std::size_t i = 0; i < now.size(); ++i) current[i] = now[i].cpu;
        if (busiest(loads, plan) >= min_gain * busiest(loads, current)) {
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
    });
  }

  thread_registry& workers_;
  const std::chrono::milliseconds period_;
  const std::vector<int> cpus_;
  const pin_policy policy_;
  const shares_override override_;
  // The placer thread only (after the constructor):
  std::vector<seen> seen_;
  auto_pin_rule rule_;
  std::int64_t last_wall_ns_ = 0, last_process_ns_ = 0;
  std::optional<cpu_ticks> last_ticks_;
  std::atomic<std::uint64_t> rounds_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

#else

// Elsewhere nothing is pinned: the OS places the threads.
class thread_registry {};
class placement_entry {
 public:
  placement_entry(thread_registry*, const metrics::stage_stats&) noexcept {}
};
class load_placer {
 public:
  using shares_override = std::function<core_shares(const core_shares& measured)>;
  load_placer(thread_registry&, std::chrono::milliseconds, pin_policy = pin_policy::always,
              shares_override = {}) {}
  void stop() noexcept {}
  std::uint64_t rounds() const noexcept { return 0; }
};

#endif

}  // namespace conveyor::detail
