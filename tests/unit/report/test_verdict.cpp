// diagnose(): one synthetic report per verdict case with realistic numbers, near-misses
// on each side of every threshold, and planted bottlenecks in a simulated pipeline
// whose busy / starved / blocked times come from a tick-by-tick model of workers and
// bounded rings (not written by hand).
#include "conveyor/report/verdict.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "conveyor/counters/interval_union.hpp"
#include "conveyor/report/timeline.hpp"

namespace m = conveyor::metrics;
using m::stage_kind;
using m::verdict_kind;

namespace {

// ---- synthetic reports --------------------------------------------------------------

struct stage_spec {
  const char* name;
  stage_kind kind;
  std::size_t workers;
  double busy, starved, blocked;  // fractions of wall x workers
};

struct lane_spec {
  double h2d, compute, d2h;  // fractions of wall, per lane
};

m::report make_report(double wall, const std::vector<stage_spec>& stages,
                      const std::vector<lane_spec>& lanes = {}, double gpu_busy = 0.0,
                      std::uint64_t items = 100'000) {
  m::report r;
  r.wall_s = wall;
  r.produced = r.completed = items;
  r.runtime = "host";
  for (const auto& s : stages) {
    m::stage_report sr;
    sr.name = s.name;
    sr.kind = s.kind;
    sr.workers = s.workers;
    sr.items = items;
    const double cap = wall * static_cast<double>(s.workers);
    sr.busy_s = s.busy * cap;
    sr.starved_s = s.starved * cap;
    sr.blocked_s = s.blocked * cap;
    sr.ring_capacity = s.kind == stage_kind::source ? 0 : 64;
    r.stages.push_back(sr);
  }
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    m::lane_report l;
    l.lane = i;
    l.batches = items / 64 / lanes.size();
    l.items = items / lanes.size();
    l.h2d_s = lanes[i].h2d * wall;
    l.compute_s = lanes[i].compute * wall;
    l.d2h_s = lanes[i].d2h * wall;
    l.h2d_bytes = static_cast<std::uint64_t>(l.h2d_s * 12e9);  // ~12 GB/s while copying
    l.d2h_bytes = static_cast<std::uint64_t>(l.d2h_s * 12e9);
    r.lanes.push_back(l);
  }
  r.gpu_busy_fraction = gpu_busy;
  m::complete_report(r);
  return r;
}

// source -> normalize (map) -> batch -> gpu -> sink, the shape most users build.
m::report gpu_pipeline(double norm_busy, double gpu_host_starved, lane_spec lane, double gpu_busy,
                       double norm_blocked = 0.01, double batch_blocked = 0.03) {
  const double gpu_host_blocked = 1.0 - 0.05 - gpu_host_starved;
  const double batch_starved = 1.0 - 0.04 - batch_blocked;
  return make_report(
      10.0,
      {{"read", stage_kind::source, 1, 0.05, 0.0, 0.93},
       {"normalize", stage_kind::map, 2, norm_busy, 0.99 - norm_busy - norm_blocked, norm_blocked},
       {"batch", stage_kind::batch, 1, 0.04, batch_starved, batch_blocked},
       {"gpu", stage_kind::gpu, 2, 0.05, gpu_host_starved, gpu_host_blocked},
       {"write", stage_kind::sink, 1, 0.02, 0.96, 0.0}},
      {lane, lane}, gpu_busy);
}

// ---- a tick-by-tick pipeline model --------------------------------------------------

struct sim_stage {
  const char* name;
  stage_kind kind;
  std::size_t workers;
  int service;  // ticks per unit (mean; +-25 % jitter); gpu: h2d + compute + d2h
  int h2d = 0, compute = 0, d2h = 0;  // gpu only
};

// Each tick every worker first does its instantaneous steps (push a finished unit, then
// pop a new one), then spends the tick busy, blocked (holding a unit it cannot push),
// or starved (nothing to pop). Stages are visited downstream first, so room freed in a
// tick can be used upstream in the same tick. A worker exits (stops being charged) once
// its input is exhausted, as a real worker does when its ring is closed and drained.
// The gpu stage's lanes charge device time to *blocked* on the host side (the lane
// thread waits for a free slot while the device works) and report the device phases
// in lane_reports, and their compute intervals go through interval_union.
m::report simulate(const std::vector<sim_stage>& stages, int units, std::size_t ring = 8,
                   unsigned seed = 1) {
  struct worker {
    enum { idle, busy, holding, gone } state = idle;
    int remaining = 0;
    int started = 0;
    std::int64_t busy_t = 0, starved_t = 0, blocked_t = 0;
  };
  std::mt19937 rng{seed};
  const std::size_t n = stages.size();
  std::vector<std::vector<worker>> w(n);
  for (std::size_t k = 0; k < n; ++k) w[k].resize(stages[k].workers);
  std::vector<std::deque<int>> rings(n);  // rings[k]: input of stage k (k >= 1)
  std::vector<std::int64_t> done_by_stage(n, 0);
  int produced = 0, completed = 0;
  std::vector<m::lane_report> lanes;
  m::interval_union compute_union{256};
  std::size_t gpu = n;
  for (std::size_t k = 0; k < n; ++k)
    if (stages[k].kind == stage_kind::gpu) {
      gpu = k;
      lanes.resize(stages[k].workers);
      for (std::size_t l = 0; l < lanes.size(); ++l) lanes[l].lane = l;
    }
  const auto jitter = [&](int mean) {
    std::uniform_int_distribution<int> d{mean - mean / 4, mean + mean / 4};
    return std::max(1, d(rng));
  };
  const auto upstream_done = [&](std::size_t k) {  // no more input will ever come
    if (k == 0) return produced == units;
    if (!rings[k].empty()) return false;
    for (const auto& x : w[k - 1])
      if (x.state != worker::gone) return false;
    return true;
  };
  std::int64_t t = 0;
  for (; completed < units; ++t) {
    for (std::size_t k = n; k-- > 0;) {
      for (std::size_t i = 0; i < w[k].size(); ++i) {
        worker& x = w[k][i];
        if (x.state == worker::gone) continue;
        if (x.state == worker::holding) {
          if (k + 1 == n) {
            ++completed;
            x.state = worker::idle;
          } else if (rings[k + 1].size() < ring) {
            rings[k + 1].push_back(1);
            x.state = worker::idle;
          }
        }
        if (x.state == worker::idle) {
          bool got = false;
          if (k == 0) {
            if (produced < units) {
              ++produced;
              got = true;
            }
          } else if (!rings[k].empty()) {
            rings[k].pop_front();
            got = true;
          }
          if (got) {
            x.state = worker::busy;
            x.started = static_cast<int>(t);
            if (k == gpu) {
              const sim_stage& g = stages[k];
              const int h = jitter(g.h2d), c = jitter(g.compute), d = jitter(g.d2h);
              x.remaining = h + c + d;
              lanes[i].batches += 1;
              lanes[i].items += 64;
              lanes[i].h2d_s += h * 1e-6;
              lanes[i].compute_s += c * 1e-6;
              lanes[i].d2h_s += d * 1e-6;
              lanes[i].h2d_bytes += static_cast<std::uint64_t>(h) * 12'000;
              lanes[i].d2h_bytes += static_cast<std::uint64_t>(d) * 12'000;
              compute_union.add(t + h, t + h + c);
            } else {
              x.remaining = jitter(stages[k].service);
            }
          } else if (upstream_done(k)) {
            x.state = worker::gone;
            continue;
          }
        }
        switch (x.state) {
          case worker::busy:
            // host side of a lane: waiting on its device work looks like a slot wait
            (k == gpu ? x.blocked_t : x.busy_t) += 1;
            if (--x.remaining == 0) {
              x.state = worker::holding;
              ++done_by_stage[k];
            }
            break;
          case worker::holding:
            x.blocked_t += 1;
            break;
          case worker::idle:
            x.starved_t += 1;
            break;
          case worker::gone:
            break;
        }
      }
    }
  }
  m::report r;
  r.wall_s = static_cast<double>(t) * 1e-6;  // a tick is a microsecond
  r.produced = static_cast<std::uint64_t>(produced);
  r.completed = static_cast<std::uint64_t>(completed);
  r.runtime = "simulated";
  for (std::size_t k = 0; k < n; ++k) {
    m::stage_counters c;
    for (const auto& x : w[k]) {
      c.busy_ns += x.busy_t * 1000;
      c.starved_ns += x.starved_t * 1000;
      c.blocked_ns += x.blocked_t * 1000;
    }
    c.items = static_cast<std::uint64_t>(done_by_stage[k]);
    r.stages.push_back(m::make_stage_report(stages[k].name, stages[k].kind, stages[k].workers, c,
                                            k == 0 ? 0 : ring));
  }
  r.lanes = lanes;
  r.gpu_busy_fraction = static_cast<double>(compute_union.total_ns()) * 1e-6 / r.wall_s;
  m::complete_report(r);
  return r;
}

