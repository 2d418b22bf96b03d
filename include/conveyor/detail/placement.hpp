// conveyor/detail/placement.hpp: pins a pipeline's stage threads to CPUs by what each
// stage costs per item (pipeline_options::placement = thread_placement::by_load).
//
//   detail::thread_registry placed;                  // every stage worker adds itself
//   ctl.placed = &placed;                            //   (worker_probe does, on its thread)
//   detail::load_placer placer{placed, 200ms};       // re-plans every period
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
// Thread-safety: thread_registry from any thread (a mutex: each worker adds and removes
// itself once). load_placer's constructor and stop() from the owning thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <numeric>
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

#if defined(__linux__)

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
  // Starts re-planning every period, on a thread of its own. Does nothing (no thread)
  // when this process may run on fewer than two CPUs.
  load_placer(thread_registry& workers, std::chrono::milliseconds period)
      : workers_(workers), period_(period), cpus_(metrics::allowed_cpus()) {
    if (cpus_.size() >= 2) thread_ = std::thread([this] { loop(); });
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

  // One round: every live worker's load over the window, a plan, the pins.
  void place() {
    workers_.with_live([this](const std::vector<thread_registry::entry>& live) {
      std::vector<seen> now;
      std::vector<double> loads;
      for (const auto& w : live) {
        const look current{metrics::cpu_clock_ns(w.cpu_clock), w.stage->snapshot().items};
        const auto before = std::find_if(seen_.begin(), seen_.end(), [&](const seen& s) {
          return pthread_equal(s.thread, w.thread) != 0;
        });
        // A worker seen for the first time is measured from its start.
        seen s{w.thread, {}, unpinned};
        if (before != seen_.end()) s = std::move(*before);
        const look oldest = s.looks.empty() ? look{0, 0} : s.looks.front();
        loads.push_back(load_per_item(current.cpu_ns - oldest.cpu_ns, current.items - oldest.items));
        if (s.looks.size() == window) s.looks.erase(s.looks.begin());
        s.looks.push_back(current);
        now.push_back(std::move(s));
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
  std::vector<seen> seen_;  // the placer thread only
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
  load_placer(thread_registry&, std::chrono::milliseconds) {}
  void stop() noexcept {}
};

#endif

}  // namespace conveyor::detail
