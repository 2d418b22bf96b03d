// report: builders from live counters, operator<< (a table that carries the verdict),
// to_json (parses with nlohmann and round-trips every number), window() of two
// cumulative reports.
#include "conveyor/report/progress.hpp"
#include "conveyor/report/report.hpp"
#include "conveyor/report/verdict.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>

namespace m = conveyor::metrics;
using nlohmann::json;

namespace {

// A report built the way a pipeline builds it: from counters.
m::report report_from_counters() {
  m::stage_stats read{1}, normalize{2}, batch{1}, gpu_host{2}, write{1};
  const auto fill = [](m::stage_stats& s, std::uint64_t items, std::int64_t busy,
                       std::int64_t starved, std::int64_t blocked) {
    for (std::size_t w = 0; w < s.workers(); ++w) {
      auto& slot = s.worker(w);
      slot.add_items(items / s.workers());
      slot.add_busy(busy);
      slot.add_starved(starved);
      slot.add_blocked(blocked);
      slot.sample_occupancy(60);
      slot.sample_occupancy(64);
    }
  };
  // 2 s wall: normalize busy 1.94 s of 2 s per worker, the rest waits on it.
  fill(read, 6400, 100'000'000, 0, 1'880'000'000);
  fill(normalize, 6400, 1'940'000'000, 20'000'000, 20'000'000);
  fill(batch, 6400, 80'000'000, 1'860'000'000, 40'000'000);
  fill(gpu_host, 6400, 100'000'000, 1'800'000'000, 80'000'000);
  fill(write, 6400, 40'000'000, 1'940'000'000, 0);

  m::gpu_stats gpu{2};
  for (int b = 0; b < 100; ++b) {
    m::batch_timing t;
    t.items = 64;
    const std::int64_t s = b * 20'000'000;
    t.h2d = {s, s + 1'000'000};
    t.compute = {s + 1'000'000, s + 5'000'000};
    t.d2h = {s + 5'000'000, s + 5'500'000};
    t.h2d_bytes = 64 * 3 * 224 * 224;
    t.d2h_bytes = 64 * 1000 * 4;
    gpu.record_batch(static_cast<std::size_t>(b % 2), t);
  }
  m::batch_stats batches{64};
  for (int b = 0; b < 100; ++b) batches.record(64, false);
  m::latency_histogram item, per_batch;
  for (int i = 1; i <= 6400; ++i) item.record(i * 1000);
  for (int i = 1; i <= 100; ++i) per_batch.record(i * 50'000);

  m::report r;
  r.wall_s = 2.0;
  r.produced = 6400;
  r.completed = 6390;
  r.failed = 6;
  r.cancelled = 4;
  r.runtime = "host";
  r.cpus = 2;
  r.process_cpu_s = 1.5;  // 0.75 cores busy of 2 over the 2 s
  r.placement = {"automatic", 9, 7};
  r.stages.push_back(m::make_stage_report("read", m::stage_kind::source, read, 0));
  r.stages.push_back(m::make_stage_report("normalize", m::stage_kind::map, normalize, 64));
  r.stages.push_back(m::make_stage_report("batch", m::stage_kind::batch, batch, 64));
  r.stages.push_back(m::make_stage_report("gpu", m::stage_kind::gpu, gpu_host, 4));
  r.stages.push_back(m::make_stage_report("write \"out\"", m::stage_kind::sink, write, 64));
  r.lanes = m::make_lane_reports(gpu);
  r.gpu_busy_fraction = static_cast<double>(gpu.compute_busy_ns()) * 1e-9 / r.wall_s;
  r.batching = m::make_batch_report(batches.snapshot());
  r.item_latency = m::make_latency_report(item);
  r.batch_latency = m::make_latency_report(per_batch);
  m::complete_report(r);
  return r;
}

}  // namespace

TEST_CASE("report: builders carry the counters over exactly") {
  const m::report r = report_from_counters();
  REQUIRE(r.stages.size() == 5);
  const m::stage_report& n = r.stages[1];
  REQUIRE(n.workers == 2);
  REQUIRE(n.items == 6400);
  REQUIRE(n.busy_s == Approx(2 * 1.94));
  REQUIRE(n.starved_s == Approx(2 * 0.02));
  REQUIRE(n.occupancy_mean == Approx(62.0));
  REQUIRE(n.occupancy_max == 64);
  REQUIRE(n.ring_capacity == 64);
  REQUIRE(m::busy_fraction(n, r.wall_s) == Approx(0.97));

  REQUIRE(r.lanes.size() == 2);
  REQUIRE(r.lanes[0].batches == 50);
  REQUIRE(r.lanes[0].items == 50 * 64);
  REQUIRE(r.lanes[0].h2d_s == Approx(0.050));
  REQUIRE(r.lanes[0].compute_s == Approx(0.200));
  REQUIRE(r.lanes[0].d2h_s == Approx(0.025));
  REQUIRE(r.lanes[0].h2d_bandwidth() == Approx(64.0 * 3 * 224 * 224 / 1e-3));
  REQUIRE(r.gpu_busy_fraction == Approx(100 * 0.004 / 2.0));

  REQUIRE(r.batching->max_size == 64);
  REQUIRE(r.batching->mean_size == 64.0);
  REQUIRE(r.batching->flushed_on_timeout == 0);

  // latency: 1..6400 us uniform; nearest-rank p50 = 3200 us within the histogram error
  REQUIRE(r.item_latency.count == 6400);
  REQUIRE(r.item_latency.p50_s == Approx(3.2e-3).epsilon(m::latency_histogram::relative_error));
  REQUIRE(r.item_latency.p99_s == Approx(6.336e-3).epsilon(m::latency_histogram::relative_error));
  REQUIRE(r.item_latency.max_s == 6.4e-3);
  REQUIRE(r.item_latency.mean_s == Approx(3.2005e-3));

  REQUIRE(r.throughput == Approx(6390 / 2.0));
  REQUIRE(r.in_flight() == 0);
  REQUIRE(r.verdict.kind == m::verdict_kind::cpu_stage_bound);
  REQUIRE(r.verdict.stage == "normalize");
}

TEST_CASE("report: operator<< prints one row per stage and lane, and the verdict") {
  m::report r = report_from_counters();
  r.stages[1].failed = 6;
  r.errors = {{"normalize", 17, "bad header"}};
  r.errors_total = 6;
  std::ostringstream os;
  os << r;
  const std::string s = os.str();
  INFO(s);
  for (const char* needle : {"2.000 s wall",
                             "host runtime",
                             "produced 6400",
                             "completed 6390",
                             "failed 6",
                             "cancelled 4",
                             "3195.0 items/s",
                             "GPU busy 20.0%",
                             "normalize",
                             "map",
                             "97.0",
                             "62.0/64/64",
                             "write \"out\"",
                             "lane",
                             "H2D GB/s",
                             "9.63",
                             "100 batches, mean size 64.0 of max 64",
                             "latency ms",
                             "p99",
                             "item",
                             "verdict: cpu_stage_bound ('normalize')",
                             "advice: add workers",
                             "CPU: the process kept 0.75 of its 2 cores busy (37.5%)",
                             "placement: automatic, stage threads pinned after 7 of 9 rounds",
                             "  failed 6\n",
                             "errors: 6 (the first 1)",
                             "stage 'normalize', item 17: bad header"})
    REQUIRE(s.find(needle) != std::string::npos);
  REQUIRE(s.find("in flight") == std::string::npos);
  r.produced = 6410;
  std::ostringstream os2;
  os2 << r;
  REQUIRE(os2.str().find("in flight 10") != std::string::npos);
}

TEST_CASE("report: to_json parses and round-trips every number") {
  m::report r = report_from_counters();
  r.stages[2].occupancy_mean = std::numeric_limits<double>::quiet_NaN();  // JSON has no NaN
  r.expired = 3;
  r.stages[1].failed = 6;
  r.stages[1].expired = 3;
  r.errors = {{"normalize", 17, "bad \"header\""}, {"normalize", 40, "short read"}};
  r.errors_total = 6;
  const json j = json::parse(m::to_json(r));
  REQUIRE(j["expired"] == 3);
  REQUIRE(j["stages"][1]["failed"] == 6);
  REQUIRE(j["stages"][1]["expired"] == 3);
  REQUIRE(j["errors_total"] == 6);
  REQUIRE(j["errors"].size() == 2);
  REQUIRE(j["errors"][0]["stage"] == "normalize");
  REQUIRE(j["errors"][0]["item"] == 17);
  REQUIRE(j["errors"][0]["message"] == "bad \"header\"");
  REQUIRE(j["errors"][1]["item"] == 40);
  REQUIRE(j["wall_s"].get<double>() == r.wall_s);
  REQUIRE(j["produced"] == r.produced);
  REQUIRE(j["completed"] == r.completed);
  REQUIRE(j["failed"] == r.failed);
  REQUIRE(j["cancelled"] == r.cancelled);
  REQUIRE(j["throughput"].get<double>() == r.throughput);
  REQUIRE(j["runtime"] == "host");
  REQUIRE(j["cpus"] == r.cpus);
  REQUIRE(j["process_cpu_s"].get<double>() == r.process_cpu_s);
  REQUIRE(j["placement"]["mode"] == "automatic");
  REQUIRE(j["placement"]["rounds"] == 9);
  REQUIRE(j["placement"]["pinned_rounds"] == 7);
  REQUIRE(j["gpu_busy_fraction"].get<double>() == r.gpu_busy_fraction);
  REQUIRE(j["stages"].size() == r.stages.size());
  for (std::size_t i = 0; i < r.stages.size(); ++i) {
    const auto& js = j["stages"][i];
    const auto& s = r.stages[i];
    REQUIRE(js["name"] == s.name);
    REQUIRE(js["kind"] == std::string(m::to_string(s.kind)));
    REQUIRE(js["workers"] == s.workers);
    REQUIRE(js["items"] == s.items);
    REQUIRE(js["busy_s"].get<double>() == s.busy_s);  // exact: shortest round-trip form
    REQUIRE(js["starved_s"].get<double>() == s.starved_s);
    REQUIRE(js["blocked_s"].get<double>() == s.blocked_s);
    if (std::isnan(s.occupancy_mean)) {
      REQUIRE(js["occupancy_mean"].is_null());
    } else {
      REQUIRE(js["occupancy_mean"].get<double>() == s.occupancy_mean);
    }
    REQUIRE(js["occupancy_max"] == s.occupancy_max);
    REQUIRE(js["ring_capacity"] == s.ring_capacity);
  }
  REQUIRE(j["lanes"].size() == 2);
  REQUIRE(j["lanes"][1]["lane"] == 1);
  REQUIRE(j["lanes"][1]["h2d_s"].get<double>() == r.lanes[1].h2d_s);
  REQUIRE(j["lanes"][1]["compute_s"].get<double>() == r.lanes[1].compute_s);
  REQUIRE(j["lanes"][1]["d2h_bytes"] == r.lanes[1].d2h_bytes);
  REQUIRE(j["batching"]["mean_size"].get<double>() == r.batching->mean_size);
  REQUIRE(j["batching"]["flushed_on_timeout"] == 0);
  REQUIRE(j["item_latency"]["p99_s"].get<double>() == r.item_latency.p99_s);
  REQUIRE(j["item_latency"]["count"] == 6400);
  REQUIRE(j["batch_latency"]["max_s"].get<double>() == r.batch_latency.max_s);
  REQUIRE(j["verdict"]["kind"] == "cpu_stage_bound");
  REQUIRE(j["verdict"]["stage"] == "normalize");
  REQUIRE(j["verdict"]["summary"] == r.verdict.summary);
  REQUIRE(j["verdict"]["advice"] == r.verdict.advice);
  REQUIRE(j["machine_cpu_s"].get<double>() == r.machine_cpu_s);
  REQUIRE(j["machine_busy_cpu_s"].get<double>() == r.machine_busy_cpu_s);
  REQUIRE(j["timeline"].empty());

  // The segment's host time per lane, the machine's CPU time and the timeline.
  r.lanes[1].stage_in_s = 0.25;
  r.lanes[1].stage_out_s = 0.5;
  r.machine_cpu_s = 8.0;
  r.machine_busy_cpu_s = 6.0;
  m::verdict_period period;
  period.start_s = 0.1;
  period.end_s = 0.2;
  period.verdict = {m::verdict_kind::sink_bound, "write", "s", "a"};
  period.process_cpu_load = 0.5;
  period.other_cpu_load = 0.25;
  r.timeline = {period};
  const json k = json::parse(m::to_json(r));
  REQUIRE(k["lanes"][1]["stage_in_s"].get<double>() == 0.25);
  REQUIRE(k["lanes"][1]["stage_out_s"].get<double>() == 0.5);
  REQUIRE(k["machine_cpu_s"].get<double>() == 8.0);
  REQUIRE(k["machine_busy_cpu_s"].get<double>() == 6.0);
  REQUIRE(k["timeline"].size() == 1);
  REQUIRE(k["timeline"][0]["end_s"].get<double>() == 0.2);
  REQUIRE(k["timeline"][0]["other_cpu_load"].get<double>() == 0.25);
  REQUIRE(k["timeline"][0]["verdict"]["kind"] == "sink_bound");
  REQUIRE(k["timeline"][0]["verdict"]["stage"] == "write");
  std::ostringstream table;
  table << r;
  CHECK_THAT(table.str(), Catch::Contains("stage-in ms") && Catch::Contains("stage-out ms") &&
                              Catch::Contains("500.000") &&
                              Catch::Contains("timeline: 0.10-0.20 s sink_bound 'write'"));

  r.batching.reset();
  REQUIRE(json::parse(m::to_json(r))["batching"].is_null());
  REQUIRE(json::parse(m::to_json(m::report{}))["stages"].empty());
}

TEST_CASE("report: window() of two cumulative snapshots diagnoses the recent period") {
  // First 10 s: the source was the limit. Next 5 s: normalize became the limit.
  const auto stage = [](const char* name, m::stage_kind kind, std::size_t workers, double busy,
                        double starved, double blocked) {
    m::stage_report s;
    s.name = name;
    s.kind = kind;
    s.workers = workers;
    s.busy_s = busy;
    s.starved_s = starved;
    s.blocked_s = blocked;
    return s;
  };
  m::report first;
  first.wall_s = 10;
  first.produced = first.completed = 10'000;
  first.stages = {stage("read", m::stage_kind::source, 1, 9.7, 0, 0.1),
                  stage("normalize", m::stage_kind::map, 2, 6.0, 13.8, 0),
                  stage("write", m::stage_kind::sink, 1, 1.0, 8.9, 0)};
  first.cpus = 4;
  first.process_cpu_s = 12.0;
  first.placement = {"automatic", 50, 48};
  m::complete_report(first);
  REQUIRE(first.verdict.kind == m::verdict_kind::source_bound);

  m::report later = first;
  later.wall_s = 15;
  later.produced = later.completed = 12'000;
  later.stages[0].busy_s += 0.4;
  later.stages[0].blocked_s += 4.5;
  later.stages[1].busy_s += 9.8;
  later.stages[1].starved_s += 0.1;
  later.stages[2].busy_s += 0.2;
  later.stages[2].starved_s += 4.7;
  later.process_cpu_s += 19.0;  // 3.8 of the 4 cores over the last 5 s
  first.machine_cpu_s = 40.0;   // /proc/stat: the 4 CPUs over the first 10 s
  first.machine_busy_cpu_s = 13.0;
  later.machine_cpu_s = 60.0;
  later.machine_busy_cpu_s = 13.0 + 19.6;   // the process's 19 and others' 0.6
  later.placement = {"automatic", 75, 53};  // pinned after 5 of the last 25 rounds
  m::complete_report(later);

  const m::report w = m::window(later, first);
  REQUIRE(w.wall_s == Approx(5.0));
  REQUIRE(w.completed == 2'000);
  REQUIRE(w.throughput == Approx(400.0));
  REQUIRE(w.stages[1].busy_s == Approx(9.8));
  REQUIRE(w.verdict.kind == m::verdict_kind::cpu_stage_bound);
  REQUIRE(w.verdict.stage == "normalize");
  // The window's CPU time is its own: the cores were 95% busy in it (60% over the run),
  // so the advice is not to add workers.
  REQUIRE(w.process_cpu_s == Approx(19.0));
  REQUIRE(m::process_cpu_load(w) == Approx(0.95));
  REQUIRE(m::machine_cpu_load(w) == Approx(0.98));
  REQUIRE(m::other_cpu_load(w) == Approx(0.03));
  CHECK(w.placement.mode == "automatic");
  CHECK(w.placement.rounds == 25);
  CHECK(w.placement.pinned_rounds == 5);
  CHECK_THAT(w.verdict.advice, Catch::Contains("make 'normalize' cheaper"));

  const std::string line = m::format_progress(later, first);
  INFO(line);
  REQUIRE(line.find("12000 done") != std::string::npos);
  REQUIRE(line.find("400.0 items/s") != std::string::npos);
  REQUIRE(line.find("cpu_stage_bound 'normalize'") != std::string::npos);
  REQUIRE(line.find('\n') == std::string::npos);
}