std::string describe(const m::report& r) {
  std::string s = std::string(m::to_string(r.verdict.kind)) + " '" + r.verdict.stage +
                  "': " + r.verdict.summary;
  for (const auto& st : r.stages)
    s += "\n  " + st.name + " busy " + std::to_string(m::busy_fraction(st, r.wall_s)) +
         " starved " + std::to_string(m::starved_fraction(st, r.wall_s)) + " blocked " +
         std::to_string(m::blocked_fraction(st, r.wall_s));
  s += "\n  lanes " + std::to_string(m::lane_busy_fraction(r)) + " gpu " +
       std::to_string(r.gpu_busy_fraction);
  return s;
}

}  // namespace

// ---- one synthetic report per case --------------------------------------------------

TEST_CASE("verdict: idle when nothing went through") {
  REQUIRE(make_report(1.0, {}, {}, 0.0, 0).verdict.kind == verdict_kind::idle);
  REQUIRE(make_report(0.0, {{"read", stage_kind::source, 1, 0, 0, 0}}).verdict.kind ==
          verdict_kind::idle);
}

TEST_CASE("verdict: CPU stage saturated, GPU starved -> cpu_stage_bound at that stage") {
  const m::report r = gpu_pipeline(0.97, 0.88, {0.05, 0.18, 0.02}, 0.22);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::cpu_stage_bound);
  REQUIRE(r.verdict.stage == "normalize");
  REQUIRE(r.verdict.advice.find(".workers(4)") != std::string::npos);
  REQUIRE(r.verdict.summary.find("97%") != std::string::npos);
}

TEST_CASE("verdict: a CPU stage at capacity with every core busy -> no 'add workers'") {
  // The same pipeline as above, measured on a process that kept its 2 cores busy: more
  // workers on 'normalize' would only share them.
  m::report r = gpu_pipeline(0.97, 0.88, {0.05, 0.18, 0.02}, 0.22);
  r.cpus = 2;
  r.process_cpu_s = 0.95 * 2 * r.wall_s;
  r.verdict = m::diagnose(r);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::cpu_stage_bound);
  REQUIRE(r.verdict.stage == "normalize");
  CHECK(r.verdict.advice.find("add workers") == std::string::npos);
  CHECK(r.verdict.advice.find(".workers(") == std::string::npos);
  CHECK_THAT(r.verdict.advice, Catch::Contains("make 'normalize' cheaper") &&
                                   Catch::Contains("keeps 95% of its 2 cores busy"));
  // 'normalize' already has a worker per core: pinning cannot give it more.
  CHECK(r.verdict.advice.find("placement") == std::string::npos);
  // On 4 cores its stages run more threads (1 + 2 + 1 + 2 lanes + 1) than there are
  // cores, and its 2 workers can have 2 of them to themselves.
  r.cpus = 4;
  r.process_cpu_s = 0.95 * 4 * r.wall_s;
  r.verdict = m::diagnose(r);
  CHECK_THAT(r.verdict.advice, Catch::Contains("With 7 stage threads on 4 cores, "
                                               "pipeline_options::placement = by_load gives "
                                               "it cores of its own."));
  // What the hint says depends on where the threads ran (report::placement).
  const auto advice_with = [&](m::placement_report p) {
    r.placement = std::move(p);
    r.verdict = m::diagnose(r);
    return r.verdict.advice;
  };
  CHECK_THAT(advice_with({"os", 0, 0}),
             Catch::Contains("With 7 stage threads on 4 cores, pipeline_options::placement = "
                             "automatic (the default) gives it cores of its own while the "
                             "pipeline has the cores to itself, by_load whatever else runs."));
  CHECK_THAT(advice_with({"automatic", 10, 2}),
             Catch::Contains("automatic placement had them pinned after only 2 of its 10 "
                             "rounds") &&
                 Catch::Contains("placement = by_load gives it cores of its own whatever else "
                                 "runs."));
  // Pinned for half the run or more, pinned by load, or no round yet: no hint.
  for (const m::placement_report& p :
       {m::placement_report{"automatic", 10, 5}, m::placement_report{"automatic", 0, 0},
        m::placement_report{"by_load", 10, 10}}) {
    CAPTURE(p.mode, p.rounds, p.pinned_rounds);
    CHECK(advice_with(p).find("placement") == std::string::npos);
    CHECK_THAT(r.verdict.advice, Catch::Contains("make 'normalize' cheaper"));
  }
  r.placement = {};
  r.cpus = 2;

  // Just below the threshold the cores have room: add workers.
  r.process_cpu_s = 0.85 * 2 * r.wall_s;
  r.verdict = m::diagnose(r);
  CHECK_THAT(r.verdict.advice, Catch::Contains("add workers to 'normalize' (.workers(4))"));
  // On 16 cores, 95% busy: no spare cores, and no more threads than cores.
  r.cpus = 16;
  r.process_cpu_s = 0.95 * 16 * r.wall_s;
  r.verdict = m::diagnose(r);
  CHECK_THAT(r.verdict.advice, Catch::Contains("make 'normalize' cheaper"));
  CHECK(r.verdict.advice.find("placement") == std::string::npos);
}

