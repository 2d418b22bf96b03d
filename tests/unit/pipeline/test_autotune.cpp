// autotune's search on a simulated pipeline with a known optimum: each probe's report is
// computed from a model (source | decode map | batch | gpu segment | sink on a machine of
// 8 cores and one device), and its verdict comes from the real diagnose(). Three planted
// configurations (decode with too few workers, a transfer-bound segment with too few
// lanes, a compute-bound one) against an exhaustive grid over the same knobs; the P99
// objective; bad budgets. No clocks: the model is arithmetic.
#include "conveyor/pipeline/autotune.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <sstream>
#include <string>

#include "conveyor/base/error.hpp"
#include "conveyor/report/verdict.hpp"

using namespace conveyor;
namespace m = conveyor::metrics;

namespace {

// Costs in seconds. decode: per item on one core; the segment, per batch of B items:
// h2d = h0 + h1 B, compute = c0 + c1 B, d2h = d0 + d1 B. One copy engine each way and one
// compute engine: the device takes one batch's phase at a time, a lane one batch at a time.
struct model {
  double source_rate = 2e6;  // items/s
  double decode = 10e-6;
  std::size_t cores = 8;
  double h0 = 20e-6, h1 = 0.5e-6;
  double c0 = 30e-6, c1 = 0.5e-6;
  double d0 = 10e-6, d1 = 0.05e-6;
  double sink_rate = 5e6;

  // Items/s of each stage alone: source, decode, gpu, sink.
  struct caps {
    double source, decode, gpu, sink;
  };
  caps capacities(const tune_knobs& k) const {
    const double w = static_cast<double>(std::min(k.workers_of("decode", 1), cores));
    const double b = static_cast<double>(k.batch), l = static_cast<double>(k.lanes);
    const double h = h0 + h1 * b, c = c0 + c1 * b, d = d0 + d1 * b;
    const double batches = std::min({1.0 / h, 1.0 / c, 1.0 / d, l / (h + c + d)});
    return {source_rate, w / decode, b * batches, sink_rate};
  }
  double throughput(const tune_knobs& k) const {
    const caps c = capacities(k);
    return std::min({c.source, c.decode, c.gpu, c.sink});
  }

  // The report a real run of these knobs would give: the stage at the lowest capacity busy
  // ~all its capacity, those before it blocked, those after it starved.
  report operator()(const tune_knobs& k) const {
    const caps c = capacities(k);
    const double thr = throughput(k);
    const double items = 1e6, wall = items / thr;
    const double b = static_cast<double>(k.batch), lanes = static_cast<double>(k.lanes);
    report r;
    r.wall_s = wall;
    r.produced = r.completed = static_cast<std::uint64_t>(items);
    r.runtime = "host";
    const double caps_in_order[] = {c.source, c.decode, 1e18, c.gpu, c.sink};  // batch: free
    std::size_t slowest = 0;
    for (std::size_t i = 0; i < 5; ++i)
      if (caps_in_order[i] < caps_in_order[slowest]) slowest = i;
    const auto add = [&](const char* name, stage_kind kind, std::size_t workers, std::size_t i,
                         double busy) {
      m::stage_report s;
      s.name = name;
      s.kind = kind;
      s.workers = workers;
      s.items = r.completed;
      s.ring_capacity = kind == stage_kind::source ? 0 : k.ring_capacity;
      const double cap = wall * static_cast<double>(workers);
      const double rest = std::max(0.0, 0.99 - busy);
      s.busy_s = busy * cap;
      if (i < slowest) s.blocked_s = rest * cap;
      if (i > slowest) s.starved_s = rest * cap;
      r.stages.push_back(s);
    };
    const std::size_t w = k.workers_of("decode", 1);
    add("read", stage_kind::source, 1, 0, std::min(0.98, thr / c.source));
    add("decode", stage_kind::map, w, 1,
        std::min(0.98, thr * decode / static_cast<double>(std::min(w, cores))) *
            static_cast<double>(std::min(w, cores)) / static_cast<double>(w));
    add("batch", stage_kind::batch, 1, 2, 0.02);
    add("gpu", stage_kind::gpu, k.lanes, 3, 0.04);
    add("write", stage_kind::sink, 1, 4, std::min(0.98, thr / c.sink));
    // Lanes: each batch's three phases on one lane's stream.
    const double batches = items / b;
    const double h = h0 + h1 * b, cc = c0 + c1 * b, d = d0 + d1 * b;
    for (std::size_t i = 0; i < k.lanes; ++i) {
      m::lane_report l;
      l.lane = i;
      l.batches = static_cast<std::uint64_t>(batches / lanes);
      l.items = static_cast<std::uint64_t>(items / lanes);
      l.h2d_s = batches / lanes * h;
      l.compute_s = batches / lanes * cc;
      l.d2h_s = batches / lanes * d;
      l.h2d_bytes = static_cast<std::uint64_t>(batches / lanes * b * 4096);
      l.d2h_bytes = static_cast<std::uint64_t>(batches / lanes * b * 64);
      r.lanes.push_back(l);
    }
    r.gpu_busy_fraction = std::min(1.0, batches * cc / wall);
    r.batching = m::batch_report{k.batch, b, static_cast<std::uint64_t>(batches), 0};
    r.item_latency.p99_s = 2.0 * (b / thr + h + cc + d);
    m::complete_report(r);
    return r;
  }
};

// The grid the tuner is measured against: every combination of the same knobs.
struct grid_best {
  double throughput = 0;
  std::size_t probes = 0;
};
grid_best grid(const model& md) {
  grid_best g;
  for (std::size_t w : {1, 2, 4, 8, 16})
    for (std::size_t l : {1, 2, 4, 8})
      for (std::size_t b : {16, 32, 64, 128, 256, 512, 1024})
        for (std::size_t ring : {1024, 4096}) {
          tune_knobs k;
          k.workers["decode"] = w;
          k.lanes = l;
          k.batch = b;
          k.ring_capacity = ring;
          g.throughput = std::max(g.throughput, md.throughput(k));
          ++g.probes;
        }
  return g;
}

// The model has no noise, so a 2 % gain is real; a shared machine needs the default 5 %.
tune_budget sim_budget() {
  tune_budget b;
  b.max_probes = 30;
  b.max_workers = 16;
  b.min_gain = 0.02;
  return b;
}

std::string text(const tune_result& t) {
  std::ostringstream o;
  o << t;
  return o.str();
}

}  // namespace

