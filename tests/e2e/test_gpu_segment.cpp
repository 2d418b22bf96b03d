// The GPU segment on the host runtime: stage-in into pinned slots, H2D, a "kernel" on
// the lane's stream, D2H, stage-out. With jitter on every stream operation, a missing
// wait anywhere (slot reused too early, result read before its copy) corrupts data; the
// output must equal a CPU reference bit for bit.
#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;
using R = host::runtime;

namespace {

constexpr std::size_t features = 16;

// The model: a per-item hash of its features (any bit flip changes it).
std::uint64_t reference(std::uint64_t item) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t f = 0; f < features; ++f) {
    const std::uint32_t x = static_cast<std::uint32_t>(item * 31 + f * 7);
    h = (h ^ (x * 2654435761u)) * 1099511628211ull;
  }
  return h;
}

auto make_segment(std::size_t lanes, std::size_t max_batch, bool jitter) {
  auto stage_in = [](std::vector<std::uint64_t>& batch, R::pinned_span<std::uint32_t> dst) {
    if (batch.size() * features > dst.size()) return batch.size() * features;  // won't fit
    std::size_t n = 0;
    for (std::uint64_t item : batch)
      for (std::size_t f = 0; f < features; ++f)
        dst[n++] = static_cast<std::uint32_t>(item * 31 + f * 7);
    return n;
  };
  auto compute = [](lane_batch<R, std::uint32_t, std::uint64_t>& l) {
    const std::size_t items = l.items;
    l.stream.enqueue([in = l.in, out = l.out, items] {
      auto x = in.unsafe_host();
      auto y = out.unsafe_host();
      for (std::size_t i = 0; i < items; ++i) {
        std::uint64_t h = 1469598103934665603ull;
        for (std::size_t f = 0; f < features; ++f)
          h = (h ^ (x[i * features + f] * 2654435761u)) * 1099511628211ull;
        y[i] = h;
      }
    });
    return items;
  };
  auto stage_out = [](std::vector<std::uint64_t>&& batch, R::pinned_span<const std::uint64_t> r) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    out.reserve(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) out.emplace_back(batch[i], r[i]);
    return out;
  };
  auto g = gpu<R, std::uint32_t, std::uint64_t>({.lanes = lanes,
                                                 .slots_per_lane = 2,
                                                 .in_elems = max_batch * features,
                                                 .out_elems = max_batch},
                                                stage_in, compute, stage_out);
  if (jitter)
    g.streams([](std::size_t lane) {
      return host::stream{host::jitter{lane + 1, std::chrono::microseconds(20)}};
    });
  return g;
}

}  // namespace

TEST_CASE("gpu segment (host runtime, jitter): 100k items equal the CPU reference") {
  const std::size_t lanes = GENERATE(1u, 3u);
  const std::uint64_t n = t::scaled(100'000);
  CAPTURE(lanes, n);
  std::uint64_t next = 0, mismatches = 0, out_of_order = 0;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
             batch(64).max_delay(std::chrono::microseconds(500)) | make_segment(lanes, 64, true) |
             unbatch() | sink([&](std::pair<std::uint64_t, std::uint64_t> r) {
               if (r.first != next) ++out_of_order;
               if (r.second != reference(r.first)) ++mismatches;
               next = r.first + 1;
             })};
  const auto c = p.run();
  REQUIRE(c.completed == n);
  REQUIRE(c.produced == c.completed + c.failed + c.cancelled);
  REQUIRE(mismatches == 0);
  REQUIRE(out_of_order == 0);  // results leave in input order
}