TEST_CASE("verdict: GPU segment at capacity, H2D dominating -> transfer_bound_h2d") {
  // The batcher is blocked on the GPU's ring, the lane threads wait for slots.
  const m::report r = gpu_pipeline(0.35, 0.02, {0.55, 0.30, 0.10}, 0.33, 0.60, 0.88);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::transfer_bound_h2d);
  REQUIRE(r.verdict.stage == "gpu");
  REQUIRE(r.verdict.advice.find("uint8") != std::string::npos);
}

TEST_CASE("verdict: GPU segment at capacity, D2H dominating -> transfer_bound_d2h") {
  const m::report r = gpu_pipeline(0.35, 0.02, {0.15, 0.25, 0.55}, 0.27, 0.60, 0.88);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::transfer_bound_d2h);
  REQUIRE(r.verdict.stage == "gpu");
  REQUIRE(r.verdict.advice.find("argmax") != std::string::npos);
}

TEST_CASE("verdict: GPU computing all the time -> compute_bound, said to be healthy") {
  const m::report r = gpu_pipeline(0.40, 0.02, {0.10, 0.78, 0.06}, 0.93, 0.55, 0.90);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::compute_bound);
  REQUIRE(r.verdict.stage == "gpu");
  REQUIRE(r.verdict.advice.find("healthy") != std::string::npos);
  // kernels 93 %: no overlap hint
  REQUIRE(r.verdict.advice.find("more lanes") == std::string::npos);
}

TEST_CASE(
    "verdict: one lane saturated, kernels idle between copies -> compute_bound + lanes hint") {
  const m::report r = make_report(10.0,
                                  {{"read", stage_kind::source, 1, 0.05, 0.0, 0.93},
                                   {"batch", stage_kind::batch, 1, 0.04, 0.06, 0.88},
                                   {"gpu", stage_kind::gpu, 1, 0.03, 0.02, 0.94},
                                   {"write", stage_kind::sink, 1, 0.02, 0.96, 0.0}},
                                  {{0.30, 0.60, 0.07}}, 0.60);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::compute_bound);
  REQUIRE(r.verdict.advice.find("more lanes") != std::string::npos);
}

TEST_CASE("verdict: batches leave on timeout, small, GPU idle -> under_batched") {
  m::report r = make_report(10.0,
                            {{"input", stage_kind::source, 1, 0.10, 0.85, 0.0},
                             {"normalize", stage_kind::map, 2, 0.05, 0.92, 0.0},
                             {"batch", stage_kind::batch, 1, 0.03, 0.95, 0.0},
                             {"gpu", stage_kind::gpu, 2, 0.02, 0.95, 0.01},
                             {"reply", stage_kind::sink, 1, 0.01, 0.97, 0.0}},
                            {{0.01, 0.05, 0.01}, {0.01, 0.05, 0.01}}, 0.09);
  r.batching = m::batch_report{64, 6.3, 1000, 930};
  m::complete_report(r);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::under_batched);
  REQUIRE(r.verdict.stage == "batch");
  REQUIRE(r.verdict.summary.find("93%") != std::string::npos);
  // A batcher with a latency target that it meets makes its small batches on purpose.
  r.latency_target = m::latency_target_report{};
  r.latency_target->windows = r.latency_target->windows_met = 20;
  r.latency_target->met = true;
  m::complete_report(r);
  REQUIRE(r.verdict.kind != verdict_kind::under_batched);
  // One that misses it is judged as any batcher.
  r.latency_target->windows_met = 10;
  r.latency_target->met = false;
  m::complete_report(r);
  REQUIRE(r.verdict.kind == verdict_kind::under_batched);
}

TEST_CASE("verdict: source busy, everything after it starved -> source_bound") {
  const m::report r = make_report(10.0,
                                  {{"read", stage_kind::source, 1, 0.97, 0.0, 0.01},
                                   {"normalize", stage_kind::map, 4, 0.20, 0.78, 0.0},
                                   {"batch", stage_kind::batch, 1, 0.03, 0.95, 0.0},
                                   {"gpu", stage_kind::gpu, 2, 0.02, 0.90, 0.05},
                                   {"write", stage_kind::sink, 1, 0.02, 0.96, 0.0}},
                                  {{0.02, 0.10, 0.01}, {0.02, 0.10, 0.01}}, 0.12);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::source_bound);
  REQUIRE(r.verdict.stage == "read");
}

TEST_CASE("verdict: everyone waits for input, source not busy -> source_bound (input-limited)") {
  const m::report r = make_report(10.0, {{"input", stage_kind::source, 1, 0.08, 0.90, 0.0},
                                         {"normalize", stage_kind::map, 2, 0.10, 0.88, 0.0},
                                         {"write", stage_kind::sink, 1, 0.05, 0.93, 0.0}});
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::source_bound);
  REQUIRE(r.verdict.stage == "input");
  REQUIRE(r.verdict.summary.find("waits for input") != std::string::npos);
}

