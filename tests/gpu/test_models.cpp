// The example model's GPU side (conveyor_models: kernels.cu, the cuBLAS MLP) against its
// CPU references, at each precision, with and without CUDA graphs, and inside a pipeline.
// Part of gpu_tests (exits 77 without a device).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/cuda/runtime.hpp"
#include "conveyor_models/kernels.hpp"
#include "conveyor_models/mlp.hpp"
#include "conveyor_models/reference.hpp"
#include "device_copies.hpp"

namespace cm = conveyor_models;
namespace cu = conveyor::cuda;

namespace {

std::uint64_t rng_state = 12345;
float next_float() {  // deterministic, in [-4, 4)
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return static_cast<float>(rng_state >> 40) / 16777216.0f * 8.0f - 4.0f;
}

using conveyor::test::gpu::download;
using conveyor::test::gpu::upload;

// Tolerance on logits, relative to the largest magnitude: what each precision's rounding
// and a different accumulation order (cuBLAS's, tensor cores') can move them by.
double tolerance(cm::precision p) {
  switch (p) {
    case cm::precision::fp32:
      return 1e-4;
    case cm::precision::tf32:
      return 1e-2;
    case cm::precision::fp16:
      return 1e-2;
    case cm::precision::bf16:
      return 4e-2;
  }
  return 0;
}

double max_abs(const std::vector<float>& v) {
  double m = 1.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// A label differing from the reference's only counts when the reference ranks it clearly
// lower: a near-tie may fall either way at reduced precision.
void check_labels(const std::vector<std::uint32_t>& got, const std::vector<float>& ref_logits,
                  std::size_t classes, double tol) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float* row = ref_logits.data() + i * classes;
    const float best = *std::max_element(row, row + classes);
    CAPTURE(i, got[i], best);
    REQUIRE(got[i] < classes);
    REQUIRE(static_cast<double>(best - row[got[i]]) <= tol);
  }
}

std::vector<std::uint8_t> pixels(std::size_t items, std::size_t input) {
  std::vector<std::uint8_t> px(items * input);
  for (std::size_t i = 0; i < items; ++i)
    cm::make_pixels(i, std::span(px).subspan(i * input, input));
  return px;
}

}  // namespace

TEST_CASE("models gpu: normalize matches the reference") {
  cu::stream s;
  const std::size_t n = GENERATE(1, 255, 100000);
  std::vector<std::uint8_t> px(n);
  for (std::size_t i = 0; i < n; ++i) px[i] = static_cast<std::uint8_t>(i * 37 + 11);
  const cm::normalize_params p{.mean = 0.45f, .stddev = 0.226f};
  auto d_px = upload(px, s);
  cu::device_buffer<float> d_out{n};
  cm::kernels::normalize_async(d_px.span(), d_out.span(), p, s);
  const auto got = download(d_out, n, s);
  std::vector<float> want(n);
  cm::normalize_ref(px, want, p);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-6));
}

TEST_CASE("models gpu: argmax and top-k match the reference, ties included") {
  cu::stream s;
  const std::size_t cols = GENERATE(1, 10, 33, 128, 129, 700, 1024);
  const std::size_t rows = 257;
  CAPTURE(cols);
  std::vector<float> scores(rows * cols);
  for (float& x : scores) x = next_float();
  for (std::size_t c = 0; c < cols; ++c) scores[c] = 1.0f;   // row 0: all tied
  if (cols > 2) scores[cols + 2] = scores[cols + 1] = 9.0f;  // row 1: a tie for first
  auto d_scores = upload(scores, s);

  cu::device_buffer<std::uint32_t> d_arg{rows};
  cm::kernels::argmax_rows_async(d_scores.span(), rows, cols, d_arg.span(), s);
  std::vector<std::uint32_t> want(rows);
  cm::argmax_rows_ref(scores, rows, cols, want);
  CHECK(download(d_arg, rows, s) == want);

  for (std::size_t k : {std::size_t{1}, std::min<std::size_t>(5, cols), cols}) {
    CAPTURE(k);
    cu::device_buffer<std::uint32_t> d_top{rows * k};
    cm::kernels::topk_rows_async(d_scores.span(), rows, cols, k, d_top.span(), s);
    std::vector<std::uint32_t> want_top(rows * k);
    cm::topk_rows_ref(scores, rows, cols, k, want_top);
    CHECK(download(d_top, rows * k, s) == want_top);
  }
  cu::device_buffer<std::uint32_t> d_top{rows};
  CHECK_THROWS_AS(
      cm::kernels::topk_rows_async(d_scores.span(), rows, cols, cols + 1, d_top.span(), s),
      conveyor::config_error);
}

