// Placement by load: the plan (LPT) on known loads, and a pipeline that pins its heavy
// stage alone on a CPU while the light ones share another.
#include "conveyor/detail/placement.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ranges>
#include <thread>
#include <vector>

#include "conveyor/metrics/clock.hpp"
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
  CHECK(plan[2] == 0);        // 1.0 first, onto CPU 0
  CHECK(plan[1] == 1);        // 0.67 onto the empty CPU 1
  CHECK(plan[3] == 1);        // 0.33: CPU 1 (0.67) is lighter than CPU 0 (1.0)
  CHECK(plan[4] == 0);        // 0.02: both at 1.0, ties go to the lower CPU
  CHECK(plan[0] == 1);        // 0.01: CPU 1 (1.0) < CPU 0 (1.02)

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

TEST_CASE("load_per_item: CPU time per item the stage moved") {
  using detail::load_per_item;
  CHECK(load_per_item(300'000, 1000) == Approx(300.0));
  // A stage that moved nothing in the window: its CPU time counts as one item's.
  CHECK(load_per_item(5'000'000, 0) == Approx(5'000'000.0));
  CHECK(load_per_item(0, 0) == 0.0);
  // A clock read that went backwards (it cannot, but a load is never negative).
  CHECK(load_per_item(-10, 3) == 0.0);
}

TEST_CASE("pipeline: placement by load needs a sane period") {
  const auto make = [](pipeline_options o) {
    return pipeline{from_range(std::views::iota(0, 10)) | map([](int x) { return x; }) |
                        sink([](int) {}),
                    o};
  };
  CHECK_THROWS_WITH(make({.placement = thread_placement::by_load,
                          .placement_period = std::chrono::milliseconds(1)}),
                    Catch::Contains("placement_period must be >= 10 ms"));
  CHECK_NOTHROW(make({.placement = thread_placement::by_load}).run());
  // It measures CPU time and item counts, which are kept with metrics off too.
  CHECK_NOTHROW(make({.metrics = false, .placement = thread_placement::by_load}).run());
}

#if defined(__linux__)
namespace {
// The CPUs this thread may run on.
std::vector<int> my_cpus() { return metrics::allowed_cpus(); }

}  // namespace

TEST_CASE("pipeline: placement by load pins the heavy stage alone, the light ones together") {
  if (my_cpus().size() < 2) {
    WARN("fewer than 2 CPUs allowed: placement pins nothing, nothing to check");
    return;
  }
  // Each map stage records the CPUs it may run on when it sees the middle item: by then
  // the placer (every 10 ms) has pinned every worker to one CPU and has no plan worth
  // moving to. The sink is not checked: its load is next to nothing, so sharing the heavy
  // stage's CPU costs that CPU nothing, and the placer rightly leaves it there when it
  // got there first (3 runs in 30 did, on this 2-CPU machine).
  constexpr int n = 400;
  std::vector<int> heavy_cpus, light_a_cpus, light_b_cpus;
  const auto light = [](std::vector<int>& cpus) {
    return [&cpus](int x) {
      test::burn_thread_cpu(std::chrono::microseconds(100));
      if (x == n / 2) cpus = my_cpus();
      return x;
    };
  };
  pipeline p{from_range(std::views::iota(0, n)) | map(light(light_a_cpus)).name("light a") |
                 map([&](int x) {
                   test::burn_thread_cpu(std::chrono::microseconds(300));
                   if (x == n / 2) heavy_cpus = my_cpus();
                   return x;
                 }).name("heavy") |
                 map(light(light_b_cpus)).name("light b") | sink([](int) {}),
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
  std::vector<int> first_cpus, slow_cpus, last_cpus;
  const auto stage = [n](std::chrono::microseconds cost, std::vector<int>& cpus) {
    return [n, cost, &cpus](int x) {
      test::burn_thread_cpu(cost);
      if (x == n - 1) cpus = my_cpus();
      return x;
    };
  };
  using std::chrono::microseconds;
  pipeline p{from_range(std::views::iota(0, n)) | map(stage(microseconds(200), first_cpus)) |
                 map(stage(microseconds(300), slow_cpus)) |
                 map(stage(microseconds(100), last_cpus)) | sink([](int) {}),
             pipeline_options{.placement = thread_placement::by_load,
                              .placement_period = std::chrono::milliseconds(10)}};
  const report r = p.run();
  REQUIRE(r.completed == n);
  REQUIRE(slow_cpus.size() == 1);
  REQUIRE(first_cpus.size() == 1);
  REQUIRE(last_cpus.size() == 1);
  CHECK(slow_cpus != first_cpus);
  CHECK(slow_cpus != last_cpus);
  // With two CPUs the other two share the second; with more each may have its own.
  if (my_cpus().size() == 2) CHECK(first_cpus == last_cpus);
}
#endif