TEST_CASE("verdict: sink saturated, everyone upstream blocked -> sink_bound") {
  const m::report r = make_report(10.0,
                                  {{"read", stage_kind::source, 1, 0.05, 0.0, 0.94},
                                   {"normalize", stage_kind::map, 2, 0.30, 0.01, 0.68},
                                   {"batch", stage_kind::batch, 1, 0.04, 0.02, 0.93},
                                   {"gpu", stage_kind::gpu, 2, 0.03, 0.01, 0.95},
                                   {"write", stage_kind::sink, 1, 0.96, 0.03, 0.0}},
                                  {{0.05, 0.25, 0.03}, {0.05, 0.25, 0.03}}, 0.30);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::sink_bound);
  REQUIRE(r.verdict.stage == "write");
}

namespace {
// A one-worker postprocess map after the GPU at capacity; everything before it blocked.
m::report argmax_bound() {
  return make_report(10.0,
                     {{"read", stage_kind::source, 1, 0.05, 0.0, 0.94},
                      {"batch", stage_kind::batch, 1, 0.04, 0.02, 0.93},
                      {"gpu", stage_kind::gpu, 2, 0.03, 0.01, 0.95},
                      {"argmax", stage_kind::map, 1, 0.97, 0.02, 0.0},
                      {"write", stage_kind::sink, 1, 0.02, 0.97, 0.0}},
                     {{0.05, 0.25, 0.10}, {0.05, 0.25, 0.10}}, 0.30);
}
}  // namespace

TEST_CASE("verdict: postprocess map after the GPU saturated -> sink_bound at it") {
  const m::report r = argmax_bound();
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::sink_bound);
  REQUIRE(r.verdict.stage == "argmax");
  REQUIRE(r.verdict.advice.find(".workers(2)") != std::string::npos);
}

TEST_CASE("verdict: a postprocess map at capacity on busy cores -> make it cheaper") {
  m::report r = argmax_bound();
  r.cpus = 1;
  r.process_cpu_s = 0.99 * r.wall_s;
  r.verdict = m::diagnose(r);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::sink_bound);
  REQUIRE(r.verdict.stage == "argmax");
  CHECK(r.verdict.advice.find(".workers(") == std::string::npos);
  CHECK_THAT(r.verdict.advice,
             Catch::Contains("make 'argmax' cheaper") && Catch::Contains("of its 1 core busy"));
}

TEST_CASE("verdict: nothing at capacity, waits spread -> balanced") {
  const m::report r = make_report(10.0,
                                  {{"read", stage_kind::source, 1, 0.60, 0.0, 0.35},
                                   {"normalize", stage_kind::map, 2, 0.70, 0.15, 0.12},
                                   {"batch", stage_kind::batch, 1, 0.20, 0.45, 0.30},
                                   {"gpu", stage_kind::gpu, 2, 0.10, 0.40, 0.45},
                                   {"write", stage_kind::sink, 1, 0.65, 0.30, 0.0}},
                                  {{0.10, 0.50, 0.05}, {0.10, 0.50, 0.05}}, 0.62);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::balanced);
  REQUIRE(r.verdict.stage.empty());
}

TEST_CASE("verdict: several stages at capacity, nobody waits -> balanced") {
  m::report r = make_report(10.0, {{"read", stage_kind::source, 1, 0.95, 0.0, 0.03},
                                   {"parse", stage_kind::map, 1, 0.96, 0.02, 0.01},
                                   {"score", stage_kind::map, 1, 0.95, 0.03, 0.01},
                                   {"write", stage_kind::sink, 1, 0.95, 0.04, 0.0}});
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::balanced);
  CHECK_THAT(r.verdict.advice, Catch::Contains("workers on each"));
  // Four busy stages on 4 cores, all taken: scaling out is not the answer either.
  r.cpus = 4;
  r.process_cpu_s = 3.8 * r.wall_s;
  r.verdict = m::diagnose(r);
  REQUIRE(r.verdict.kind == verdict_kind::balanced);
  CHECK(r.verdict.advice.find("workers on each") == std::string::npos);
  CHECK_THAT(r.verdict.advice, Catch::Contains("no spare cores"));
}

// ---- near-misses: each threshold from both sides -------------------------------------

TEST_CASE("verdict near-miss: a CPU stage at 80 % is not a bottleneck, at 90 % it is") {
  const m::report below = gpu_pipeline(0.80, 0.40, {0.05, 0.30, 0.02}, 0.35, 0.10, 0.40);
  INFO(describe(below));
  REQUIRE(below.verdict.kind == verdict_kind::balanced);
  const m::report above = gpu_pipeline(0.90, 0.60, {0.05, 0.30, 0.02}, 0.35, 0.02, 0.20);
  INFO(describe(above));
  REQUIRE(above.verdict.kind == verdict_kind::cpu_stage_bound);
  REQUIRE(above.verdict.stage == "normalize");
}

TEST_CASE("verdict near-miss: saturated CPU stage with a busy GPU is compute_bound from 85 %") {
  // Decided (verdict.hpp, step 2): once the device is at capacity the GPU is named even
  // if a CPU stage is saturated too; the CPU stage is mentioned in the summary.
  const m::report busy = gpu_pipeline(0.97, 0.08, {0.05, 0.85, 0.02}, 0.90);
  INFO(describe(busy));
  REQUIRE(busy.verdict.kind == verdict_kind::compute_bound);
  REQUIRE(busy.verdict.summary.find("'normalize' 97%") != std::string::npos);
  const m::report not_quite = gpu_pipeline(0.97, 0.15, {0.03, 0.75, 0.02}, 0.80);
  INFO(describe(not_quite));
  REQUIRE(not_quite.verdict.kind == verdict_kind::cpu_stage_bound);
  REQUIRE(not_quite.verdict.stage == "normalize");
}

TEST_CASE("verdict near-miss: the larger of H2D and compute decides") {
  REQUIRE(gpu_pipeline(0.35, 0.02, {0.44, 0.46, 0.05}, 0.45, 0.6, 0.88).verdict.kind ==
          verdict_kind::compute_bound);
  REQUIRE(gpu_pipeline(0.35, 0.02, {0.47, 0.43, 0.05}, 0.42, 0.6, 0.88).verdict.kind ==
          verdict_kind::transfer_bound_h2d);
  REQUIRE(gpu_pipeline(0.35, 0.02, {0.10, 0.40, 0.45}, 0.38, 0.6, 0.88).verdict.kind ==
          verdict_kind::transfer_bound_d2h);
}