// Lanes wait for their events asleep (event_wait::block, the default) or polling (spin):
// the same results either way, and the lane table shows what the lane threads' CPU paid
// (how much less asleep: bench_inference's conveyor/wait:block|spin rows).
TEST_CASE("gpu segment: lanes that wait asleep or spinning agree, the report has their CPU time") {
  const event_wait w = GENERATE(event_wait::block, event_wait::spin);
  CAPTURE(w == event_wait::block ? "block" : "spin");
  constexpr int n = 400;
  auto g = gpu<R, int, int>(
      {.lanes = 2, .in_elems = 16, .out_elems = 16, .waiting = w},
      [](std::vector<int>& b, R::pinned_span<int> dst) {
        for (std::size_t i = 0; i < b.size(); ++i) dst[i] = b[i];
        return b.size();
      },
      [](lane_batch<R, int, int>& l) {
        const std::size_t k = l.items;
        l.stream.enqueue([in = l.in, out = l.out, k] {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          for (std::size_t i = 0; i < k; ++i) out.unsafe_host()[i] = in.unsafe_host()[i] * 2;
        });
        return k;
      },
      [](std::vector<int>&& b, R::pinned_span<const int> r) {
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = r[i];
        return b;
      });
  int next = 0, wrong = 0;
  pipeline p{from_range(std::views::iota(0, n)) | batch(16) | std::move(g) | unbatch() |
             sink([&](int y) { wrong += y == 2 * next++ ? 0 : 1; })};
  const report r = p.run();
  CHECK(r.completed == n);
  CHECK(wrong == 0);
  REQUIRE(r.lanes.size() == 2);
  for (const auto& l : r.lanes) CHECK(l.cpu_s > 0);
}

// Lanes spread over devices: every lane's stream, slots and events are made on its
// device, and both its threads bind it; the host runtime's streams refuse work from a
// thread bound elsewhere, so a missing bind fails this test.
TEST_CASE("gpu segment: lanes spread over several devices, each lane bound to its own") {
  const std::vector<int> devices{1, 3, 3};
  std::atomic<int> unbound{0};
  auto g = gpu<R, int, int>(
      {.lanes = 4, .in_elems = 16, .out_elems = 16, .devices = devices},
      [&](std::vector<int>& b, R::pinned_span<int> dst) {
        if (host::current_device() != 1 && host::current_device() != 3) unbound.fetch_add(1);
        for (std::size_t i = 0; i < b.size(); ++i) dst[i] = b[i];
        return b.size();
      },
      [&](lane_batch<R, int, int>& l) {
        if (l.device != host::current_device()) unbound.fetch_add(1);
        if (l.device != devices[l.lane % devices.size()]) unbound.fetch_add(1);
        const std::size_t k = l.items;
        l.stream.enqueue([in = l.in, out = l.out, k] {
          // Long enough to count: an instant kernel's interval can round to nothing in
          // the events' float milliseconds, and each device's busy time is checked below.
          std::this_thread::sleep_for(std::chrono::microseconds(20));
          for (std::size_t i = 0; i < k; ++i) out.unsafe_host()[i] = in.unsafe_host()[i] + 1;
        });
        return k;
      },
      [&](std::vector<int>&& b, R::pinned_span<const int> r) {
        if (host::current_device() != 1 && host::current_device() != 3) unbound.fetch_add(1);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = r[i];
        return b;
      });
  int next = 0, wrong = 0;
  pipeline p{from_range(std::views::iota(0, 2000)) | batch(16) | std::move(g) | unbatch() |
             sink([&](int y) { wrong += y == 1 + next++ ? 0 : 1; })};
  const report r = p.run();
  CHECK(r.completed == 2000);
  CHECK(wrong == 0);
  CHECK(unbound.load() == 0);
  CHECK(host::current_device() == 0);  // building the lanes left this thread's device alone
  REQUIRE(r.lanes.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(r.lanes[i].device == devices[i % 3]);
  REQUIRE(r.devices.size() == 2);  // devices 1 and 3, each with its own busy union
  CHECK(r.devices[0].device == 1);
  CHECK(r.devices[1].device == 3);
  for (const auto& d : r.devices) CHECK(d.busy_fraction > 0);
  std::ostringstream os;
  os << r;
  CHECK_THAT(os.str(), Catch::Contains("device 1: ") && Catch::Contains("device 3: "));
}

TEST_CASE("gpu segment: a batch larger than a slot fails with what to change") {
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, std::uint64_t{100})) | batch(32) |
             make_segment(2, 16, false) | unbatch() | sink([](auto) {})};
  try {
    p.run();
    FAIL("ran a batch of 32 through slots of 16");
  } catch (const stage_error& e) {
    CHECK(e.stage() == "gpu");
    CHECK_THAT(e.what(), Catch::Contains("raise in_elems/out_elems"));
  }
  const auto c = p.counts();
  REQUIRE(c.produced == c.completed + c.failed + c.cancelled);
}

