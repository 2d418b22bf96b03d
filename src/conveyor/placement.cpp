// src/conveyor/placement.cpp: the placer (conveyor/pipeline/placement.hpp).
#include "conveyor/pipeline/placement.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <utility>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "conveyor/base/clock.hpp"
#include "conveyor/base/cpu_relax.hpp"

namespace conveyor::detail {

namespace {
// The threads' indices in chain order (by spot; ties keep the registry's order).
std::vector<std::size_t> chain_order(const std::vector<thread_spot>& spots) {
  std::vector<std::size_t> order(spots.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return spots[a] < spots[b]; });
  return order;
}
}  // namespace

std::vector<std::size_t> plan_placement(const std::vector<double>& loads, std::size_t cpus) {
  std::vector<std::size_t> order(loads.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return loads[a] > loads[b]; });
  std::vector<double> cpu_load(std::max<std::size_t>(cpus, 1), 0.0);
  std::vector<std::size_t> plan(loads.size(), 0);
  for (const std::size_t t : order) {
    const auto least = static_cast<std::size_t>(std::min_element(cpu_load.begin(), cpu_load.end()) -
                                                cpu_load.begin());
    plan[t] = least;
    cpu_load[least] += std::max(loads[t], 0.0);
  }
  return plan;
}

std::vector<std::size_t> plan_runs(const std::vector<double>& loads,
                                   const std::vector<thread_spot>& spots, std::size_t cpus) {
  const std::size_t n = loads.size();
  const std::vector<std::size_t> order = chain_order(spots);
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

double cross_hops(const std::vector<thread_spot>& spots, const std::vector<std::size_t>& plan) {
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

double plan_cost(const std::vector<double>& loads, const std::vector<thread_spot>& spots,
                 const std::vector<std::size_t>& plan, std::size_t cpus) {
  std::vector<double> per_cpu(std::max<std::size_t>(cpus, 1), 0.0);
  for (std::size_t i = 0; i < loads.size(); ++i) per_cpu[plan[i]] += std::max(loads[i], 0.0);
  return *std::max_element(per_cpu.begin(), per_cpu.end()) + cross_hop_ns * cross_hops(spots, plan);
}

std::vector<std::size_t> plan_threads(const std::vector<double>& loads,
                                      const std::vector<thread_spot>& spots, std::size_t cpus) {
  std::vector<std::size_t> runs = plan_runs(loads, spots, cpus);
  std::vector<std::size_t> lpt = plan_placement(loads, cpus);
  return plan_cost(loads, spots, lpt, cpus) < plan_cost(loads, spots, runs, cpus) ? lpt : runs;
}

std::size_t cpus_used(const std::vector<std::size_t>& plan) {
  std::vector<std::size_t> sorted = plan;
  std::sort(sorted.begin(), sorted.end());
  return static_cast<std::size_t>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
}

std::vector<std::size_t> plan_packed(const std::vector<double>& loads,
                                     const std::vector<thread_spot>& spots, std::size_t cpus) {
  const std::size_t n = loads.size();
  if (n < 2 || cpus <= n) return {};
  if (std::any_of(loads.begin(), loads.end(), [](double l) { return l > light_stage_ns; }))
    return {};
  const std::vector<std::size_t> order = chain_order(spots);
  std::vector<std::size_t> plan(n);
  for (std::size_t i = 0; i < n; ++i) plan[order[i]] = i / 2;
  return plan;
}

double load_per_item(std::int64_t cpu_ns, std::uint64_t items, double spun_ns) noexcept {
  return std::max(static_cast<double>(cpu_ns) - std::max(spun_ns, 0.0), 0.0) /
         static_cast<double>(std::max<std::uint64_t>(items, 1));
}

double spin_round_ns() {
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

std::optional<cpu_ticks> parse_cpu_ticks(std::string_view stat, const std::vector<int>& cpus) {
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

#if defined(__linux__)

// /proc/stat's ticks for the given CPUs (nullopt: unreadable, or a CPU missing).
std::optional<cpu_ticks> read_cpu_ticks(const std::vector<int>& cpus) {
  std::FILE* const f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return std::nullopt;
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return parse_cpu_ticks(text, cpus);
}

// The registry's live workers: one entry per running stage worker.
struct thread_registry::state {
  struct entry {
    pthread_t thread;
    clockid_t cpu_clock;
    const metrics::stage_stats* stage;
    std::size_t worker;  // which of the stage's workers
  };

  // Where a worker sits in the chain; stage no_stage when its stage is not in it.
  thread_spot spot(const entry& e) const noexcept {
    const auto at = std::find(chain.begin(), chain.end(), e.stage);
    return {
        at == chain.end() ? thread_spot::no_stage : static_cast<std::size_t>(at - chain.begin()),
        e.worker};
  }

  // Calls f(live workers) under the lock: they cannot end while f runs.
  template <class F>
  void with_live(F&& f) {
    const std::lock_guard lock{mutex};
    f(live);
  }

  std::mutex mutex;
  std::vector<entry> live;
  std::vector<const metrics::stage_stats*> chain;
};

thread_registry::thread_registry() : state_(std::make_unique<state>()) {}
thread_registry::~thread_registry() = default;

void thread_registry::set_chain(std::vector<const metrics::stage_stats*> stages) {
  state_->chain = std::move(stages);
}
std::size_t thread_registry::chain_size() const noexcept { return state_->chain.size(); }

bool thread_registry::enter(const metrics::stage_stats& stage, std::size_t worker) noexcept {
  state::entry e{pthread_self(), {}, &stage, worker};
  if (pthread_getcpuclockid(e.thread, &e.cpu_clock) != 0) return false;
  try {
    const std::lock_guard lock{state_->mutex};
    state_->live.push_back(e);
    return true;
  } catch (...) {
    return false;
  }
}

void thread_registry::leave() noexcept {
  const pthread_t t = pthread_self();
  const std::lock_guard lock{state_->mutex};
  std::erase_if(state_->live,
                [&](const state::entry& e) { return pthread_equal(e.thread, t) != 0; });
}

struct load_placer::impl {
  impl(thread_registry& workers, std::chrono::milliseconds period, pin_policy policy,
       shares_override override_shares, listener on_round)
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
  ~impl() { stop(); }

  void stop() noexcept {
    {
      const std::lock_guard lock{mutex_};
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

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
      wait = trial_.hurried() ? std::min(first_round, period_) : period_;
    }
  }

  static constexpr double min_gain = 0.9;  // re-pin only for a plan 10% cheaper per item

  // The shares of the allowed cores since the last round; own_ns: the stage threads'
  // CPU time in it.
  core_shares measure(std::int64_t own_ns) {
    const std::int64_t wall = conveyor::now_ns();
    const std::int64_t process = conveyor::process_cpu_ns();
    const std::optional<cpu_ticks> ticks = read_cpu_ticks(cpus_);
    const double capacity = static_cast<double>(std::max<std::int64_t>(wall - last_wall_ns_, 1)) *
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
    workers_.live().with_live([this](const std::vector<thread_registry::state::entry>& live) {
      plan_and_pin(live);
      describe(live);
    });
  }

  // The stages' CPUs and loads after a round, from seen_ and loads_ (the round's
  // threads, in the order of `live`).
  void describe(const std::vector<thread_registry::state::entry>& live) {
    where_.cpu.assign(workers_.chain_size(), chain_placement::not_pinned);
    where_.load_ns.assign(workers_.chain_size(), 0.0);
    std::vector<std::size_t> threads(workers_.chain_size(), 0);
    for (std::size_t i = 0; i < live.size() && i < seen_.size(); ++i) {
      const std::size_t at = workers_.live().spot(live[i]).stage;
      if (at >= where_.cpu.size()) continue;
      const seen& s = seen_[i];
      ++threads[at];
      where_.cpu[at] = threads[at] == 1 && s.cpu != unpinned ? s.cpu : chain_placement::not_pinned;
      where_.load_ns[at] = threads[at] == 1 && i < loads_.size() ? loads_[i] : 0.0;
    }
  }

  // Measures every live worker, plans, pins (the body of a round).
  void plan_and_pin(const std::vector<thread_registry::state::entry>& live) {
    std::vector<seen> now;
    std::vector<double>& loads = loads_;  // kept for describe()
    loads.clear();
    std::vector<thread_spot> spots;
    std::int64_t own_ns = 0;  // the stage threads' CPU time since the last round
    // The items the chain moved since the last round: the fewest any thread's stage moved.
    std::uint64_t chain_items = live.empty() ? 0 : ~std::uint64_t{0};
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
      chain_items =
          std::min(chain_items, current.items - (s.looks.empty() ? 0 : s.looks.back().items));
      loads.push_back(
          load_per_item(current.cpu_ns - oldest.cpu_ns, current.items - oldest.items,
                        static_cast<double>(current.spin_rounds - oldest.spin_rounds) * round_ns_));
      if (s.looks.size() == window) s.looks.erase(s.looks.begin());
      s.looks.push_back(current);
      now.push_back(std::move(s));
      spots.push_back(workers_.live().spot(w));
    }
    std::vector<std::size_t> plan;
    if (policy_ == pin_policy::automatic) {
      const std::int64_t since = last_wall_ns_;
      const core_shares shares = measure(own_ns);
      // Packing a chain of light stages (packing_trial): eligible while its threads keep
      // busy the cores they have (packed: the CPUs of the plan; spread: a core each).
      std::vector<std::size_t> packed = plan_packed(loads, spots, cpus_.size());
      const std::size_t cores = trial_.packed() ? cpus_used(packed) : now.size();
      const bool eligible = !packed.empty() && shares.others() <= auto_pin_rule::quiet &&
                            shares.own * static_cast<double>(cpus_.size()) >=
                                auto_pin_rule::fill * static_cast<double>(cores);
      const double seconds =
          static_cast<double>(std::max<std::int64_t>(last_wall_ns_ - since, 1)) * 1e-9;
      if (trial_.next(eligible, static_cast<double>(chain_items) / seconds)) {
        plan = std::move(packed);
      } else if (!rule_.next(shares)) {
        unpin(now);
        seen_ = std::move(now);
        return;
      }
    }
    if (plan.empty()) plan = plan_threads(loads, spots, cpus_.size());
    const bool pinned_now =
        std::all_of(now.begin(), now.end(), [](const seen& s) { return s.cpu != unpinned; });
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
  std::vector<seen> seen_;     // the last round's threads, in the registry's order then
  std::vector<double> loads_;  // their loads in that round (load_per_item), in that order
  chain_placement where_;
  double round_ns_ = 0;  // spin_round_ns(), measured here rather than in start()
  auto_pin_rule rule_;
  packing_trial trial_;
  std::int64_t last_wall_ns_ = 0, last_process_ns_ = 0;
  std::optional<cpu_ticks> last_ticks_;
  std::atomic<std::uint64_t> rounds_{0};
  std::atomic<std::uint64_t> pinned_rounds_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

load_placer::load_placer(thread_registry& workers, std::chrono::milliseconds period,
                         pin_policy policy, shares_override override_shares, listener on_round)
    : impl_(std::make_unique<impl>(workers, period, policy, std::move(override_shares),
                                   std::move(on_round))) {}
load_placer::~load_placer() = default;
void load_placer::stop() noexcept { impl_->stop(); }
std::uint64_t load_placer::rounds() const noexcept {
  // acquire: pairs with the release increment after each round (see impl::loop()).
  return impl_->rounds_.load(std::memory_order_acquire);
}
std::uint64_t load_placer::pinned_rounds() const noexcept {
  // relaxed: counted before the release increment of rounds_, read after rounds().
  return impl_->pinned_rounds_.load(std::memory_order_relaxed);
}

#else

// Elsewhere nothing is pinned: the OS places the threads.
std::optional<cpu_ticks> read_cpu_ticks(const std::vector<int>&) { return std::nullopt; }

struct thread_registry::state {
  std::vector<const metrics::stage_stats*> chain;
};
thread_registry::thread_registry() : state_(std::make_unique<state>()) {}
thread_registry::~thread_registry() = default;
void thread_registry::set_chain(std::vector<const metrics::stage_stats*> stages) {
  state_->chain = std::move(stages);
}
std::size_t thread_registry::chain_size() const noexcept { return state_->chain.size(); }
bool thread_registry::enter(const metrics::stage_stats&, std::size_t) noexcept { return false; }
void thread_registry::leave() noexcept {}

struct load_placer::impl {};
load_placer::load_placer(thread_registry&, std::chrono::milliseconds, pin_policy, shares_override,
                         listener) {}
load_placer::~load_placer() = default;
void load_placer::stop() noexcept {}
std::uint64_t load_placer::rounds() const noexcept { return 0; }
std::uint64_t load_placer::pinned_rounds() const noexcept { return 0; }

#endif

}  // namespace conveyor::detail
