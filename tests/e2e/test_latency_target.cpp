// batch(max).target_p99(d) / target_p95(d) end to end on the host: bad configurations
// fail at construction and say what to change; a service and a source pipeline with a
// target deliver every item, in batches never above max, and the report (table and JSON)
// shows what the batcher chose and whether the target was met. No assertion on time:
// whether a target is met depends on the machine; the controller's decisions are tested
// on recorded traces in unit/stage/test_latency_controller.cpp.
#include "conveyor/pipeline.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <ranges>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/runtime/host/runtime.hpp"

using namespace conveyor;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

std::string config_message(const std::function<void()>& make) {
  try {
    make();
  } catch (const config_error& e) {
    return e.what();
  }
  return "no config_error";
}

auto doubled() {
  return map([](std::vector<std::uint64_t> b) {
    for (auto& x : b) x *= 2;
    return b;
  });
}

}  // namespace

TEST_CASE("latency target: a bad configuration fails at construction, saying what to change") {
  const auto with = [](batch_stage b) {
    return [b] { pipeline p{input<std::uint64_t>() | batch_stage(b) | doubled() | unbatch()}; };
  };
  CHECK_THAT(config_message(with(batch(8).target_p99(0ms))), Contains("must be positive"));
  CHECK_THAT(config_message(with(batch(8).target_p99(-1ms))), Contains("must be positive"));
  CHECK_THAT(config_message(with(batch(8).target_p99(2ms).max_delay(1ms))),
             Contains("either max_delay") && Contains("not both"));
  CHECK_THAT(config_message(with(batch(8).target_p99(2ms).target_p95(2ms))),
             Contains("one latency target"));
  CHECK_THAT(config_message([] {
               pipeline p{input<std::uint64_t>() | batch(8).target_p99(2ms) |
                          batch(4).target_p95(5ms) |
                          map([](std::vector<std::vector<std::uint64_t>> b) { return b; }) |
                          unbatch() | unbatch()};
             }),
             Contains("only one batch stage"));
  // Without a target, nothing changes: no latency_target in the report.
  pipeline fixed{input<std::uint64_t>() | batch(8).max_delay(100us) | doubled() | unbatch()};
  fixed.start();
  CHECK(fixed.submit(std::uint64_t{3}).get() == 6);
  CHECK(!fixed.stop(stop_mode::drain).latency_target);
}

TEST_CASE("latency target: a service delivers every item, batches within max, and reports") {
  constexpr std::size_t max = 16;
  constexpr std::uint64_t n = 6000;
  const bool p95 = GENERATE(false, true);
  std::atomic<std::size_t> largest{0};
  auto model = map([&](std::vector<std::uint64_t> b) {
    std::size_t seen = largest.load();
    while (b.size() > seen && !largest.compare_exchange_weak(seen, b.size())) {
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50 + 5 * b.size()));
    for (auto& x : b) x = x * 2 + 1;
    return b;
  });
  auto b = p95 ? batch(max).target_p95(20ms) : batch(max).target_p99(20ms);
  pipeline svc{input<std::uint64_t>().capacity(1024) | std::move(b).name("batcher") |
               std::move(model) | unbatch()};
  svc.start();
  std::vector<std::future<std::uint64_t>> futures;
  futures.reserve(n);
  for (std::uint64_t x = 0; x < n; ++x) {
    futures.push_back(svc.submit(x));
    if (x % 8 == 0) std::this_thread::sleep_for(50us);  // a stream, not one burst
  }
  for (std::uint64_t x = 0; x < n; ++x) REQUIRE(futures[x].get() == x * 2 + 1);
  const report r = svc.stop(stop_mode::drain);
  REQUIRE(r.completed == n);
  REQUIRE(largest.load() <= max);
  REQUIRE(r.latency_target);
  const latency_target_report& t = *r.latency_target;
  CHECK(t.stage == "batcher");
  CHECK(t.target_s == Approx(0.020));
  CHECK(t.percentile == Approx(p95 ? 95.0 : 99.0));
  // Every returned batch's outcome reaches the controller unless its return ring was
  // full: with n items in batches of at most max, at least a window's worth.
  REQUIRE(t.windows >= 1);
  CHECK(t.windows_met <= t.windows);
  CHECK(t.met == (20 * t.windows_met >= 19 * t.windows));
  CHECK(t.reason.empty() == (t.windows_met == t.windows));
  REQUIRE(!t.history.empty());
  std::uint64_t windows = 0;
  for (const latency_target_period& w : t.history) {
    windows += w.windows;
    CHECK(w.largest <= max);
    CHECK(w.mean_size >= 1.0);
    CHECK(w.mean_size <= static_cast<double>(max));
    CHECK(w.start_s <= w.end_s);
    CHECK(w.slack > 0.0);
    CHECK(w.slack <= 1.0);
  }
  CHECK(windows == t.windows);
  // The table and the JSON.
  std::ostringstream text;
  text << r;
  CHECK_THAT(text.str(), Contains("latency target ('batcher'): P" + std::string(p95 ? "95" : "99") +
                                  " <= 20.000 ms"));
  CHECK_THAT(text.str(), Contains("mean size"));
  const auto j = nlohmann::json::parse(metrics::to_json(r));
  REQUIRE(j["latency_target"].is_object());
  CHECK(j["latency_target"]["stage"] == "batcher");
  CHECK(j["latency_target"]["windows"] == t.windows);
  CHECK(j["latency_target"]["met"].is_boolean());
  CHECK(j["latency_target"]["history"].size() == t.history.size());
  CHECK(j["latency_target"]["history"][0]["mean_size"].is_number());
}

