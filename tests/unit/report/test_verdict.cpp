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