TEST_CASE("verdict near-miss: under_batched needs timeouts, small batches and an idle GPU") {
  const auto with = [](m::batch_report b, double lane_compute, double gpu_busy) {
    m::report r = make_report(10.0,
                              {{"input", stage_kind::source, 1, 0.10, 0.85, 0.0},
                               {"batch", stage_kind::batch, 1, 0.03, 0.95, 0.0},
                               {"gpu", stage_kind::gpu, 2, 0.02, 0.95, 0.01},
                               {"reply", stage_kind::sink, 1, 0.01, 0.97, 0.0}},
                              {{0.01, lane_compute, 0.01}, {0.01, lane_compute, 0.01}}, gpu_busy);
    r.batching = b;
    m::complete_report(r);
    return r.verdict.kind;
  };
  REQUIRE(with({64, 6.3, 1000, 930}, 0.05, 0.09) == verdict_kind::under_batched);
  // 45 % on timeout: not under-batched; all stages starved -> input-limited
  REQUIRE(with({64, 6.3, 1000, 450}, 0.05, 0.09) == verdict_kind::source_bound);
  // batches 55 % full
  REQUIRE(with({64, 35.2, 1000, 930}, 0.05, 0.09) == verdict_kind::source_bound);
  // the GPU busy 60 % with those batches: not "idle"
  REQUIRE(with({64, 6.3, 1000, 930}, 0.58, 0.60) == verdict_kind::source_bound);
}

TEST_CASE("verdict near-miss: input-limited needs every later stage starved >= 50 %") {
  const auto with = [](double normalize_starved) {
    return make_report(10.0, {{"input", stage_kind::source, 1, 0.30, 0.65, 0.0},
                              {"normalize", stage_kind::map, 2, 0.95 - normalize_starved,
                               normalize_starved, 0.02},
                              {"write", stage_kind::sink, 1, 0.30, 0.68, 0.0}})
        .verdict.kind;
  };
  REQUIRE(with(0.55) == verdict_kind::source_bound);
  REQUIRE(with(0.45) == verdict_kind::balanced);
}

TEST_CASE("verdict: of two saturated stages, the one the other waits on is named") {
  // 'decode' at 96 % waits 3 % for room in 'resize''s ring; 'resize' at 90 % is never
  // starved: resize is the one being waited on, even with the lower load.
  const m::report r = make_report(10.0, {{"read", stage_kind::source, 1, 0.10, 0.0, 0.88},
                                         {"decode", stage_kind::map, 2, 0.96, 0.0, 0.03},
                                         {"resize", stage_kind::map, 2, 0.90, 0.0, 0.0},
                                         {"write", stage_kind::sink, 1, 0.10, 0.88, 0.0}});
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::cpu_stage_bound);
  REQUIRE(r.verdict.stage == "resize");
}

// ---- planted bottlenecks in the simulated pipeline ------------------------------------

TEST_CASE("verdict on simulated pipelines: the planted bottleneck is found") {
  const int units = 3000;
  SECTION("slow normalize with 2 workers; GPU fast") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 10},
                                  {"normalize", stage_kind::map, 2, 60},
                                  {"gpu", stage_kind::gpu, 2, 0, 3, 10, 2},
                                  {"write", stage_kind::sink, 1, 5}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::cpu_stage_bound);
    REQUIRE(r.verdict.stage == "normalize");
  }
  SECTION("H2D-heavy lanes") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 5},
                                  {"normalize", stage_kind::map, 2, 20},
                                  {"gpu", stage_kind::gpu, 2, 0, 40, 20, 5},
                                  {"write", stage_kind::sink, 1, 5}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::transfer_bound_h2d);
    REQUIRE(r.verdict.stage == "gpu");
  }
  SECTION("D2H-heavy lanes") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 5},
                                  {"gpu", stage_kind::gpu, 2, 0, 5, 20, 40},
                                  {"write", stage_kind::sink, 1, 5}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::transfer_bound_d2h);
  }
  SECTION("compute-heavy lanes") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 5},
                                  {"normalize", stage_kind::map, 4, 40},
                                  {"gpu", stage_kind::gpu, 1, 0, 3, 30, 2},
                                  {"write", stage_kind::sink, 1, 5}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::compute_bound);
  }
  SECTION("slow source") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 40},
                                  {"normalize", stage_kind::map, 2, 30},
                                  {"gpu", stage_kind::gpu, 1, 0, 3, 10, 2},
                                  {"write", stage_kind::sink, 1, 5}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::source_bound);
    REQUIRE(r.verdict.stage == "read");
  }
  SECTION("slow postprocess after the GPU") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 5},
                                  {"gpu", stage_kind::gpu, 2, 0, 3, 10, 2},
                                  {"top-k", stage_kind::map, 1, 30},
                                  {"write", stage_kind::sink, 1, 5}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::sink_bound);
    REQUIRE(r.verdict.stage == "top-k");
  }
  SECTION("slow sink") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 5},
                                  {"normalize", stage_kind::map, 2, 10},
                                  {"write", stage_kind::sink, 1, 25}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::sink_bound);
    REQUIRE(r.verdict.stage == "write");
  }
  SECTION("CPU-only, the middle stage slowest") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 10},
                                  {"parse", stage_kind::map, 1, 15},
                                  {"score", stage_kind::map, 3, 60},
                                  {"format", stage_kind::map, 1, 12},
                                  {"write", stage_kind::sink, 1, 5}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::cpu_stage_bound);
    REQUIRE(r.verdict.stage == "score");
  }
  SECTION("all stages equally fast") {
    const m::report r = simulate({{"read", stage_kind::source, 1, 20},
                                  {"parse", stage_kind::map, 1, 20},
                                  {"score", stage_kind::map, 2, 40},
                                  {"write", stage_kind::sink, 1, 20}},
                                 units);
    INFO(describe(r));
    REQUIRE(r.verdict.kind == verdict_kind::balanced);
  }
}

// ---- the GPU segment's host side -------------------------------------------------------

namespace {

// source -> batch -> gpu (2 lanes) -> sink, the lanes waiting for slots (the batch stage
// blocked, the sink starved), with the lanes' stage-in and stage-out time per lane given.
m::report segment_waited_on(lane_spec device, double stage_in, double stage_out,
                            double lane_threads_busy = 0.02) {
  m::report r =
      make_report(10.0,
                  {{"read", stage_kind::source, 1, 0.02, 0.0, 0.95},
                   {"batch", stage_kind::batch, 1, 0.03, 0.02, 0.93},
                   {"gpu", stage_kind::gpu, 2, lane_threads_busy, 0.01, 0.97 - lane_threads_busy},
                   {"write", stage_kind::sink, 1, 0.01, 0.97, 0.0}},
                  {device, device}, device.compute);
  for (auto& l : r.lanes) {
    l.stage_in_s = stage_in * r.wall_s;
    l.stage_out_s = stage_out * r.wall_s;
  }
  m::complete_report(r);
  return r;
}

}  // namespace