TEST_CASE("latency target: a source pipeline's batches keep the order and stay within max") {
  constexpr std::uint64_t n = 20000;
  constexpr std::size_t max = 8;
  std::vector<std::uint64_t> got;
  std::size_t largest = 0;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) | batch(max).target_p95(5ms) |
             sink([&](std::vector<std::uint64_t> b) {
               largest = std::max(largest, b.size());
               got.insert(got.end(), b.begin(), b.end());
             })};
  const report r = p.run();
  REQUIRE(r.completed == n);
  REQUIRE(got.size() == n);
  for (std::uint64_t x = 0; x < n; ++x) REQUIRE(got[x] == x);
  REQUIRE(largest <= max);
  REQUIRE(r.latency_target);
  CHECK(r.latency_target->windows_met <= r.latency_target->windows);
}

TEST_CASE("latency target: the GPU segment on the host runtime, behind a targeted batch") {
  using R = host::runtime;
  constexpr std::size_t max = 16;
  auto stage_in = [](std::vector<std::uint64_t>& b, R::pinned_span<std::uint64_t> dst) {
    for (std::size_t i = 0; i < b.size(); ++i) dst[i] = b[i];
    return b.size();
  };
  auto compute = [](lane_batch<R, std::uint64_t, std::uint64_t>& l) {
    const std::size_t k = l.items;
    l.stream.enqueue([in = l.in, out = l.out, k] {
      std::this_thread::sleep_for(100us);
      for (std::size_t i = 0; i < k; ++i) out.unsafe_host()[i] = in.unsafe_host()[i] + 7;
    });
    return k;
  };
  auto stage_out = [](std::vector<std::uint64_t>&& b, R::pinned_span<const std::uint64_t> res) {
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = res[i];
    return std::move(b);
  };
  auto segment = gpu<R, std::uint64_t, std::uint64_t>(
      {.lanes = 2, .slots_per_lane = 2, .in_elems = max, .out_elems = max, .name = "model"},
      stage_in, compute, stage_out);
  pipeline svc{input<std::uint64_t>() | batch(max).target_p99(10ms) | std::move(segment) |
               unbatch()};
  svc.start();
  std::vector<std::future<std::uint64_t>> futures;
  for (std::uint64_t x = 0; x < 3000; ++x) {
    futures.push_back(svc.submit(x));
    if (x % 4 == 0) std::this_thread::sleep_for(20us);
  }
  for (std::uint64_t x = 0; x < futures.size(); ++x) REQUIRE(futures[x].get() == x + 7);
  const report r = svc.stop(stop_mode::drain);
  REQUIRE(r.completed == futures.size());
  REQUIRE(r.latency_target);
  REQUIRE(r.batching);
  CHECK(r.batching->max_size == max);
}

TEST_CASE("latency target: a target the stages after the batch cannot meet says why") {
  // The model sleeps 4 ms per batch, the target is 1 ms: every item is late whatever the
  // machine's speed (a sleep is never shorter), and one request at a time (each waits for
  // the one before) makes every batch a batch of one.
  pipeline svc{input<std::uint64_t>() | batch(8).target_p99(1ms) |
               map([](std::vector<std::uint64_t> b) {
                 std::this_thread::sleep_for(4ms);
                 return b;
               }) |
               unbatch()};
  svc.start();
  for (std::uint64_t x = 0; x < 40; ++x) REQUIRE(svc.submit(x).get() == x);
  const report r = svc.stop(stop_mode::drain);
  REQUIRE(r.latency_target);
  const latency_target_report& t = *r.latency_target;
  REQUIRE(t.windows >= 1);
  CHECK(t.windows_met == 0);
  CHECK(!t.met);
  CHECK_THAT(t.reason, Contains("per batch of 1") && Contains("above the target of 1.00 ms"));
  std::ostringstream text;
  text << r;
  CHECK_THAT(text.str(), Contains("missed: the stages after the batch alone need"));
  CHECK_THAT(text.str(), Contains("): missed"));
}
