// The example model's CPU references (conveyor_models_ref) against hand-computed cases,
// and the host-runtime model (cpu_mlp) inside a real conveyor pipeline, where it must
// match the reference bit for bit.
#include <catch2/catch.hpp>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor_models/cpu_mlp.hpp"
#include "conveyor_models/reference.hpp"

namespace cm = conveyor_models;

namespace {

// A 2-2-2 MLP with weights small enough to do by hand.
cm::mlp_weights tiny_weights() {
  cm::mlp_weights w{{.input = 2, .hidden = 2, .layers = 2, .classes = 2}, {}, {}};
  w.w = {{1.0f, -1.0f, 2.0f, 0.5f}, {1.0f, 1.0f, -1.0f, 2.0f}};
  w.b = {{0.0f, -1.0f}, {0.5f, 0.0f}};
  return w;
}

// y = x * 1 + 0: one weight, to see how the input is rounded at each precision.
cm::mlp_weights identity_weights() {
  cm::mlp_weights w{{.input = 1, .hidden = 1, .layers = 1, .classes = 1}, {{1.0f}}, {{0.0f}}};
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("models reference: normalize maps 0 / 255 / mean to -mean/std / (1-mean)/std / 0") {
  const std::vector<std::uint8_t> px{0, 255, 51, 128};
  std::vector<float> out(px.size());
  cm::normalize_ref(px, out, {.mean = 0.5f, .stddev = 0.25f});
  CHECK(out[0] == Approx(-2.0f).margin(1e-6));
  CHECK(out[1] == Approx(2.0f).margin(1e-6));
  CHECK(out[2] == Approx(-1.2f).margin(1e-6));  // 51 / 255 = 0.2
  CHECK(out[3] == Approx((128.0f / 255.0f - 0.5f) * 4.0f).margin(1e-6));
  std::vector<float> small(2);
  CHECK_THROWS_AS(cm::normalize_ref(px, small, {}), conveyor::config_error);
  CHECK_THROWS_AS(cm::normalize_ref(px, out, {.mean = 0.0f, .stddev = 0.0f}),
                  conveyor::config_error);
}

TEST_CASE("models reference: argmax per row, ties to the lowest index") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> s{1, 3, 2, 5, 5, 1, -1, -2, -0.5f, -inf, -inf, -inf};
  std::vector<std::uint32_t> out(4);
  cm::argmax_rows_ref(s, 4, 3, out);
  CHECK(out == std::vector<std::uint32_t>{1, 0, 2, 0});
  CHECK_THROWS_AS(cm::argmax_rows_ref(s, 5, 3, out), conveyor::config_error);
}

TEST_CASE("models reference: top-k per row, by score then by index") {
  const std::vector<float> s{0.1f, 0.9f, 0.5f, 0.9f, 4, 3, 2, 1};
  std::vector<std::uint32_t> out(6);
  cm::topk_rows_ref(s, 2, 4, 3, out);
  CHECK(out == std::vector<std::uint32_t>{1, 3, 2, 0, 1, 2});
  std::vector<std::uint32_t> one(2);
  cm::topk_rows_ref(s, 2, 4, 1, one);
  CHECK(one == std::vector<std::uint32_t>{1, 0});
  CHECK_THROWS_AS(cm::topk_rows_ref(s, 2, 4, 5, out), conveyor::config_error);
  CHECK_THROWS_AS(cm::topk_rows_ref(s, 2, 4, 0, out), conveyor::config_error);
}

TEST_CASE("models reference: fp16 / bf16 / tf32 rounding, to nearest even") {
  const float ulp11 = std::ldexp(1.0f, -11), ulp9 = std::ldexp(1.0f, -9);
  CHECK(cm::to_fp16_bits(1.0f) == 0x3c00);
  CHECK(cm::to_fp16_bits(-2.0f) == 0xc000);
  CHECK(cm::to_fp16_bits(65504.0f) == 0x7bff);  // largest half
  CHECK(cm::to_fp16_bits(65519.0f) == 0x7bff);
  CHECK(cm::to_fp16_bits(65520.0f) == 0x7c00);               // tie to even: inf
  CHECK(cm::to_fp16_bits(1.0f + ulp11) == 0x3c00);           // tie: down to even
  CHECK(cm::to_fp16_bits(1.0f + 3 * ulp11) == 0x3c02);       // tie: up to even
  CHECK(cm::to_fp16_bits(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(cm::to_fp16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie: to zero (even)
  CHECK(cm::to_fp16_bits(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 units: to 2
  CHECK(cm::to_fp16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(cm::from_fp16_bits(0x3555) == Approx(0.33325195f).epsilon(1e-7));
  // Every finite or infinite half survives the round trip through float.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) continue;  // NaN payloads
    const auto bits = static_cast<std::uint16_t>(h);
    if (cm::to_fp16_bits(cm::from_fp16_bits(bits)) != bits)
      FAIL("half " << h << " does not round-trip");
  }
  CHECK(std::isnan(cm::from_fp16_bits(cm::to_fp16_bits(std::numeric_limits<float>::quiet_NaN()))));

  CHECK(cm::to_bf16_bits(1.0f) == 0x3f80);
  CHECK(cm::to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);  // tie: down to even
  CHECK(cm::to_bf16_bits(1.0f + std::ldexp(3.0f, -8)) == 0x3f82);  // tie: up to even
  CHECK(cm::from_bf16_bits(0xc040) == -3.0f);
  CHECK(std::isnan(cm::from_bf16_bits(cm::to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));

  CHECK(cm::round_to_tf32(1.0f + ulp11) == 1.0f);
  CHECK(cm::round_to_tf32(1.0f + 3 * ulp11) == 1.0f + ulp9);
  CHECK(cm::round_to(cm::precision::fp32, 1.0f + ulp11) == 1.0f + ulp11);
  CHECK(cm::round_to(cm::precision::fp16, 1.0f + ulp9) == 1.0f + ulp9);
  CHECK(cm::round_to(cm::precision::bf16, 1.0f + ulp9) == 1.0f);
}

TEST_CASE("models reference: a 2-2-2 MLP computed by hand") {
  const cm::reference_mlp ref{tiny_weights(), cm::precision::fp32};
  // item 0: h = relu(3 - 1, 6 + 0.5 - 1) = (2, 5.5); y = (2 + 5.5 + 0.5, -2 + 11) = (8, 9)
  // item 1: h = relu(-1 - 2, -2 + 1 - 1) = (0, 0); y = (0.5, 0): ReLU hid both
  const std::vector<float> x{3, 1, -1, 2};
  CHECK(ref.forward(x, 2) == std::vector<float>{8.0f, 9.0f, 0.5f, 0.0f});
  // The same at every precision: all values are exact in 16 bits.
  for (auto p : {cm::precision::tf32, cm::precision::fp16, cm::precision::bf16}) {
    CAPTURE(cm::to_string(p));
    CHECK(cm::reference_mlp{tiny_weights(), p}.forward(x, 2) == std::vector<float>{8, 9, 0.5f, 0});
  }
  std::vector<float> out(3), scratch(ref.scratch_floats(2));
  CHECK_THROWS_AS(ref.forward(x, out, 2, scratch), conveyor::config_error);
}

TEST_CASE("models reference: each precision rounds the layer input to its storage format") {
  const float a = 1.0f + std::ldexp(1.0f, -11), b = 1.0f + std::ldexp(1.0f, -9);
  const std::vector<float> x{a, b};
  using P = cm::precision;
  CHECK(cm::reference_mlp{identity_weights(), P::fp32}.forward(x, 2) == std::vector<float>{a, b});
  CHECK(cm::reference_mlp{identity_weights(), P::tf32}.forward(x, 2) ==
        std::vector<float>{1.0f, b});
  CHECK(cm::reference_mlp{identity_weights(), P::fp16}.forward(x, 2) ==
        std::vector<float>{1.0f, b});
  CHECK(cm::reference_mlp{identity_weights(), P::bf16}.forward(x, 2) ==
        std::vector<float>{1.0f, 1.0f});
}

TEST_CASE("models reference: classify is normalize, then forward, then argmax") {
  const cm::mlp_shape shape{.input = 20, .hidden = 12, .layers = 3, .classes = 5};
  const cm::reference_mlp ref{cm::make_weights(shape, 7), cm::precision::fp32};
  const std::size_t items = 9;
  std::vector<std::uint8_t> px(items * shape.input);
  for (std::size_t i = 0; i < items; ++i)
    cm::make_pixels(i, std::span(px).subspan(i * shape.input, shape.input));
  std::vector<float> x(px.size());
  cm::normalize_ref(px, x, {});
  const std::vector<float> logits = ref.forward(x, items);
  std::vector<std::uint32_t> want(items), got(items);
  cm::argmax_rows_ref(logits, items, shape.classes, want);
  std::vector<float> scratch(ref.scratch_floats(items));
  ref.classify(px, {}, got, items, scratch);
  CHECK(got == want);
  // From inputs normalized on the CPU: the same labels, and it needs no room for them.
  std::vector<std::uint32_t> from_floats(items);
  std::vector<float> less(ref.scratch_floats(items) - items * shape.input);
  ref.classify(std::span<const float>(x), from_floats, items, less);
  CHECK(from_floats == want);
  std::vector<float> too_small(less.size() - 1);
  CHECK_THROWS_AS(ref.classify(std::span<const float>(x), from_floats, items, too_small),
                  conveyor::config_error);
}

TEST_CASE("models reference: weights are deterministic, bounded and shape-checked") {
  const cm::mlp_shape shape{.input = 30, .hidden = 16, .layers = 3, .classes = 4};
  const auto a = cm::make_weights(shape, 1), b = cm::make_weights(shape, 1),
             c = cm::make_weights(shape, 2);
  REQUIRE(a.w.size() == 3);
  CHECK(a.w[0].size() == 30 * 16);
  CHECK(a.w[1].size() == 16 * 16);
  CHECK(a.w[2].size() == 16 * 4);
  CHECK(a.w == b.w);
  CHECK(a.b == b.b);
  CHECK(a.w != c.w);
  for (float v : a.w[0]) REQUIRE(std::abs(v) <= std::sqrt(6.0f / 30.0f));
  CHECK_THROWS_AS(cm::make_weights({.input = 0}, 1), conveyor::config_error);
  CHECK_THROWS_AS(cm::make_weights({.layers = 0}, 1), conveyor::config_error);
  auto bad = a;
  bad.w[1].pop_back();
  CHECK_THROWS_AS(cm::reference_mlp(bad, cm::precision::fp32), conveyor::config_error);
}

TEST_CASE("models reference: cpu_mlp checks lane and batch size on the calling thread") {
  using R = conveyor::host::runtime;
  cm::cpu_mlp model{
      {.shape = {.input = 4, .hidden = 4, .layers = 2, .classes = 2}, .lanes = 1, .max_items = 2}};
  R::stream s;
  R::device_buffer<std::uint8_t> px{12};
  R::device_buffer<std::uint32_t> labels{3};
  CHECK_THROWS_AS(model.classify(px.span(), labels.span(), 2, s, 1), conveyor::config_error);
  CHECK_THROWS_AS(model.classify(px.span(), labels.span(), 3, s, 0), conveyor::config_error);
  CHECK_THROWS_AS(cm::cpu_mlp({.lanes = 0}), conveyor::config_error);
}

// The host-runtime model as the compute step of a gpu segment (2 lanes, jittered streams,
// dynamic batches of varying size): every item's logits and label equal the reference's,
// bit for bit, and arrive in order.
TEST_CASE("models reference: cpu_mlp in a conveyor pipeline matches the reference bit for bit") {
  using R = conveyor::host::runtime;
  const cm::precision prec =
      GENERATE(cm::precision::fp32, cm::precision::fp16, cm::precision::bf16);
  CAPTURE(cm::to_string(prec));
  const cm::mlp_shape shape{.input = 48, .hidden = 32, .layers = 3, .classes = 7};
  constexpr std::size_t max_batch = 16, items = 600, lanes = 2;
  cm::cpu_mlp model{
      {.shape = shape, .prec = prec, .seed = 5, .lanes = lanes, .max_items = max_batch}};

  struct result {
    std::uint64_t id;
    std::uint32_t label;
    std::vector<float> logits;
  };
  struct image {
    std::uint64_t id;
    std::vector<std::uint8_t> px;
  };
  const std::size_t out_per_item = 1 + shape.classes;  // label bits, then the logits
  auto segment = conveyor::gpu<R, std::uint8_t, float>(
      {.lanes = lanes,
       .slots_per_lane = 2,
       .in_elems = max_batch * shape.input,
       .out_elems = max_batch * (out_per_item + shape.input),
       .name = "mlp"},  // + x below
      [&](std::vector<image>& b, R::pinned_span<std::uint8_t> dst) {
        for (std::size_t i = 0; i < b.size(); ++i)
          std::copy(b[i].px.begin(), b[i].px.end(),
                    dst.begin() + static_cast<std::ptrdiff_t>(i * shape.input));
        return b.size() * shape.input;
      },
      [&](conveyor::lane_batch<R, std::uint8_t, float>& l) {
        // Labels go to the front of the output (as uint32 bits), logits after them.
        const std::size_t n = l.items;
        auto labels = R::device_span<std::uint32_t>::from_native(
            reinterpret_cast<std::uint32_t*>(l.out.data()), n);
        model.classify(l.in, labels, n, l.stream, l.lane);
        // forward needs the normalized input: normalize on the stream, into the logits'
        // tail, which is free until forward writes there.
        auto x = l.out.subspan(n + n * shape.classes, n * shape.input);
        l.stream.enqueue([in = l.in, x, norm = model.options().norm] {
          cm::normalize_ref(in.unsafe_host(), x.unsafe_host(), norm);
        });
        model.forward(x, l.out.subspan(n, n * shape.classes), n, l.stream, l.lane);
        return n * out_per_item;
      },
      [&](std::vector<image>&& b, R::pinned_span<const float> out) {
        std::vector<result> r;
        const std::size_t n = b.size();
        for (std::size_t i = 0; i < n; ++i) {
          std::uint32_t label = 0;
          std::memcpy(&label, &out[i], sizeof label);
          r.push_back(
              {b[i].id, label,
               std::vector<float>(
                   out.begin() + static_cast<std::ptrdiff_t>(n + i * shape.classes),
                   out.begin() + static_cast<std::ptrdiff_t>(n + (i + 1) * shape.classes))});
        }
        return r;
      });
  segment.streams([](std::size_t lane) {
    return conveyor::host::stream{conveyor::host::jitter{lane + 11, std::chrono::microseconds(30)}};
  });

  std::vector<result> got;
  conveyor::pipeline p{
      conveyor::source([i = std::uint64_t{0}, &shape]() mutable -> std::optional<image> {
        if (i == items) return std::nullopt;
        image im{i, std::vector<std::uint8_t>(shape.input)};
        cm::make_pixels(i++, im.px);
        return im;
      }) |
      conveyor::batch(max_batch).max_delay(std::chrono::microseconds(200)) | std::move(segment) |
      conveyor::unbatch() | conveyor::sink([&](result r) { got.push_back(std::move(r)); })};
  const conveyor::report rep = p.run();
  REQUIRE(rep.completed == items);
  REQUIRE(rep.produced == rep.completed + rep.failed + rep.cancelled);
  REQUIRE(got.size() == items);

  const cm::reference_mlp& ref = model.reference();
  std::vector<std::uint8_t> px(shape.input);
  std::vector<float> x(shape.input), scratch(ref.scratch_floats(1));
  for (std::size_t i = 0; i < items; ++i) {
    CAPTURE(i);
    REQUIRE(got[i].id == i);
    cm::make_pixels(i, px);
    cm::normalize_ref(px, x, model.options().norm);
    std::vector<float> want(shape.classes);
    ref.forward(x, want, 1, scratch);  // one item at a time: batching must not matter
    REQUIRE(same_bits(got[i].logits, want));
    std::uint32_t label = 0;
    ref.classify(px, model.options().norm, std::span(&label, 1), 1, scratch);
    REQUIRE(got[i].label == label);
  }
}
