// Thrust on a lane's stream (conveyor_models/thrust_topk.hpp): the top-k against the CPU
// reference, a lane that stays asynchronous with it (spin gate), and a compute functor
// that synchronizes through a value-returning Thrust call, which the verdict names.
// Part of gpu_tests (exits 77 without a device).
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <ranges>
#include <string>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/cuda/runtime.hpp"
#include "conveyor_models/reference.hpp"
#include "conveyor_models/thrust_topk.hpp"
#include "device_copies.hpp"
#include "test_kernels.hpp"

namespace cm = conveyor_models;
namespace cu = conveyor::cuda;
namespace gpu = conveyor::test::gpu;

namespace {

int peek(const int* p) { return *static_cast<const volatile int*>(p); }

using conveyor::test::gpu::download;
using conveyor::test::gpu::upload;

std::vector<float> tied_scores(std::size_t rows, std::size_t cols, std::uint32_t seed) {
  std::vector<float> v(rows * cols);
  std::uint32_t x = seed;
  for (float& f : v) {  // few distinct values: most rows hold ties
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int>(x >> 28) - 8) * 0.25f;
  }
  for (std::size_t c = 0; c < cols; ++c) v[c] = 1.0f;  // row 0: all tied
  return v;
}

}  // namespace

TEST_CASE("thrust gpu: top-k on a stream matches the reference, ties included") {
  cu::stream s;
  const std::size_t cols =
      GENERATE(std::size_t{1}, std::size_t{10}, std::size_t{129}, std::size_t{1000});
  const std::size_t rows = 257;
  CAPTURE(cols);
  const auto scores = tied_scores(rows, cols, static_cast<std::uint32_t>(cols));
  auto d_scores = upload(scores, s);
  for (std::size_t k : {std::size_t{1}, std::min<std::size_t>(5, cols), cols}) {
    CAPTURE(k);
    cm::thrust_topk topk{rows, cols, k};
    CHECK(topk.arena_bytes() > 0);
    // Fewer rows than the sizing run, then all of them: each call writes only its rows.
    for (std::size_t r : {rows / 2, rows}) {
      CAPTURE(r);
      cu::device_buffer<std::uint32_t> d_idx{rows * k};
      cu::device_buffer<float> d_top{rows * k};
      memset_async(d_idx.span(), 0xff, s);
      topk.run(d_scores.span(), r, d_idx.span(), d_top.span(), s);
      const auto idx = download(d_idx, rows * k, s);
      const auto top = download(d_top, rows * k, s);
      std::vector<std::uint32_t> want(r * k);
      cm::topk_rows_ref(std::span(scores).subspan(0, r * cols), r, cols, k, want);
      REQUIRE(std::vector<std::uint32_t>(idx.begin(), idx.begin() + r * k) == want);
      for (std::size_t j = 0; j < r * k; ++j) REQUIRE(top[j] == scores[(j / k) * cols + want[j]]);
      for (std::size_t j = r * k; j < rows * k; ++j) REQUIRE(idx[j] == 0xffffffffu);
    }
    CHECK(topk.arena_peak_bytes() <= topk.arena_bytes());
  }
  cu::device_buffer<std::uint32_t> small{1};
  cm::thrust_topk topk{4, cols, 1};
  CHECK_THROWS_AS(topk.run(d_scores.span(), 5, small.span(), {}, s), conveyor::config_error);
  CHECK_THROWS_AS(cm::thrust_topk(4, cols, cols + 1), conveyor::config_error);
}

