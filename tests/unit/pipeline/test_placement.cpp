// Placement by load: the plan (LPT) on known loads, and a pipeline that pins its heavy
// stage alone on a CPU while the light ones share another. Automatic placement: when it
// pins (the rule on known shares, a placer fed chosen shares), what it reads from
// /proc/stat, and a pipeline that must not pin beside busy threads of its process.
#include "conveyor/pipeline/placement.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <ranges>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "conveyor/pipeline.hpp"
#include "test_support.hpp"

using namespace conveyor;
using detail::plan_placement;

TEST_CASE("plan_placement: heaviest first, each onto the least loaded CPU") {
  // The overlap benchmark's stages: 300 us alone; 200 + 100 us together; the source and
  // sink (next to nothing) go where there is least.
  const std::vector<double> loads{0.01, 0.67, 1.0, 0.33, 0.02};
  const auto plan = plan_placement(loads, 2);
  REQUIRE(plan.size() == 5);
  CHECK(plan[2] == 0);  // 1.0 first, onto CPU 0
  CHECK(plan[1] == 1);  // 0.67 onto the empty CPU 1
  CHECK(plan[3] == 1);  // 0.33: CPU 1 (0.67) is lighter than CPU 0 (1.0)
  CHECK(plan[4] == 0);  // 0.02: both at 1.0, ties go to the lower CPU
  CHECK(plan[0] == 1);  // 0.01: CPU 1 (1.0) < CPU 0 (1.02)

  // More CPUs than threads: each thread gets a CPU of its own.
  const auto spread = plan_placement({3.0, 1.0, 2.0}, 4);
  CHECK(spread == std::vector<std::size_t>{0, 2, 1});
  // One CPU, or no threads.
  CHECK(plan_placement({1.0, 2.0}, 1) == std::vector<std::size_t>{0, 0});
  CHECK(plan_placement({}, 2).empty());
  // Equal loads alternate; negative loads (no sample) count as nothing.
  CHECK(plan_placement({1.0, 1.0, 1.0, 1.0}, 2) == std::vector<std::size_t>{0, 1, 0, 1});
  CHECK(plan_placement({-5.0, 1.0}, 2) == std::vector<std::size_t>{1, 0});
}

namespace {
// Spots of a chain of single-worker stages, stage i for thread i.
std::vector<detail::thread_spot> chain_of(std::size_t n) {
  std::vector<detail::thread_spot> spots(n);
  for (std::size_t i = 0; i < n; ++i) spots[i].stage = i;
  return spots;
}
using plan_t = std::vector<std::size_t>;
}  // namespace

TEST_CASE("plan_runs: neighbours in chain order, the heaviest run as light as it can be") {
  using detail::plan_runs;
  using detail::thread_spot;
  // Four equal stages on 2 CPUs: the first two together, the last two together.
  CHECK(plan_runs({1, 1, 1, 1}, chain_of(4), 2) == plan_t{0, 0, 1, 1});
  // The threads may come in any order (the registry's is when each started): the chain
  // order is their spots'.
  const std::vector<thread_spot> shuffled{{3, 0}, {1, 0}, {0, 0}, {2, 0}};
  CHECK(plan_runs({1, 1, 1, 1}, shuffled, 2) == plan_t{1, 0, 0, 1});
  // The cut that makes the heaviest run lightest: [1 3 | 1 1] (4), not [1 | 3 1 1] (5).
  CHECK(plan_runs({1, 3, 1, 1}, chain_of(4), 2) == plan_t{0, 0, 1, 1});
  CHECK(plan_runs({5, 1, 1, 1, 5}, chain_of(5), 3) == plan_t{0, 1, 1, 1, 2});
  // Every CPU gets a run while there are threads to give: the bound (10) would let the
  // three light ones share one, and CPUs would stay idle.
  CHECK(plan_runs({1, 1, 1, 10}, chain_of(4), 4) == plan_t{0, 1, 2, 3});
  CHECK(plan_runs({1, 1, 1, 10}, chain_of(4), 3) == plan_t{0, 1, 1, 2});
  // More CPUs than threads, one CPU, none, negative loads (no sample: nothing).
  CHECK(plan_runs({2, 1}, chain_of(2), 4) == plan_t{0, 1});
  CHECK(plan_runs({2, 1, 3}, chain_of(3), 1) == plan_t{0, 0, 0});
  CHECK(plan_runs({}, {}, 2).empty());
  CHECK(plan_runs({-4, 1, 1}, chain_of(3), 2) == plan_t{0, 0, 1});
  // Workers of one stage are neighbours too, in worker order.
  const std::vector<thread_spot> two_workers{{0, 0}, {1, 1}, {1, 0}, {2, 0}};
  CHECK(plan_runs({1, 1, 1, 1}, two_workers, 2) == plan_t{0, 1, 0, 1});
}