TEST_CASE("gpu segment: a stage-in writing past its slot throws before the write lands") {
  // One lane, two adjacent slots of 16 elements; every batch of 4 items writes 8 each.
  auto g = gpu<R, int, int>(
      {.lanes = 1, .slots_per_lane = 2, .in_elems = 16, .out_elems = 16},
      [](std::vector<int>& b, R::pinned_span<int> dst) {
        std::size_t n = 0;
        for (int v : b)
          for (int k = 0; k < 8; ++k) dst[n++] = v;
        return n;
      },
      [](lane_batch<R, int, int>&) { return std::size_t{0}; },
      [](std::vector<int>&& b, R::pinned_span<const int>) { return b; });
  pipeline p{from_range(std::views::iota(0, 100)) | batch(4) | std::move(g) | unbatch() |
             sink([](int) {})};
  try {
    p.run();
    FAIL("a stage-in wrote 32 elements into a slot of 16");
  } catch (const stage_error& e) {
    CHECK(e.stage() == "gpu");
    CHECK_THROWS_WITH(e.rethrow_nested(),
                      Catch::Contains("index 16 is outside a span of 16 elements"));
  }
  const auto c = p.counts();
  REQUIRE(c.produced == c.completed + c.failed + c.cancelled);
}

TEST_CASE("gpu segment: a failing kernel surfaces from run() as the stage's error") {
  auto g = gpu<R, int, int>(
      {.lanes = 2, .in_elems = 8, .out_elems = 8},
      [](std::vector<int>& b, R::pinned_span<int> dst) {
        for (std::size_t i = 0; i < b.size(); ++i) dst[i] = b[i];
        return b.size();
      },
      [](lane_batch<R, int, int>& l) {
        l.stream.enqueue([] { throw std::runtime_error("kernel fault"); });
        return l.items;
      },
      [](std::vector<int>&& b, R::pinned_span<const int>) { return b; });
  pipeline p{from_range(std::views::iota(0, 1000)) | batch(8) | std::move(g) | unbatch() |
             sink([](int) {})};
  try {
    p.run();
    FAIL("a kernel fault went unnoticed");
  } catch (const stage_error& e) {
    CHECK(e.stage() == "gpu");
    CHECK_THROWS_WITH(e.rethrow_nested(), Catch::Contains("kernel fault"));
  }
  const auto c = p.counts();
  REQUIRE(c.produced == c.completed + c.failed + c.cancelled);
  REQUIRE(c.failed >= 1);
}

TEST_CASE("gpu segment: bad lane configuration fails at construction") {
  auto bad = [](gpu_options o) {
    return pipeline(from_range(std::vector<int>{1}) | batch(1) |
                    gpu<R, int, int>(
                        o, [](std::vector<int>&, R::pinned_span<int>) { return std::size_t{0}; },
                        [](lane_batch<R, int, int>&) { return std::size_t{0}; },
                        [](std::vector<int>&& b, R::pinned_span<const int>) { return b; }) |
                    unbatch() | sink([](int) {}));
  };
  REQUIRE_THROWS_WITH(bad({.lanes = 0, .in_elems = 1, .out_elems = 1}),
                      Catch::Contains("lanes must be in [1, 64]"));
  REQUIRE_THROWS_WITH(bad({.lanes = 1, .in_elems = 0, .out_elems = 1}),
                      Catch::Contains("set in_elems and out_elems"));
  REQUIRE_THROWS_WITH(bad({.lanes = 1, .slots_per_lane = 0, .in_elems = 1, .out_elems = 1}),
                      Catch::Contains("slots_per_lane must be in [1, 64]"));
  REQUIRE_THROWS_WITH(bad({.lanes = 2, .in_elems = 1, .out_elems = 1, .devices = {0, 8}}),
                      Catch::Contains("device 8 requested but 8 answer"));
}
