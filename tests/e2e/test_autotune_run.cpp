// autotune over real pipelines on the host runtime: a planted CPU-bound decode (a stage
// that waits 200 us per item, so more workers help whatever the machine's cores) with one
// worker. The tuner must name it first, move only its workers, and stop at the budget's
// limit with the moves it tried in the table.
#include "conveyor/pipeline/autotune.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <ranges>
#include <sstream>
#include <thread>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"

using namespace conveyor;
using R = host::runtime;
using namespace std::chrono_literals;

TEST_CASE("autotune on the host runtime: a slow decode gets its workers, nothing else moves") {
  using item = std::uint64_t;
  const auto probe = [](const tune_knobs& k) {
    // ~0.25 s at 8 workers: long enough for each probe's verdict to name a stage.
    const std::uint64_t n = 8000;
    auto seg = gpu<R, std::uint8_t, std::uint8_t>(
        {.lanes = k.lanes, .in_elems = 64, .out_elems = 64},
        [](std::vector<item>&, R::pinned_span<std::uint8_t>) { return std::size_t{64}; },
        [](lane_batch<R, std::uint8_t, std::uint8_t>& l) {
          l.stream.enqueue([] { std::this_thread::sleep_for(20us); });
          return std::size_t{64};
        },
        [](std::vector<item>&& b, R::pinned_span<const std::uint8_t>) { return std::move(b); });
    pipeline p{from_range(std::views::iota(item{0}, n)) |
                   map([](item x) {
                     std::this_thread::sleep_for(200us);  // waits: busy without a core
                     return x;
                   })
                       .workers(k.workers_of("decode", 1))
                       .name("decode") |
                   batch(k.batch) | std::move(seg) | unbatch() | sink([](item) {}),
               {.ring_capacity = k.ring_capacity}};
    return p.run();
  };
  tune_budget budget;
  budget.max_workers = 8;
  budget.max_probes = 8;
  tune_knobs start;
  start.workers["decode"] = 1;
  const tune_result t = autotune(probe, tune_objective::throughput(), budget, start);
  std::ostringstream text;
  text << t;
  INFO(text.str());
  REQUIRE(t.trials.size() >= 2);
  CHECK(to_string(t.trials.front().kind) == to_string(verdict_kind::cpu_stage_bound));
  CHECK(t.trials.front().stage == "decode");
  CHECK(t.trials[1].move == "workers 'decode' 1 -> 2");
  // Each doubling of a waiting stage's workers nearly doubles its rate: at least two kept.
  CHECK(t.best.workers_of("decode") >= 4);
  CHECK(t.best_throughput >= 2.5 * t.trials.front().throughput);
  // Only the decode's knob moved while it was the bottleneck.
  for (const tune_trial& tr : t.trials)
    if (tr.kept) CHECK((tr.move == "start" || tr.move.starts_with("workers 'decode'")));
  CHECK_THAT(text.str(), Catch::Contains("workers 'decode' 1 -> 2") && Catch::Contains("stopped:"));
}