TEST_CASE("verdict: stage-out on the completion threads sets the pace -> the segment's host side") {
  // The case: stage-out 4 ms a batch, the kernel 0.2 ms; the lanes wait for
  // slots, which the slot-wait rule would have credited to the device.
  const m::report r = segment_waited_on({0.005, 0.09, 0.005}, 0.0005, 0.95);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::cpu_stage_bound);
  REQUIRE(r.verdict.stage == "gpu");
  CHECK_THAT(r.verdict.summary, Catch::Contains("stage-out keeps the lanes' completion threads "
                                                "busy 95%"));
  CHECK_THAT(r.verdict.advice, Catch::StartsWith("more lanes (.lanes = 4)") &&
                                   Catch::Contains("map after the segment"));
  CHECK(r.verdict.advice.find("healthy") == std::string::npos);
}

TEST_CASE("verdict: stage-in on the lane threads sets the pace -> the segment's host side") {
  const m::report r = segment_waited_on({0.005, 0.09, 0.005}, 0.90, 0.0, 0.93);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::cpu_stage_bound);
  REQUIRE(r.verdict.stage == "gpu");
  CHECK_THAT(r.verdict.summary, Catch::Contains("stage-in keeps the lane threads busy 90%"));
  CHECK_THAT(r.verdict.advice, Catch::Contains("map before the batch stage"));
  // With the cores taken, more lanes would only share them.
  m::report busy = r;
  busy.cpus = 2;
  busy.process_cpu_s = 0.95 * 2 * busy.wall_s;
  busy.verdict = m::diagnose(busy);
  CHECK_THAT(busy.verdict.advice, Catch::StartsWith("make stage-in cheaper"));
  CHECK(busy.verdict.advice.find("more lanes (") == std::string::npos);
}

TEST_CASE("verdict: compute calls as long as the device's work -> the lanes cannot queue ahead") {
  // Lanes that compute 60% of the wall each, 100 batches a lane; the segment sets the pace.
  m::report r = segment_waited_on({0.05, 0.60, 0.05}, 0.0, 0.0, 0.90);
  REQUIRE(r.verdict.stage == "gpu");
  for (auto& l : r.lanes) {
    l.batches = 100;
    l.enqueue_s = 0.9 * l.compute_s;
    l.drained_batches = 90;  // a call that synchronizes at its end
  }
  r.verdict = m::diagnose(r);
  INFO(describe(r));
  CHECK_THAT(r.verdict.advice, Catch::StartsWith("The compute functor waits for the device") &&
                                   Catch::Contains("par_nosync"));
  CHECK(r.verdict.advice.find("healthy") == std::string::npos);
  CHECK_THAT(r.verdict.summary, Catch::Contains("the lanes' compute calls took 10800.0 ms against "
                                                "12000.0 ms of device compute, 90% of them "
                                                "returning to an idle stream"));
  // A wait inside the calls, or launch-bound work: as long, but kernels still queued.
  for (auto& l : r.lanes) l.drained_batches = 5;
  r.verdict = m::diagnose(r);
  CHECK_THAT(r.verdict.advice, Catch::StartsWith("The lanes cannot queue work ahead") &&
                                   Catch::Contains("CUDA graph"));
  // Enqueue-only calls: no hint.
  for (auto& l : r.lanes) l.enqueue_s = 0.05 * l.compute_s;
  r.verdict = m::diagnose(r);
  CHECK(r.verdict.advice.find("waits for the device") == std::string::npos);
  // Too little device time to matter (below sync_min_share of wall x lanes): no hint.
  for (auto& l : r.lanes) {
    l.drained_batches = 100;
    l.compute_s = 0.01 * r.wall_s;
    l.enqueue_s = l.compute_s;
  }
  r.verdict = m::diagnose(r);
  CHECK(r.verdict.advice.find("waits for the device") == std::string::npos);
}

TEST_CASE("verdict: lanes that cannot queue ahead go unmentioned where a CPU stage sets the pace") {
  // The image pipeline on a GPU: 'prepare' at capacity, a small launch-bound model whose
  // calls last as long as its kernels. The lanes' pace is not the run's.
  m::report r = gpu_pipeline(0.95, 0.85, {0.01, 0.10, 0.01}, 0.10);
  REQUIRE(r.verdict.stage == "normalize");
  for (auto& l : r.lanes) {
    l.batches = 100;
    l.enqueue_s = l.compute_s;
  }
  r.verdict = m::diagnose(r);
  INFO(describe(r));
  CHECK(r.verdict.advice.find("cannot queue") == std::string::npos);
  CHECK(r.verdict.advice.find("waits for the device") == std::string::npos);
}

TEST_CASE("verdict margin: the device keeps the pace unless a host part is busier by 10 points") {
  // Device 80 % of lane time, stage-out 85 %: within the margin, the device's.
  const m::report close = segment_waited_on({0.05, 0.70, 0.05}, 0.0, 0.85);
  INFO(describe(close));
  CHECK(close.verdict.kind == verdict_kind::compute_bound);
  CHECK_THAT(close.verdict.summary, Catch::Contains("stage-out keeps the completion threads busy"));
  // stage-out 95 %: busier by 15 points, the host side's.
  const m::report clear = segment_waited_on({0.05, 0.70, 0.05}, 0.0, 0.95);
  INFO(describe(clear));
  CHECK(clear.verdict.kind == verdict_kind::cpu_stage_bound);
  CHECK(clear.verdict.stage == "gpu");
}

TEST_CASE("verdict: lanes waiting on slots with no part of the segment busy -> no bottleneck") {
  // Every part under part_busy (50 %): the slot wait is the hand-offs' turnaround, not
  // any part's load, and copies of 128 bytes do not make a transfer bottleneck.
  m::report r = segment_waited_on({0.02, 0.01, 0.02}, 0.01, 0.01);
  for (auto& l : r.lanes) l.h2d_bytes = l.d2h_bytes = 128 * l.batches;
  r.verdict = m::diagnose(r);
  INFO(describe(r));
  CHECK(r.verdict.kind == verdict_kind::balanced);
  CHECK(r.verdict.stage.empty());
  CHECK_THAT(r.verdict.summary, Catch::StartsWith("no stage is near capacity"));
  CHECK(r.verdict.advice.find("uint8") == std::string::npos);
  // Part of the segment at 55 %: the slot wait is credited to it.
  const m::report busy = segment_waited_on({0.05, 0.50, 0.00}, 0.0, 0.0);
  INFO(describe(busy));
  CHECK(busy.verdict.kind == verdict_kind::compute_bound);
  CHECK_THAT(busy.verdict.advice, Catch::Contains("slots_per_lane"));
}