TEST_CASE("autotune, simulated: decode with too few workers -> its workers, then the device") {
  const model md;  // decode 10 us/item: 100 k/s per worker, the segment ~1.4 M/s at batch 64
  tune_knobs start;
  start.workers["decode"] = 1;
  const tune_result t = autotune(md, {}, sim_budget(), start);
  INFO(text(t));
  const grid_best g = grid(md);
  REQUIRE(t.trials.front().kind == verdict_kind::cpu_stage_bound);
  REQUIRE(t.trials.front().stage == "decode");
  CHECK(t.best.workers_of("decode") == 8);  // the cores: 16 gains nothing
  CHECK(t.best_throughput >= 0.95 * g.throughput);
  CHECK(t.trials.size() * 5 <= g.probes);
  CHECK_THAT(t.stopped, Catch::Contains("workers 'decode' 8 -> 16"));
}

TEST_CASE("autotune, simulated: a transfer-bound segment with one lane -> lanes, then batch") {
  model md;
  md.decode = 0.5e-6;  // decode is cheap: the segment sets the pace
  md.h1 = 2e-6;        // copies dominate each batch
  md.c0 = 10e-6;
  md.c1 = 0.2e-6;
  tune_knobs start;
  start.workers["decode"] = 4;
  start.lanes = 1;
  start.batch = 16;
  const tune_result t = autotune(md, {}, sim_budget(), start);
  INFO(text(t));
  const grid_best g = grid(md);
  REQUIRE(t.trials.front().kind == verdict_kind::transfer_bound_h2d);
  CHECK(t.best.lanes >= 2);
  CHECK(t.best_throughput >= 0.95 * g.throughput);
  CHECK(t.trials.size() * 5 <= g.probes);
}

TEST_CASE("autotune, simulated: compute-bound -> says the device is the bottleneck") {
  model md;
  md.decode = 0.5e-6;
  md.c0 = 5e-6;
  md.c1 = 4e-6;  // 4 us per item on the device, whatever the batch
  tune_knobs start;
  start.workers["decode"] = 4;
  const tune_result t = autotune(md, {}, sim_budget(), start);
  INFO(text(t));
  const grid_best g = grid(md);
  CHECK(t.trials.front().kind == verdict_kind::compute_bound);
  CHECK_THAT(t.stopped, Catch::Contains("the device is the bottleneck") &&
                            Catch::Contains("nothing is left to tune on the host"));
  CHECK(t.best_throughput >= 0.95 * g.throughput);
  CHECK(t.trials.size() <= 3);  // start, batch x2, (batch x2 again if it won)
}

TEST_CASE("autotune: a P99 bound halves the batch until a probe meets it") {
  model md;
  md.decode = 0.5e-6;
  tune_knobs start;
  start.workers["decode"] = 8;
  start.batch = 1024;
  const double p99_at_1024 = md(start).item_latency.p99_s;
  const auto bound = std::chrono::nanoseconds(static_cast<long long>(p99_at_1024 / 6 * 1e9));
  const tune_result t = autotune(md, tune_objective::within_p99(bound), sim_budget(), start);
  INFO(text(t));
  REQUIRE(t.objective_met);
  CHECK(t.best_p99_s <= static_cast<double>(bound.count()) * 1e-9);
  CHECK(t.best.batch < 1024);
  CHECK(t.trials[1].move == "batch 1024 -> 512");
}

TEST_CASE("autotune: the table shows every probe, and bad budgets say what to change") {
  const model md;
  tune_budget b = sim_budget();
  b.max_probes = 2;
  const tune_result t = autotune(md, {}, b);
  REQUIRE(t.trials.size() == 2);
  CHECK(t.stopped == "budget: 2 probes");
  const std::string s = text(t);
  CHECK_THAT(s, Catch::Contains("autotune: 2 probes") && Catch::Contains("start") &&
                    Catch::Contains("workers 'decode' 1 -> 2") &&
                    Catch::Contains("cpu_stage_bound 'decode'"));
  b.max_probes = 0;
  CHECK_THROWS_AS(autotune(md, {}, b), config_error);
  b = sim_budget();
  b.min_gain = 1.5;
  CHECK_THROWS_AS(autotune(md, {}, b), config_error);
}