TEST_CASE("cross_hops: how often an item changes CPU under a plan") {
  using detail::cross_hops;
  using detail::thread_spot;
  CHECK(cross_hops(chain_of(4), {0, 0, 1, 1}) == Approx(1.0));
  CHECK(cross_hops(chain_of(4), {0, 1, 0, 1}) == Approx(3.0));
  CHECK(cross_hops(chain_of(4), {1, 1, 1, 1}) == Approx(0.0));
  // A two-worker stage in the middle: an item takes either worker, so each hop beside it
  // crosses for half the items.
  const std::vector<thread_spot> two_workers{{0, 0}, {1, 0}, {1, 1}, {2, 0}};
  CHECK(cross_hops(two_workers, {0, 0, 1, 1}) == Approx(1.0));
  CHECK(cross_hops(two_workers, {0, 1, 0, 1}) == Approx(1.0));
  CHECK(cross_hops(two_workers, {0, 1, 1, 0}) == Approx(2.0));
  // A thread of no known stage talks to nobody; a gap in the chain is no hop.
  CHECK(cross_hops({{0, 0}, {thread_spot::no_stage, 0}, {1, 0}}, {0, 1, 0}) == Approx(0.0));
  CHECK(cross_hops({{0, 0}, {2, 0}}, {0, 1}) == Approx(0.0));
}