TEST_CASE("verdict magnitudes: transfer advice fits the bytes per batch") {
  m::report r = gpu_pipeline(0.35, 0.02, {0.55, 0.30, 0.10}, 0.33, 0.60, 0.88);
  REQUIRE(r.verdict.kind == verdict_kind::transfer_bound_h2d);
  CHECK_THAT(r.verdict.advice, Catch::Contains("uint8"));
  // The same times for copies of 4 KiB a batch: each copy's fixed cost, not its bytes.
  for (auto& l : r.lanes) l.h2d_bytes = 4096 * l.batches;
  r.verdict = m::diagnose(r);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::transfer_bound_h2d);
  CHECK(r.verdict.advice.find("uint8") == std::string::npos);
  CHECK_THAT(r.verdict.advice, Catch::Contains("copies of 4.0 KiB per batch are too small") &&
                                   Catch::Contains("larger batches"));
  CHECK_THAT(r.verdict.summary, Catch::Contains("4.0 KiB per batch"));
}

TEST_CASE("verdict advice order: the overlap hint before the model when kernels idle") {
  const m::report r = make_report(10.0,
                                  {{"read", stage_kind::source, 1, 0.05, 0.0, 0.93},
                                   {"batch", stage_kind::batch, 1, 0.04, 0.06, 0.88},
                                   {"gpu", stage_kind::gpu, 1, 0.03, 0.02, 0.94},
                                   {"write", stage_kind::sink, 1, 0.02, 0.96, 0.0}},
                                  {{0.45, 0.50, 0.02}}, 0.50);
  INFO(describe(r));
  REQUIRE(r.verdict.kind == verdict_kind::compute_bound);
  CHECK_THAT(r.verdict.advice,
             Catch::StartsWith("Kernels run only 50%") && Catch::Contains("(.lanes = 2)"));
  CHECK(r.verdict.advice.find("more lanes") < r.verdict.advice.find("model cheaper"));
  CHECK(r.verdict.advice.find("healthy") == std::string::npos);
}

// ---- the machine -------------------------------------------------------------------

TEST_CASE("verdict: other processes holding the cores -> no 'add workers'") {
  m::report r = gpu_pipeline(0.97, 0.88, {0.05, 0.18, 0.02}, 0.22);
  r.cpus = 2;
  r.process_cpu_s = 0.40 * 2 * r.wall_s;  // this process: 40 %
  r.machine_cpu_s = 2 * r.wall_s;
  r.machine_busy_cpu_s = 0.98 * r.machine_cpu_s;  // the machine: 98 %
  r.verdict = m::diagnose(r);
  INFO(describe(r));
  REQUIRE(m::other_cpu_load(r) == Approx(0.58));
  REQUIRE(r.verdict.kind == verdict_kind::cpu_stage_bound);
  REQUIRE(r.verdict.stage == "normalize");
  CHECK_THAT(r.verdict.advice, Catch::Contains("make 'normalize' cheaper") &&
                                   Catch::Contains("other processes keep 58% of the 2 cores busy "
                                                   "(this process 40%)"));
  CHECK(r.verdict.advice.find(".workers(") == std::string::npos);
  // The machine busy, but mostly with this process: the process's own rule decides.
  r.machine_busy_cpu_s = 0.50 * r.machine_cpu_s;
  r.verdict = m::diagnose(r);
  CHECK_THAT(r.verdict.advice, Catch::Contains("add workers to 'normalize' (.workers(4))"));
  // Busy cores, but 'normalize' runs on a CPU only 5 % of its busy time (it waits in its
  // function): more workers help it whatever holds the cores.
  r.machine_busy_cpu_s = 0.98 * r.machine_cpu_s;
  r.stages[1].cpu_s = 0.05 * r.stages[1].busy_s;
  r.verdict = m::diagnose(r);
  CHECK_THAT(r.verdict.advice, Catch::Contains("add workers to 'normalize' (.workers(4))"));
  r.stages[1].cpu_s = 0.5 * r.stages[1].busy_s;  // half of it: CPU work
  r.verdict = m::diagnose(r);
  CHECK_THAT(r.verdict.advice, Catch::Contains("make 'normalize' cheaper"));
  r.stages[1].cpu_s = 0;
  // Not measured: as before.
  r.machine_cpu_s = r.machine_busy_cpu_s = 0;
  REQUIRE(m::other_cpu_load(r) < 0);
  r.verdict = m::diagnose(r);
  CHECK_THAT(r.verdict.advice, Catch::Contains("add workers to 'normalize'"));
}

// ---- margins and "no bottleneck" ----------------------------------------------------------

TEST_CASE("verdict margin: a stage is named only when clearly nearer capacity than the next") {
  const auto with = [](double other_busy) {
    return make_report(10.0, {{"read", stage_kind::source, 1, 0.05, 0.0, 0.93},
                              {"parse", stage_kind::map, 1, 0.95, 0.03, 0.0},
                              {"score", stage_kind::map, 1, other_busy, 0.0, 0.0},
                              {"write", stage_kind::sink, 1, 0.02, 0.96, 0.0}});
  };
  // 'score' at 88 % (7 points from 'parse', not waited on differently): none is named.
  const m::report close = with(0.88);
  INFO(describe(close));
  CHECK(close.verdict.kind == verdict_kind::balanced);
  CHECK(close.verdict.stage.empty());
  CHECK_THAT(close.verdict.summary, Catch::Contains("within 10%"));
  // At 80 %: 'parse' is clearly the nearest.
  const m::report clear = with(0.80);
  INFO(describe(clear));
  CHECK(clear.verdict.kind == verdict_kind::cpu_stage_bound);
  CHECK(clear.verdict.stage == "parse");
}