TEST_CASE("models gpu: the cuBLAS MLP matches the reference at each precision") {
  const cm::precision p =
      GENERATE(cm::precision::fp32, cm::precision::tf32, cm::precision::fp16, cm::precision::bf16);
  const bool graphs = GENERATE(false, true);
  CAPTURE(cm::to_string(p), graphs);
  const cm::mlp_shape shape{.input = 256, .hidden = 192, .layers = 4, .classes = 10};
  const std::size_t items = 100;
  cm::mlp model{
      {.shape = shape, .prec = p, .seed = 3, .lanes = 2, .max_items = 128, .cuda_graphs = graphs}};
  const cm::reference_mlp ref{cm::make_weights(shape, 3), p};
  cu::stream s;

  std::vector<float> x(items * shape.input);
  for (float& v : x) v = next_float() * 0.5f;
  auto d_x = upload(x, s);
  cu::device_buffer<float> d_y{items * shape.classes};
  for (int rep = 0; rep < 2; ++rep) {  // the second call replays the graph
    model.forward(d_x.span(), d_y.span(), items, s, 1);
    const auto got = download(d_y, items * shape.classes, s);
    const auto want = ref.forward(x, items);
    const double tol = tolerance(p) * max_abs(want);
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(rep, i);
      REQUIRE(std::abs(static_cast<double>(got[i]) - want[i]) <= tol);
    }
  }
  CHECK(model.graphs_cached(1) == (graphs ? 1u : 0u));
  CHECK(model.graphs_cached(0) == 0);

  // classify: normalize -> forward -> argmax, only labels come back.
  const auto px = pixels(items, shape.input);
  auto d_px = upload(px, s);
  cu::device_buffer<std::uint32_t> d_labels{items};
  model.classify(d_px.span(), d_labels.span(), items, s, 0);
  const auto labels = download(d_labels, items, s);
  std::vector<float> xn(px.size());
  cm::normalize_ref(px, xn, model.options().norm);
  const auto ref_logits = ref.forward(xn, items);
  check_labels(labels, ref_logits, shape.classes, 2 * tolerance(p) * max_abs(ref_logits));

  // classify from inputs normalized on the CPU: forward -> argmax.
  auto d_xn = upload(xn, s);
  for (int rep = 0; rep < 2; ++rep) {  // the second call replays the graph
    model.classify(d_xn.span(), d_labels.span(), items, s, 0);
    check_labels(download(d_labels, items, s), ref_logits, shape.classes,
                 2 * tolerance(p) * max_abs(ref_logits));
  }

  CHECK_THROWS_AS(model.forward(d_x.span(), d_y.span(), 129, s, 0), conveyor::config_error);
  CHECK_THROWS_AS(model.forward(d_x.span(), d_y.span(), items, s, 2), conveyor::config_error);
}

TEST_CASE("models gpu: graphs are cached per batch bucket") {
  const cm::mlp_shape shape{.input = 64, .hidden = 64, .layers = 3, .classes = 8};
  cm::mlp model{{.shape = shape, .lanes = 1, .max_items = 32, .cuda_graphs = true}};
  cm::mlp plain{{.shape = shape, .lanes = 1, .max_items = 32}};
  cu::stream s;
  model.bind(0, s);
  const auto px = pixels(32, shape.input);
  auto d_px = upload(px, s);
  cu::device_buffer<std::uint32_t> a{32}, b{32};
  for (std::size_t items : {32u, 7u, 32u, 7u, 1u}) {
    model.classify(d_px.span(), a.span(), items, s, 0);
    plain.classify(d_px.span(), b.span(), items, s, 0);
    CHECK(download(a, items, s) == download(b, items, s));
  }
  CHECK(model.graphs_cached(0) == 3);
  CHECK_THROWS_AS(cm::mlp({.lanes = 0}), conveyor::config_error);
  CHECK_THROWS_AS(cm::mlp({.max_items = 0}), conveyor::config_error);
  CHECK_THROWS_AS(cm::mlp({.cuda_graphs = true, .workspace_bytes = 0}), conveyor::config_error);
}

