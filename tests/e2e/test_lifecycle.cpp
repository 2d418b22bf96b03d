// A pipeline's lifecycle calls used out of order, end to end on the host: a moved-from
// pipeline throws closed_error from every call that needs its stages (never crashes), a
// pipeline runs once and a second run() says so, and one assigned over while it runs is
// stopped and joined first.
#include "conveyor/pipeline.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;
using Catch::Matchers::Contains;
using t::counted;

namespace {

auto small_run(std::atomic<int>& seen) {
  return pipeline{from_range(std::vector<int>{1, 2, 3}) | map([](int x) { return x + 1; }) |
                  sink([&seen](int) { seen.fetch_add(1); })};
}

auto plus_one_service() {
  return pipeline{input<int>() | map([](int x) { return x + 1; }).workers(2)};
}

// An endless source of counted items, passed to a sink that counts them.
auto endless(std::atomic<std::uint64_t>& seen) {
  return pipeline{source([i = std::uint64_t{0}]() mutable -> std::optional<counted> {
                    return counted{i++};
                  }) | map([](counted c) { return c; }).workers(2) |
                      sink([&seen](counted) { seen.fetch_add(1); }),
                  pipeline_options{.ring_capacity = 4}};
}

}  // namespace

// The moved-from object is used on purpose: that is what these tests are about.
// NOLINTBEGIN(bugprone-use-after-move,hicpp-invalid-access-moved)
TEST_CASE("lifecycle: a moved-from pipeline throws closed_error from every call") {
  SECTION("a source pipeline") {
    std::atomic<int> seen{0};
    auto p = small_run(seen);
    auto q = std::move(p);
    REQUIRE_THROWS_AS(p.run(), closed_error);
    REQUIRE_THROWS_WITH(p.run(), Contains("run() on a moved-from pipeline"));
    REQUIRE_THROWS_WITH(p.start(), Contains("start() on a moved-from pipeline"));
    REQUIRE_THROWS_WITH(p.wait(), Contains("wait() on a moved-from pipeline"));
    REQUIRE_THROWS_WITH(p.stop(stop_mode::drain), Contains("stop() on a moved-from pipeline"));
    REQUIRE_THROWS_WITH(p.report(), Contains("report() on a moved-from pipeline"));
    REQUIRE_THROWS_WITH(p.trace_json(), Contains("trace_json() on a moved-from pipeline"));
    std::ostringstream os;
    REQUIRE_THROWS_WITH(p.write_trace(os), Contains("write_trace() on a moved-from pipeline"));
    REQUIRE_FALSE(p.tracing());
    REQUIRE(p.counts().produced == 0);
    // The pipeline it went to runs.
    const auto c = q.run();
    REQUIRE(c.completed == 3);
    REQUIRE(seen.load() == 3);
  }
  SECTION("a service pipeline") {
    auto p = plus_one_service();
    auto q = std::move(p);
    std::atomic<int> calls{0};
    const auto done = [&calls](outcome<int>) noexcept { calls.fetch_add(1); };
    REQUIRE_THROWS_AS(p.start(), closed_error);
    REQUIRE_THROWS_AS(p.submit(1), closed_error);
    REQUIRE_THROWS_WITH(p.submit(1), Contains("submit() on a moved-from pipeline"));
    REQUIRE_THROWS_WITH(p.submit(1, done), Contains("submit() on a moved-from pipeline"));
    REQUIRE_THROWS_WITH(p.try_submit(1), Contains("try_submit() on a moved-from pipeline"));
    int kept = 7;
    REQUIRE_THROWS_WITH((void)p.try_submit(std::move(kept), done),
                        Contains("try_submit() on a moved-from pipeline"));
    REQUIRE(calls.load() == 0);  // refused calls never call back
    // Moved from after it started: the same, and the running one still serves.
    q.start();
    auto r = std::move(q);
    REQUIRE_THROWS_WITH(q.submit(1), Contains("submit() on a moved-from pipeline"));
    REQUIRE_THROWS_WITH(q.stop(stop_mode::drain), Contains("stop() on a moved-from pipeline"));
    REQUIRE(r.submit(41).get() == 42);
    r.submit(1, done);
    const auto c = r.stop(stop_mode::drain);
    REQUIRE(c.completed == 2);
    REQUIRE(calls.load() == 1);
  }
}
// NOLINTEND(bugprone-use-after-move,hicpp-invalid-access-moved)

TEST_CASE("lifecycle: a pipeline runs once, and a second run() says so") {
  std::atomic<int> seen{0};
  SECTION("run() twice") {
    auto p = small_run(seen);
    REQUIRE(p.run().completed == 3);
    REQUIRE_THROWS_AS(p.run(), closed_error);
    REQUIRE_THROWS_WITH(p.run(), Contains("run() called twice"));
    REQUIRE(seen.load() == 3);  // nothing ran again
  }
  SECTION("run() after a run that failed") {
    pipeline p{from_range(std::vector<int>{1, 2, 3}) | sink([](int x) {
                 if (x == 2) throw std::runtime_error("two");
               })};
    REQUIRE_THROWS_AS(p.run(), stage_error);
    REQUIRE_THROWS_WITH(p.run(), Contains("run() called twice"));
  }
  SECTION("run() after start()") {
    auto p = small_run(seen);
    p.start();
    REQUIRE_THROWS_WITH(p.run(), Contains("run() called twice (or after start())"));
    REQUIRE(p.wait().completed == 3);
  }
  SECTION("start() twice") {
    auto p = plus_one_service();
    p.start();
    REQUIRE_THROWS_WITH(p.start(), Contains("start() called twice"));
    REQUIRE(p.submit(1).get() == 2);
    REQUIRE(p.stop(stop_mode::drain).completed == 1);
  }
}

TEST_CASE("lifecycle: a running pipeline assigned over is stopped and joined first") {
  const long live_before = counted::live.load();
  SECTION("an endless source pipeline") {
    std::atomic<std::uint64_t> seen_a{0}, seen_b{0};
    auto p = endless(seen_a);
    p.start();
    while (seen_a.load() < 100) std::this_thread::yield();
    p = endless(seen_b);  // the old one must stop and join here, or this never returns
    const std::uint64_t after = seen_a.load();
    p.start();
    while (seen_b.load() < 100) std::this_thread::yield();
    CHECK(seen_a.load() == after);  // nothing of the old one still runs
    p.stop(stop_mode::cancel);
  }
  SECTION("a service with items outstanding") {
    std::atomic<bool> release{false};
    const auto gated = [&release] {
      return pipeline{input<int>() | map([&release](int x) {
                        while (!release.load()) std::this_thread::yield();
                        return x;
                      })};
    };
    auto p = gated();
    p.start();
    std::vector<std::future<int>> futures;
    for (int i = 0; i < 20; ++i) futures.push_back(p.submit(int{i}));
    // The gate opens as the assignment starts, before or after its cancel: either way
    // the held item ends, and so does the join.
    std::atomic<bool> assigning{false};
    std::thread opener{[&] {
      while (!assigning.load()) std::this_thread::yield();
      release.store(true);
    }};
    assigning.store(true);
    p = gated();  // cancel, join: every item is settled, with its result or closed_error
    opener.join();
    for (auto& f : futures) {
      REQUIRE(f.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
      try {
        (void)f.get();
      } catch (const closed_error&) {
      }
    }
    p.start();
    REQUIRE(p.submit(5).get() == 5);
    p.stop(stop_mode::drain);
  }
  REQUIRE(counted::live.load() == live_before);
}