TEST_CASE("verdict: nothing at capacity in a run too short to tell -> says so") {
  m::report r = make_report(0.03,
                            {{"read", stage_kind::source, 1, 0.08, 0.0, 0.80},
                             {"batch", stage_kind::batch, 1, 0.18, 0.24, 0.47},
                             {"gpu", stage_kind::gpu, 2, 0.02, 0.04, 0.92},
                             {"write", stage_kind::sink, 1, 0.02, 0.97, 0.0}},
                            {{0.01, 0.01, 0.01}, {0.01, 0.01, 0.01}}, 0.01);
  INFO(describe(r));
  CHECK(r.verdict.kind == verdict_kind::balanced);
  CHECK_THAT(r.verdict.summary, Catch::Contains("the run is too short to tell: 30 ms"));
  // The same shares over 10 s, the process's threads filling both cores.
  m::report longer = r;
  longer.wall_s = 10.0;
  for (auto& s : longer.stages) {
    s.busy_s *= 10.0 / 0.03;
    s.starved_s *= 10.0 / 0.03;
    s.blocked_s *= 10.0 / 0.03;
  }
  for (auto& l : longer.lanes) l.h2d_s = l.compute_s = l.d2h_s = 0.1;
  longer.cpus = 2;
  longer.process_cpu_s = 0.99 * 2 * longer.wall_s;
  longer.verdict = m::diagnose(longer);
  INFO(describe(longer));
  CHECK(longer.verdict.kind == verdict_kind::balanced);
  CHECK_THAT(longer.verdict.summary, Catch::Contains("the run is limited by the cores"));
}

// ---- the timeline ---------------------------------------------------------------------

namespace {

m::verdict_period period(double start, double end, verdict_kind kind, std::string stage) {
  m::verdict_period p;
  p.start_s = start;
  p.end_s = end;
  p.verdict = {kind, std::move(stage), "summary", "fix it"};
  return p;
}

}  // namespace

TEST_CASE("timeline phases: short runs join their neighbours, long ones stay") {
  using K = verdict_kind;
  std::vector<m::verdict_period> t;
  // 0-1.2 s decode (one balanced period in the middle), 1.2-1.3 s balanced, 1.3-3 s sink.
  for (int i = 0; i < 30; ++i) {
    const double a = i * 0.1, b = a + 0.1;
    if (i == 5 || i == 12)
      t.push_back(period(a, b, K::balanced, ""));
    else if (i < 12)
      t.push_back(period(a, b, K::cpu_stage_bound, "decode"));
    else
      t.push_back(period(a, b, K::sink_bound, "post"));
  }
  const auto phases = m::bottleneck_phases(t);
  REQUIRE(phases.size() == 2);
  CHECK(phases[0].stage == "decode");
  CHECK(phases[0].start_s == Approx(0.0));
  CHECK(phases[1].stage == "post");
  CHECK(phases[1].end_s == Approx(3.0));
  CHECK(phases[0].end_s == Approx(phases[1].start_s));
  // A phase of under 20 % of the run is absorbed.
  std::vector<m::verdict_period> blip;
  for (int i = 0; i < 20; ++i)
    blip.push_back(period(i * 0.1, i * 0.1 + 0.1,
                          i >= 8 && i < 11 ? K::sink_bound : K::cpu_stage_bound,
                          i >= 8 && i < 11 ? "post" : "decode"));
  const auto one = m::bottleneck_phases(blip);
  REQUIRE(one.size() == 1);
  CHECK(one[0].stage == "decode");
  CHECK(m::bottleneck_phases({}).empty());
}

TEST_CASE("verdict: a timeline with two phases -> the bottleneck moved, both named") {
  m::report r = make_report(3.0, {{"read", stage_kind::source, 1, 0.05, 0.0, 0.5},
                                  {"decode", stage_kind::map, 1, 0.4, 0.1, 0.3},
                                  {"post", stage_kind::map, 1, 0.6, 0.4, 0.0},
                                  {"write", stage_kind::sink, 1, 0.02, 0.96, 0.0}});
  REQUIRE(r.verdict.kind == verdict_kind::balanced);
  for (int i = 0; i < 30; ++i)
    r.timeline.push_back(
        i < 12 ? period(i * 0.1, i * 0.1 + 0.1, verdict_kind::cpu_stage_bound, "decode")
               : period(i * 0.1, i * 0.1 + 0.1, verdict_kind::sink_bound, "post"));
  r.timeline[3].verdict.advice = "add workers to 'decode'";
  r.timeline[20].verdict.advice = "add workers to 'post'";
  r.verdict = m::diagnose(r);
  INFO(describe(r));
  CHECK(r.verdict.kind == verdict_kind::sink_bound);  // the longer phase
  CHECK(r.verdict.stage == "post");
  CHECK_THAT(r.verdict.summary, Catch::StartsWith("the bottleneck moved at 1.20 s: 'decode' "
                                                  "(cpu_stage_bound) from 0.00 s to 1.20 s, then "
                                                  "'post' (sink_bound) from 1.20 s to 3.00 s"));
  CHECK(r.verdict.advice.find("'post'") < r.verdict.advice.find("'decode'"));
  // One phase only: the whole run's verdict.
  for (auto& p : r.timeline) p.verdict = {verdict_kind::sink_bound, "post", "s", "a"};
  r.verdict = m::diagnose(r);
  CHECK(r.verdict.kind == verdict_kind::balanced);
}

TEST_CASE("verdict_timeline: bounded, merging neighbours, covering the whole run") {
  m::verdict_timeline tl;
  m::report base = make_report(
      0.0, {{"read", stage_kind::source, 1, 0, 0, 0}, {"write", stage_kind::sink, 1, 0, 0, 0}});
  for (int i = 0; i <= 300; ++i) {
    m::report r = base;
    r.wall_s = 0.1 * i;
    r.produced = r.completed = 100 * static_cast<std::uint64_t>(i);
    r.stages[0].busy_s = 0.09 * r.wall_s;
    r.stages[0].blocked_s = 0.9 * r.wall_s;
    r.stages[1].busy_s = 0.95 * r.wall_s;
    r.stages[1].starved_s = 0.01 * r.wall_s;
    tl.add(r, i == 300);
  }
  const auto& p = tl.periods();
  REQUIRE(!p.empty());
  CHECK(p.size() <= m::verdict_timeline::max_periods);
  CHECK(p.size() > m::verdict_timeline::max_periods / 2);
  CHECK(p.front().start_s == Approx(0.0));
  CHECK(p.back().end_s == Approx(30.0));
  for (std::size_t i = 1; i < p.size(); ++i) CHECK(p[i].start_s == Approx(p[i - 1].end_s));
  for (const auto& q : p) {
    CHECK(q.verdict.kind == verdict_kind::sink_bound);
    CHECK(q.verdict.stage == "write");
  }
}