TEST_CASE("models gpu: graphs replay per bucket, within the cache's capacity") {
  const cm::mlp_shape shape{.input = 64, .hidden = 64, .layers = 3, .classes = 8};
  cm::mlp model{{.shape = shape,
                 .lanes = 1,
                 .max_items = 64,
                 .cuda_graphs = true,
                 .graph_cache_capacity = 2}};
  cm::mlp plain{{.shape = shape, .lanes = 1, .max_items = 64}};
  cu::stream s;
  model.bind(0, s);
  const auto px = pixels(64, shape.input);
  auto d_px = upload(px, s);
  std::vector<float> x(64 * shape.input);
  for (float& v : x) v = next_float() * 0.5f;
  auto d_x = upload(x, s);
  cu::device_buffer<std::uint32_t> a{64}, b{64};
  cu::device_buffer<float> ya{64 * shape.classes}, yb{64 * shape.classes};
  // 5..8 share the bucket of 8: one capture, then replays; padding rows never leak out.
  for (std::size_t items : {5u, 6u, 7u, 8u}) {
    CAPTURE(items);
    model.classify(d_px.span(), a.span(), items, s, 0);
    plain.classify(d_px.span(), b.span(), items, s, 0);
    CHECK(download(a, items, s) == download(b, items, s));
  }
  cm::graph_cache_stats st = model.graph_stats();
  CHECK(st.misses == 1);
  CHECK(st.captures == 1);
  CHECK(st.hits == 3);
  // Three more buckets through a cache of 2: the least recently used go.
  for (std::size_t items : {1u, 20u, 64u, 3u}) {
    CAPTURE(items);
    model.forward(d_x.span(), ya.span(), items, s, 0);
    plain.forward(d_x.span(), yb.span(), items, s, 0);
    const auto got = download(ya, items * shape.classes, s);
    const auto want = download(yb, items * shape.classes, s);
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      REQUIRE(std::abs(got[i] - want[i]) <= 1e-4f * (1.0f + std::abs(want[i])));
    }
  }
  st = model.graph_stats();
  CHECK(st.captures == 5);
  CHECK(st.evictions == 3);
  CHECK(st.cached == 2);
  CHECK(model.graphs_cached(0) == 2);
  CHECK(plain.graph_stats().misses == 0);
  CHECK_THROWS_AS(cm::mlp({.cuda_graphs = true, .graph_cache_capacity = 0}),
                  conveyor::config_error);
}

// The model as a gpu segment's compute step: 2 lanes on the device list {0, 0}, dynamic
// batches, labels by the argmax kernel or by Thrust, with and without graphs.
TEST_CASE("models gpu: the MLP in a conveyor pipeline matches the reference") {
  using R = cu::runtime;
  const cm::mlp_shape shape{.input = 128, .hidden = 128, .layers = 3, .classes = 10};
  const std::size_t max_batch = 32, items = 3000;
  const auto labels_by = GENERATE(cm::label_method::kernel, cm::label_method::thrust);
  const bool graphs = GENERATE(true, false);
  CAPTURE(labels_by == cm::label_method::thrust, graphs);
  cm::mlp model{{.shape = shape,
                 .prec = cm::precision::fp32,
                 .lanes = 2,
                 .max_items = max_batch,
                 .cuda_graphs = graphs,
                 .labels = labels_by}};
  struct image {
    std::uint64_t id;
    std::vector<std::uint8_t> px;
  };
  auto segment = conveyor::gpu<R, std::uint8_t, std::uint32_t>(
      {.lanes = 2, .in_elems = max_batch * shape.input, .out_elems = max_batch, .devices = {0, 0}},
      [&](std::vector<image>& b, R::pinned_span<std::uint8_t> dst) {
        for (std::size_t i = 0; i < b.size(); ++i)
          std::copy(b[i].px.begin(), b[i].px.end(),
                    dst.begin() + static_cast<std::ptrdiff_t>(i * shape.input));
        return b.size() * shape.input;
      },
      [&](conveyor::lane_batch<R, std::uint8_t, std::uint32_t>& l) {
        model.classify(l.in, l.out, l.items, l.stream, l.lane);
        return l.items;
      },
      [](std::vector<image>&& b, R::pinned_span<const std::uint32_t> labels) {
        std::vector<std::pair<std::uint64_t, std::uint32_t>> r;
        for (std::size_t i = 0; i < b.size(); ++i) r.emplace_back(b[i].id, labels[i]);
        return r;
      });
  // Each lane's cuBLAS handle is made on its stream now, not mid-run (where its
  // workspace allocation would synchronize the device under the other lane's capture).
  segment.streams([&model](std::size_t lane) {
    cu::stream s;
    model.bind(lane, s);
    return s;
  });
  std::vector<std::pair<std::uint64_t, std::uint32_t>> got;
  conveyor::pipeline p{
      conveyor::source([i = std::uint64_t{0}, items, &shape]() mutable -> std::optional<image> {
        if (i == items) return std::nullopt;
        image im{i, std::vector<std::uint8_t>(shape.input)};
        cm::make_pixels(i++, im.px);
        return im;
      }) |
      conveyor::batch(max_batch).max_delay(std::chrono::microseconds(300)) | std::move(segment) |
      conveyor::unbatch() |
      conveyor::sink([&](std::pair<std::uint64_t, std::uint32_t> r) { got.push_back(r); })};
  const conveyor::report rep = p.run();
  REQUIRE(rep.completed == items);
  REQUIRE(got.size() == items);
  const cm::reference_mlp ref{cm::make_weights(shape, model.options().seed), cm::precision::fp32};
  const auto px = pixels(items, shape.input);
  std::vector<float> xn(px.size());
  cm::normalize_ref(px, xn, model.options().norm);
  const auto ref_logits = ref.forward(xn, items);
  std::vector<std::uint32_t> labels(items);
  for (std::size_t i = 0; i < items; ++i) {
    REQUIRE(got[i].first == i);
    labels[i] = got[i].second;
  }
  check_labels(labels, ref_logits, shape.classes, 1e-4 * max_abs(ref_logits));
}