TEST_CASE("thrust gpu: top-k with par_nosync and the arena only enqueues (spin gate)", "[gate]") {
  cu::stream s;
  const std::size_t rows = 512, cols = 100, k = 3;
  const auto scores = tied_scores(rows, cols, 7);
  auto d_scores = upload(scores, s);
  cm::thrust_topk topk{rows, cols, k};
  cu::device_buffer<std::uint32_t> d_idx{rows * k};
  cu::pinned_buffer<int> flags{4};  // [0] gate, [1] started, [2] result
  for (int& x : flags.span()) x = 0;
  int* const f = flags.data();
  gpu::launch_spin_until(f + 0, 1, gpu::cycles_for_ms(5000), f + 1, f + 2, s.native());
  topk.run(d_scores.span(), rows, d_idx.span(), {}, s);  // must return with the gate shut
  cu::event after{conveyor::event_timing::disabled};
  after.record(s);
  const bool held = !after.query() && peek(f + 2) == 0;
  *static_cast<volatile int*>(f + 0) = 1;  // open the gate
  after.synchronize();
  REQUIRE(held);
  REQUIRE(peek(f + 2) == 1);  // the kernel saw the gate open: run() had returned before
  std::vector<std::uint32_t> want(rows * k);
  cm::topk_rows_ref(scores, rows, cols, k, want);
  REQUIRE(download(d_idx, rows * k, s) == want);
}

TEST_CASE("thrust gpu: a compute functor that waits on a Thrust result -> the verdict says so") {
  using R = cu::runtime;
  const std::size_t rows = 64, cols = 10, n_batches = 60;
  const long long kernel_cycles = gpu::cycles_for_ms(2);  // each batch's "model": 2 ms
  cu::pinned_buffer<int> flags{3};
  for (int& x : flags.span()) x = 0;  // the gate never opens: the spin runs its 2 ms
  const auto run = [&](bool synchronizing) {
    std::vector<cm::thrust_topk> topk;
    for (int i = 0; i < 2; ++i) topk.emplace_back(rows, cols, 1);
    auto seg = conveyor::gpu<R, float, std::uint32_t>(
        {.lanes = 2, .in_elems = rows * cols, .out_elems = rows},
        [&](std::vector<std::uint64_t>& b, R::pinned_span<float> dst) {
          for (std::size_t i = 0; i < b.size() * cols; ++i)
            dst[i] = static_cast<float>((i * 7919) % 13);
          return b.size() * cols;
        },
        [&](conveyor::lane_batch<R, float, std::uint32_t>& l) {
          int* const f = flags.data();
          gpu::launch_spin_until(f, 1, kernel_cycles, f + 1, f + 2, l.stream.native());
          if (synchronizing)  // the sum comes back to the host: the call waits for the spin
            static_cast<void>(gpu::thrust_sum(l.in.data(), l.in.size(), l.stream.native()));
          topk[l.lane].run(l.in, l.items, l.out, {}, l.stream);
          return l.items;
        },
        [](std::vector<std::uint64_t>&& b, R::pinned_span<const std::uint32_t>) {
          return b.size();
        });
    conveyor::pipeline p{
        conveyor::from_range(std::views::iota(std::uint64_t{0}, rows * n_batches)) |
        conveyor::batch(rows) | std::move(seg) | conveyor::sink([](std::size_t) {})};
    return p.run();
  };
  const conveyor::report waits = run(true);
  INFO(waits);
  REQUIRE(waits.completed == rows * n_batches);
  // The sum waits in the middle of the call (the top-k is queued after it), so the call
  // returns with work queued: its time, as long as the device's, tells.
  CHECK_THAT(waits.verdict.advice, Catch::StartsWith("The lanes cannot queue work ahead") &&
                                       Catch::Contains("waits for the device"));
  CHECK(waits.verdict.advice.find("healthy") == std::string::npos);
  const conveyor::report async = run(false);
  INFO(async);
  REQUIRE(async.completed == rows * n_batches);
  CHECK(async.verdict.advice.find("waits for the device") == std::string::npos);
  CHECK(async.verdict.advice.find("cannot queue") == std::string::npos);
  double enqueue = 0, compute = 0;
  for (const auto& l : async.lanes) {
    enqueue += l.enqueue_s;
    compute += l.compute_s;
  }
  CHECK(enqueue < 0.5 * compute);
}