TEST_CASE("plan_threads: LPT's balance for microsecond stages, runs for nanosecond ones") {
  using detail::plan_threads;
  // bench_pipeline's overlap stages (ns per item): 300 us alone, as LPT has it; the best
  // runs ([src 200 | 300 100 sink]: 400 us) would cost a third more per item.
  const std::vector<double> overlap{10, 200'000, 300'000, 100'000, 20};
  CHECK(plan_threads(overlap, chain_of(5), 2) == plan_placement(overlap, 2));
  // Its trivial stages (source, x+1, x*2, sink) as measured in a first round: LPT
  // balances them a little better than the runs, but every hop crosses.
  const std::vector<double> trivial{13.9, 22.0, 20.1, 12.3};
  CHECK(plan_placement(trivial, 2) == plan_t{1, 0, 1, 0});
  CHECK(plan_threads(trivial, chain_of(4), 2) == plan_t{0, 0, 1, 1});
  // The cost: the busiest CPU plus the hops.
  CHECK(detail::plan_cost(trivial, chain_of(4), {0, 0, 1, 1}, 2) ==
        Approx(35.9 + detail::cross_hop_ns));
  CHECK(detail::plan_cost(trivial, chain_of(4), {1, 0, 1, 0}, 2) ==
        Approx(34.3 + 3 * detail::cross_hop_ns));
  // Equal costs go to the runs.
  CHECK(plan_threads({1, 1}, chain_of(2), 2) == plan_t{0, 1});
}

TEST_CASE("load_per_item: CPU time per item the stage moved") {
  using detail::load_per_item;
  CHECK(load_per_item(300'000, 1000) == Approx(300.0));
  // A stage that moved nothing in the window: its CPU time counts as one item's.
  CHECK(load_per_item(5'000'000, 0) == Approx(5'000'000.0));
  CHECK(load_per_item(0, 0) == 0.0);
  // A clock read that went backwards (it cannot, but a load is never negative).
  CHECK(load_per_item(-10, 3) == 0.0);
  // Time spun in waits is not load.
  CHECK(load_per_item(300'000, 1000, 100'000.0) == Approx(200.0));
  CHECK(load_per_item(300'000, 1000, 400'000.0) == 0.0);
  CHECK(load_per_item(300'000, 1000, -5.0) == Approx(300.0));
  // What a spin round costs: measured, a pause and a load (nanoseconds, not micro).
  CHECK(detail::spin_round_ns() > 0.0);
  CHECK(detail::spin_round_ns() < 10'000.0);
}

TEST_CASE("auto_pin_rule: pins while alone and full, lets go when others come or it idles") {
  using detail::auto_pin_rule;
  using detail::core_shares;
  const core_shares alone_full{.own = 0.95, .process = 0.96, .machine = 0.97};
  const core_shares alone_half{.own = 0.45, .process = 0.46, .machine = 0.47};
  auto_pin_rule r;
  CHECK_FALSE(r.pinned());
  // Not full: the OS places the threads, however quiet the machine.
  CHECK_FALSE(r.next(alone_half));
  CHECK_FALSE(r.next({.own = 0.79, .process = 0.79, .machine = 0.79}));
  // Full and alone: pinned at once.
  CHECK(r.next(alone_full));
  CHECK(r.pinned());
  // Noise between quiet and busy changes nothing once pinned...
  CHECK(r.next({.own = 0.8, .process = 0.95, .machine = 0.97}));  // others 0.17
  // ...but other work above `busy` lets go at once: another process...
  CHECK_FALSE(r.next({.own = 0.7, .process = 0.7, .machine = 0.95}));  // others 0.25
  // ...and pinning again needs others <= quiet, not only below busy.
  CHECK_FALSE(r.next({.own = 0.85, .process = 0.85, .machine = 1.0}));  // others 0.15
  CHECK(r.next(alone_full));
  // Other threads of this process count as other work too.
  CHECK_FALSE(r.next({.own = 0.6, .process = 0.9, .machine = 0.92}));  // others 0.32
  CHECK(r.next(alone_full));
  // Idle for one round stays pinned (a gap between bursts); for two, lets go.
  CHECK(r.next(alone_half));
  CHECK(r.next(alone_full));
  CHECK(r.next(alone_half));
  CHECK_FALSE(r.next(alone_half));
  // The machine's share unknown: never pinned.
  CHECK_FALSE(r.next({.own = 1.0, .process = 1.0, .machine = -1}));
  CHECK(core_shares{.own = 1.0, .process = 1.0, .machine = -1}.others() == 1.0);
  // Shares that do not add up (measurement noise) never make others negative.
  CHECK(core_shares{.own = 0.9, .process = 0.85, .machine = 0.8}.others() == 0.0);
  CHECK(core_shares{.own = 0.5, .process = 0.7, .machine = 0.9}.others() == Approx(0.4));
  // Other processes count beyond a tick per CPU: over a round of 10 ticks per CPU a
  // machine share 0.1 above the process's may be nothing but where the ticks fell.
  CHECK(core_shares{.own = 0.8, .process = 0.8, .machine = 0.9, .tick = 0.1}.others() == 0.0);
  CHECK(core_shares{.own = 0.8, .process = 0.8, .machine = 1.0, .tick = 0.1}.others() ==
        Approx(0.1));
  auto_pin_rule first;
  CHECK(first.next({.own = 0.88, .process = 0.88, .machine = 1.0, .tick = 1.0}));
}

TEST_CASE("plan_packed: light neighbours in pairs, only with CPUs to spare") {
  using detail::plan_packed;
  const std::vector<double> trivial{13.9, 22.0, 20.1, 12.3};
  CHECK(plan_packed(trivial, chain_of(4), 16) == plan_t{0, 0, 1, 1});
  CHECK(detail::cpus_used({0, 0, 1, 1}) == 2);
  // An odd one out alone; chain order, not the registry's order, makes the pairs.
  CHECK(plan_packed({5, 5, 5, 5, 5}, chain_of(5), 8) == plan_t{0, 0, 1, 1, 2});
  std::vector<detail::thread_spot> reversed = chain_of(4);
  std::reverse(reversed.begin(), reversed.end());
  CHECK(plan_packed(trivial, reversed, 16) == plan_t{1, 1, 0, 0});
  CHECK(plan_packed({3, 4}, chain_of(2), 4) == plan_t{0, 0});
  // No CPU to spare, one thread, or a stage of microseconds: nothing to pack.
  CHECK(plan_packed(trivial, chain_of(4), 4).empty());
  CHECK(plan_packed(trivial, chain_of(4), 2).empty());
  CHECK(plan_packed({10}, chain_of(1), 16).empty());
  CHECK(plan_packed({13.9, 2'000, 20.1, 12.3}, chain_of(4), 16).empty());
  CHECK_FALSE(plan_packed({13.9, detail::light_stage_ns, 20.1, 12.3}, chain_of(4), 16).empty());
}

TEST_CASE("packing_trial: a spread baseline, a round to settle, then the rates decide") {
  using detail::packing_trial;
  packing_trial t;
  CHECK_FALSE(t.packed());
  CHECK_FALSE(t.hurried());
  // Not eligible (heavy stages, idle threads, other work): spread, however fast.
  CHECK_FALSE(t.next(false, 1e9));
  // Eligible: the next round measures the spread rate, then the threads are packed.
  CHECK_FALSE(t.next(true, 0));  // the first eligible round's rate may hold the start-up
  CHECK(t.hurried());
  CHECK(t.next(true, 10e6));  // the baseline: 10 M items/s spread; packed from now
  CHECK(t.packed());
  CHECK(t.hurried());
  CHECK(t.next(true, 1e6));   // settling: a slow round while threads move does not count
  CHECK(t.next(true, 10e6));  // as fast as spread: packing stays (fewer cores)
  CHECK(t.packed());
  CHECK_FALSE(t.hurried());
  CHECK(t.next(true, 5e6));  // kept while eligible, whatever the rate
  // No longer eligible: back to the OS, and a new trial may start at once.
  CHECK_FALSE(t.next(false, 5e6));
  CHECK_FALSE(t.packed());
  CHECK_FALSE(t.next(true, 5e6));
  CHECK(t.next(true, 20e6));  // baseline 20 M
  CHECK(t.next(true, 20e6));  // settling
  // Packed moved fewer: back to the OS, and no trial for min_backoff rounds.
  CHECK_FALSE(t.next(true, 15e6));
  CHECK_FALSE(t.packed());
  CHECK_FALSE(t.hurried());
  for (std::uint32_t i = 0; i < packing_trial::min_backoff; ++i) CHECK_FALSE(t.next(true, 20e6));
  CHECK_FALSE(t.hurried());
  CHECK_FALSE(t.next(true, 20e6));  // eligible again: measuring
  CHECK(t.hurried());
  CHECK(t.next(true, 20e6));
  CHECK(t.next(true, 20e6));
  CHECK_FALSE(t.next(true, 19e6));  // lost again: the wait doubles
  std::uint32_t waited = 0;
  while (!t.hurried() && waited < 10 * packing_trial::max_backoff) {
    CHECK_FALSE(t.next(true, 20e6));
    ++waited;
  }
  CHECK(waited == 2 * packing_trial::min_backoff + 1);  // the wait, then the measuring round
  // Losing eligibility during the trial ends it without a wait.
  CHECK(t.next(true, 20e6));
  CHECK_FALSE(t.next(false, 20e6));
  CHECK_FALSE(t.packed());
  CHECK_FALSE(t.next(true, 20e6));
  CHECK(t.hurried());
}

TEST_CASE("parse_cpu_ticks: the allowed CPUs' lines of /proc/stat") {
  using detail::parse_cpu_ticks;
  const std::string_view stat =
      "cpu  42267 0 3278 736333 328 0 88 315 0 0\n"
      "cpu0 27069 1 1321 362706 27 5 23 203 7 0\n"
      "cpu1 15198 0 1956 373626 301 0 64 112 0 0\n"
      "cpu10 1 1 1 1 1 1 1 1 0 0\n"
      "intr 309041 0 0\n";
  // busy: user + nice + system + irq + softirq; total: busy + idle + iowait + steal.
  const auto c0 = parse_cpu_ticks(stat, {0});
  REQUIRE(c0);
  CHECK(c0->busy == 27069 + 1 + 1321 + 5 + 23);
  CHECK(c0->total == c0->busy + 362706 + 27 + 203);
  const auto both = parse_cpu_ticks(stat, {0, 1});
  REQUIRE(both);
  CHECK(both->busy == c0->busy + 15198 + 1956 + 64);
  // A label ends at its space: cpu1's line is not cpu10's, nor is the total line ("cpu ")
  // any CPU's.
  const auto c10 = parse_cpu_ticks(stat, {10});
  REQUIRE(c10);
  CHECK(c10->busy == 5);
  CHECK(c10->total == 8);
  // A CPU without a line, or a cut-off line: unknown.
  CHECK_FALSE(parse_cpu_ticks(stat, {0, 2}));
  CHECK_FALSE(parse_cpu_ticks("cpu0 1 2 3\n", {0}));
  CHECK_FALSE(parse_cpu_ticks("", {0}));
#if defined(__linux__)
  // This machine's own file holds a line for every CPU this process may use.
  CHECK(detail::read_cpu_ticks(conveyor::allowed_cpus()));
#endif
}

TEST_CASE("pipeline: placement by load needs a sane period") {
  const auto make = [](pipeline_options o) {
    return pipeline{
        from_range(std::views::iota(0, 10)) | map([](int x) { return x; }) | sink([](int) {}), o};
  };
  CHECK_THROWS_WITH(make({.placement = thread_placement::by_load,
                          .placement_period = std::chrono::milliseconds(1)}),
                    Catch::Contains("placement_period must be >= 10 ms"));
  CHECK_NOTHROW(make({.placement = thread_placement::by_load}).run());
  // It measures CPU time and item counts, which are kept with metrics off too.
  CHECK_NOTHROW(make({.metrics = false, .placement = thread_placement::by_load}).run());
  // The report says which placement ran; os runs no placer, so no rounds.
  const report os = make({.placement = thread_placement::os}).run();
  CHECK(os.placement.mode == "os");
  CHECK(os.placement.rounds == 0);
  CHECK(make({}).run().placement.mode == "automatic");
}

#if defined(__linux__)
namespace {
// The CPUs this thread may run on.
std::vector<int> my_cpus() { return conveyor::allowed_cpus(); }

// CPU sets read by two stages are compared only from reads made while both ran: a stage
// that has finished leaves the placer, which may then rightly move the others. One stage
// reads its CPUs at its last item (x == n - 1), then sets `done`; the other, on every
// item, keeps what it read only if `done` was not yet set (checked after the read), so
// it is left with its latest read made while the first still ran.
void read_cpus_at_last(int x, int n, std::vector<int>& cpus, std::atomic<bool>& done) {
  if (x != n - 1) return;
  cpus = my_cpus();
  done = true;
}
void keep_cpus_while(std::vector<int>& kept, const std::atomic<bool>& other_done) {
  std::vector<int> now = my_cpus();
  if (!other_done) kept = std::move(now);
}

// How many CPUs a thread may run on.
std::size_t cpus_of(pthread_t t) {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(pthread_getaffinity_np(t, sizeof(set), &set) == 0);
  return static_cast<std::size_t>(CPU_COUNT(&set));
}

// Stops and joins a test's threads however the test ends (a failed REQUIRE throws).
struct stop_and_join {
  std::atomic<bool>& stop;
  std::vector<std::thread>& threads;
  ~stop_and_join() {
    stop.store(true);
    for (auto& t : threads) t.join();
  }
};

}  // namespace

TEST_CASE("load_placer, automatic: pins while the shares say alone and full, else lets go") {
  if (my_cpus().size() < 2) {
    WARN("fewer than 2 CPUs allowed: placement pins nothing, nothing to check");
    return;
  }
  // Three stage workers that burn CPU per item, and a placer whose measured shares the
  // test replaces (what the machine really does under CTest cannot be chosen).
  detail::thread_registry registry;
  std::atomic<bool> stop{false};
  std::atomic<int> registered{0};
  std::vector<metrics::stage_stats> stages;
  for (int i = 0; i < 3; ++i) stages.emplace_back(1);
  std::vector<pthread_t> handles(3);
  std::vector<std::thread> workers;
  for (std::size_t i = 0; i < 3; ++i)
    workers.emplace_back([&, i] {
      handles[i] = pthread_self();
      const detail::registered_worker entry{&registry, stages[i], 0};
      registered.fetch_add(1);
      while (!stop.load()) {
        test::burn_thread_cpu(std::chrono::microseconds(50 * (i + 1)));
        stages[i].worker(0).add_items(1);
      }
    });
  const stop_and_join join_workers{stop, workers};
  while (registered.load() < 3) std::this_thread::yield();

  enum class seen : int { alone_half, alone_full, crowded };
  std::atomic<seen> shares{seen::alone_half};
  detail::load_placer placer{
      registry, std::chrono::milliseconds(10), detail::pin_policy::automatic,
      [&](const detail::core_shares&) {
        switch (shares.load()) {
          case seen::alone_full:
            return detail::core_shares{.own = 1, .process = 1, .machine = 1};
          case seen::crowded:
            return detail::core_shares{.own = 0.6, .process = 0.6, .machine = 1};
          default:
            return detail::core_shares{.own = 0.4, .process = 0.4, .machine = 0.4};
        }
      }};
  // Waits until two rounds have begun after now: the second saw the shares set before.
  const auto two_rounds = [&] {
    const std::uint64_t from = placer.rounds();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (placer.rounds() < from + 2 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(placer.rounds() >= from + 2);
  };
  const std::size_t all = my_cpus().size();
  const auto pinned = [&](std::size_t cpus) {
    for (const pthread_t t : handles) CHECK(cpus_of(t) == cpus);
  };
  two_rounds();
  two_rounds();
  pinned(all);  // not full: never pinned
  CHECK(placer.pinned_rounds() == 0);
  shares.store(seen::alone_full);
  two_rounds();
  pinned(1);
  CHECK(placer.pinned_rounds() >= 1);  // the round that pinned them, at least
  shares.store(seen::crowded);
  two_rounds();
  pinned(all);  // back on every allowed CPU
  // Unpinned rounds count nothing.
  const std::uint64_t pinned_so_far = placer.pinned_rounds();
  two_rounds();
  CHECK(placer.pinned_rounds() == pinned_so_far);
  shares.store(seen::alone_full);
  two_rounds();
  pinned(1);
}

TEST_CASE("shared_core_grows: a ring grows where its consumer drains the reserve within the hold") {
  using detail::shared_core_grows;
  // 8192 slots take 1 ms of the consumer's CPU time at 122 ns per element.
  CHECK(shared_core_grows(8192, 20.0));
  CHECK(shared_core_grows(8192, 122.0));
  CHECK_FALSE(shared_core_grows(8192, 123.0));
  CHECK_FALSE(shared_core_grows(8192, 1e6));  // a slow stage (1 ms an element): never
  CHECK_FALSE(shared_core_grows(8192, 0.0));  // nothing measured yet
  CHECK(shared_core_grows(64, 15e3));         // a small reserve: up to 15.6 us an element
  CHECK_FALSE(shared_core_grows(64, 16e3));
  // Neighbours share a CPU when both are pinned, to the same one.
  detail::chain_placement where{{0, 0, 1, detail::chain_placement::not_pinned, 1}, {}};
  CHECK(where.share_cpu(0));
  CHECK_FALSE(where.share_cpu(1));
  CHECK_FALSE(where.share_cpu(2));
  CHECK_FALSE(where.share_cpu(3));
  CHECK_FALSE(where.share_cpu(4));  // the last stage has no next one
  CHECK_FALSE(detail::chain_placement{
      {detail::chain_placement::not_pinned, detail::chain_placement::not_pinned},
      {}}.share_cpu(0));
}

TEST_CASE("ring_deepens: rings within a CPU, and the rings beside them between two CPUs") {
  using detail::chain_placement;
  using detail::ring_deepens;
  constexpr std::size_t none = chain_placement::not_pinned;
  const std::vector<double> light(6, 20.0);  // 20 ns an element: 8192 within 1 ms
  // Two stages per CPU: both pairs take turns, and the ring between the CPUs carries
  // what arrives while one side is switched out.
  const chain_placement pairs{{0, 0, 1, 1}, light};
  CHECK(pairs.pinned_apart(1));
  CHECK_FALSE(pairs.pinned_apart(0));
  for (std::size_t p : {0u, 1u, 2u}) CHECK(ring_deepens(pairs, p, 8192));
  // A stage per CPU: no turns, nothing grows.
  const chain_placement spread{{0, 1, 2, 3}, light};
  for (std::size_t p : {0u, 1u, 2u}) CHECK_FALSE(ring_deepens(spread, p, 8192));
  // Turns only on the producer's side (stages 0 and 1 on CPU 0), then an unpinned stage.
  const chain_placement one_side{{0, 0, 1, none, 2}, light};
  CHECK(ring_deepens(one_side, 0, 8192));
  CHECK(ring_deepens(one_side, 1, 8192));        // next to the pair on CPU 0
  CHECK_FALSE(ring_deepens(one_side, 2, 8192));  // into an unpinned stage
  CHECK_FALSE(ring_deepens(one_side, 3, 8192));  // from it
  // Turns only on the consumer's side.
  const chain_placement other_side{{0, 1, 1}, light};
  CHECK(ring_deepens(other_side, 0, 8192));
  CHECK(ring_deepens(other_side, 1, 8192));
  // Apart, with no turns on either side.
  CHECK_FALSE(ring_deepens(chain_placement{{0, 1}, light}, 0, 8192));
  // The consumer's CPU time decides as for a shared core: a slow consumer never.
  const chain_placement slow{{0, 0, 1, 1}, {20.0, 20.0, 1e6, 20.0}};
  CHECK(ring_deepens(slow, 0, 8192));
  CHECK_FALSE(ring_deepens(slow, 1, 8192));  // stage 2 takes 1 ms an element
  CHECK(ring_deepens(slow, 2, 8192));
  // Nothing measured yet: nothing grows.
  CHECK_FALSE(ring_deepens(chain_placement{{0, 0, 1, 1}, {}}, 1, 8192));
}

TEST_CASE("load_placer: after each round the listener sees where the stages run, and their loads") {
  if (my_cpus().size() < 2) {
    WARN("fewer than 2 CPUs allowed: placement pins nothing, nothing to check");
    return;
  }
  // A chain of three stages: one worker, two workers, one worker, each burning CPU per item.
  detail::thread_registry registry;
  std::vector<metrics::stage_stats> stages;
  stages.emplace_back(1);
  stages.emplace_back(2);
  stages.emplace_back(1);
  registry.set_chain({&stages[0], &stages[1], &stages[2]});
  std::atomic<bool> stop{false};
  std::atomic<int> registered{0};
  struct worker_at {
    std::size_t stage, worker;
  };
  const std::vector<worker_at> at{{0, 0}, {1, 0}, {1, 1}, {2, 0}};
  std::vector<pthread_t> handles(at.size());
  std::vector<std::thread> workers;
  for (std::size_t i = 0; i < at.size(); ++i)
    workers.emplace_back([&, i] {
      handles[i] = pthread_self();
      const detail::registered_worker entry{&registry, stages[at[i].stage], at[i].worker};
      registered.fetch_add(1);
      while (!stop.load()) {
        test::burn_thread_cpu(std::chrono::microseconds(20));
        stages[at[i].stage].worker(at[i].worker).add_items(1);
      }
    });
  const stop_and_join join_workers{stop, workers};
  while (registered.load() < static_cast<int>(at.size())) std::this_thread::yield();

  // A load is the CPU time over the items of a window of rounds, both read at slightly
  // different moments, so it is within an item's time of 20 us per item only over many
  // items: a thread that the machine starves for a round moves only a few (2 items read
  // as 10 us). So the checks take a round whose window holds at least `enough` items of
  // each single-worker stage. The listener counts them between its calls, which come
  // after the placer's reads: round k's read is no earlier than call k-1, round k-2's
  // no later than call k-2, so the window of round k (it spans two rounds at least)
  // holds at least what the listener counted between calls k-2 and k-1.
  constexpr std::uint64_t enough = 40;
  std::mutex m;
  std::vector<detail::chain_placement> seen;
  std::vector<std::uint64_t> fewest;  // per call: the fewer items of stages 0 and 2 since the last
  std::uint64_t counted[2] = {0, 0};
  detail::load_placer placer{registry,
                             std::chrono::milliseconds(10),
                             detail::pin_policy::always,
                             {},
                             [&](const detail::chain_placement& where) {
                               const std::lock_guard lock{m};
                               seen.push_back(where);
                               const std::uint64_t now[2] = {stages[0].items(), stages[2].items()};
                               fewest.push_back(std::min(now[0] - counted[0], now[1] - counted[1]));
                               counted[0] = now[0];
                               counted[1] = now[1];
                             }};
  // The last round whose window holds enough items (seen[k] and fewest[k]: round k + 1).
  const auto measured = [&]() -> std::optional<std::size_t> {
    for (std::size_t k = fewest.size(); k-- > 2;)
      if (fewest[k - 1] >= enough) return k;
    return std::nullopt;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    {
      const std::lock_guard lock{m};
      if (measured() || std::chrono::steady_clock::now() >= until) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  placer.stop();  // no round moves a thread between the last report and the checks below
  const std::lock_guard lock{m};
  REQUIRE(measured());
  const detail::chain_placement& loaded = seen[*measured()];
  // by_load pins every worker in every round. A stage of one worker is reported on the
  // CPU its thread is pinned to; one of two workers is not on one CPU.
  const detail::chain_placement& last = seen.back();
  REQUIRE(last.cpu.size() == 3);
  const std::vector<int> cpus = my_cpus();
  for (const std::size_t stage : {std::size_t{0}, std::size_t{2}}) {
    CAPTURE(stage);
    REQUIRE(last.cpu[stage] < cpus.size());
    const pthread_t t = handles[stage == 0 ? 0 : 3];
    CHECK(cpus_of(t) == 1);
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(pthread_getaffinity_np(t, sizeof set, &set) == 0);
    CHECK(CPU_ISSET(cpus[last.cpu[stage]], &set));
    // Its load: the thread's CPU time per item, 20 us of burning and the count.
    CHECK(loaded.load(stage) >= 19e3);
    CHECK(loaded.load(stage) < 200e3);
  }
  CHECK(last.cpu[1] == detail::chain_placement::not_pinned);
  CHECK(last.load(1) == 0.0);      // two workers: no one load
  CHECK(last.load(3) == 0.0);      // no such stage
  CHECK_FALSE(last.share_cpu(0));  // the middle stage is not one thread
  CHECK_FALSE(last.share_cpu(1));
}

TEST_CASE("pipeline: automatic placement pins nothing beside busy threads of its process") {
  if (my_cpus().size() < 2) {
    WARN("fewer than 2 CPUs allowed: placement pins nothing, nothing to check");
    return;
  }
  // One busy thread per allowed CPU: the rest of the process takes a large part of the
  // cores whatever else the machine runs, so the pipeline's threads (on 2 cores they
  // would fill them alone: 600 us of CPU per item over 3 stages) must stay unpinned.
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (std::size_t i = 0; i < my_cpus().size(); ++i)
    busy.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed))
        test::burn_thread_cpu(std::chrono::microseconds(100));
    });
  const stop_and_join join_busy{stop, busy};
  constexpr int n = 300;
  std::vector<std::size_t> fewest_cpus(3, ~std::size_t{0});  // the fewest each stage saw
  const auto stage = [](std::chrono::microseconds cost, std::size_t& fewest) {
    return [cost, &fewest](int x) {
      test::burn_thread_cpu(cost);
      fewest = std::min(fewest, my_cpus().size());
      return x;
    };
  };
  using std::chrono::microseconds;
  pipeline p{from_range(std::views::iota(0, n)) | map(stage(microseconds(200), fewest_cpus[0])) |
                 map(stage(microseconds(300), fewest_cpus[1])) |
                 map(stage(microseconds(100), fewest_cpus[2])) | sink([](int) {}),
             pipeline_options{.placement_period = std::chrono::milliseconds(10)}};
  const report r = p.run();
  REQUIRE(r.completed == n);
  for (const std::size_t fewest : fewest_cpus) CHECK(fewest == my_cpus().size());
  CHECK(r.placement.mode == "automatic");
  CHECK(r.placement.pinned_rounds == 0);
}

TEST_CASE("pipeline: placement by load pins the heavy stage alone, the light ones together") {
  if (my_cpus().size() < 2) {
    WARN("fewer than 2 CPUs allowed: placement pins nothing, nothing to check");
    return;
  }
  // Each map stage records the CPUs it may run on as late as all three still run: light
  // a, which runs ahead (its output ring holds every item), at its last item
  // (read_cpus_at_last), the others while light a runs (keep_cpus_while). By then the
  // placer (every 10 ms) has pinned every worker to one CPU and has no plan worth moving
  // to. The sink is not checked: its load is next to nothing, so sharing the heavy
  // stage's CPU costs that CPU nothing, and the placer rightly leaves it there when it
  // got there first (3 runs in 30 did, on this 2-CPU machine).
  constexpr int n = 400;
  std::vector<int> heavy_cpus, light_a_cpus, light_b_cpus;
  std::atomic<bool> light_a_done{false};
  pipeline p{from_range(std::views::iota(0, n)) |
                 map([&](int x) {
                   test::burn_thread_cpu(std::chrono::microseconds(100));
                   read_cpus_at_last(x, n, light_a_cpus, light_a_done);
                   return x;
                 }).name("light a") |
                 map([&](int x) {
                   test::burn_thread_cpu(std::chrono::microseconds(300));
                   keep_cpus_while(heavy_cpus, light_a_done);
                   return x;
                 }).name("heavy") |
                 map([&](int x) {
                   test::burn_thread_cpu(std::chrono::microseconds(100));
                   keep_cpus_while(light_b_cpus, light_a_done);
                   return x;
                 }).name("light b") |
                 sink([](int) {}),
             pipeline_options{.placement = thread_placement::by_load,
                              .placement_period = std::chrono::milliseconds(10)}};
  const report r = p.run();
  REQUIRE(r.completed == n);
  // Pinned, each to one CPU, and the heavy stage (300 us of the 500 per item) shares
  // its CPU with neither light one (100 us each): both light ones are elsewhere.
  REQUIRE(heavy_cpus.size() == 1);
  REQUIRE(light_a_cpus.size() == 1);
  REQUIRE(light_b_cpus.size() == 1);
  CHECK(light_a_cpus != heavy_cpus);
  CHECK(light_b_cpus != heavy_cpus);
  // The report counts the rounds after which every stage thread was pinned.
  CHECK(r.placement.mode == "by_load");
  CHECK(r.placement.pinned_rounds >= 1);
  CHECK(r.placement.pinned_rounds <= r.placement.rounds);
}

TEST_CASE("pipeline: placement by load is not fooled by a stage that runs ahead") {
  if (my_cpus().size() < 2) {
    WARN("fewer than 2 CPUs allowed: placement pins nothing, nothing to check");
    return;
  }
  // bench_pipeline's overlap stages: 200, 300 and 100 us of CPU per item. The first runs
  // ahead of the second until the ring between them fills (1024 items, longer than this
  // run), so by the wall clock it is as busy as the slow one; per item it costs two
  // thirds of it. The slow stage must end up on a CPU of its own.
  constexpr int n = 600;
  // The first two stages read their CPUs at their last item (read_cpus_at_last); the
  // last stage keeps a read made while each of them still ran (keep_cpus_while).
  std::vector<int> first_cpus, slow_cpus, last_while_first, last_while_slow;
  std::atomic<bool> first_done{false}, slow_done{false};
  const auto stage = [](std::chrono::microseconds cost, std::vector<int>& cpus,
                        std::atomic<bool>& done) {
    return [cost, &cpus, &done](int x) {
      test::burn_thread_cpu(cost);
      read_cpus_at_last(x, n, cpus, done);
      return x;
    };
  };
  using std::chrono::microseconds;
  pipeline p{from_range(std::views::iota(0, n)) |
                 map(stage(microseconds(200), first_cpus, first_done)) |
                 map(stage(microseconds(300), slow_cpus, slow_done)) | map([&](int x) {
                   test::burn_thread_cpu(microseconds(100));
                   keep_cpus_while(last_while_first, first_done);
                   keep_cpus_while(last_while_slow, slow_done);
                   return x;
                 }) |
                 sink([](int) {}),
             pipeline_options{.placement = thread_placement::by_load,
                              .placement_period = std::chrono::milliseconds(10)}};
  const report r = p.run();
  REQUIRE(r.completed == n);
  REQUIRE(slow_cpus.size() == 1);
  REQUIRE(first_cpus.size() == 1);
  REQUIRE(last_while_first.size() == 1);
  REQUIRE(last_while_slow.size() == 1);
  CHECK(slow_cpus != first_cpus);
  CHECK(slow_cpus != last_while_slow);
  // With two CPUs the other two share the second; with more each may have its own.
  if (my_cpus().size() == 2) CHECK(first_cpus == last_while_first);
}
#endif
