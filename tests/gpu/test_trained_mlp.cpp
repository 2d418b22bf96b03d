// The trained example MLP (data/fashion_mlp.bin) on the GPU: the cuBLAS model built from
// the weights file gives the CPU reference's labels (a near-tie may fall either way at a
// reduced precision), on Fashion-MNIST's test images when the data set is installed, on
// deterministic pixels otherwise.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "conveyor/runtime/cuda/runtime.hpp"
#include "conveyor_models/fashion_mnist.hpp"
#include "conveyor_models/mlp.hpp"
#include "conveyor_models/mlp_file.hpp"
#include "conveyor_models/reference.hpp"

namespace cm = conveyor_models;
namespace cu = conveyor::cuda;

TEST_CASE("models gpu: the trained MLP from its file gives the CPU reference's labels") {
  const cm::precision p =
      GENERATE(cm::precision::fp32, cm::precision::tf32, cm::precision::fp16, cm::precision::bf16);
  CAPTURE(cm::to_string(p));
  const cm::trained_mlp trained = cm::load_mlp(cm::default_mlp_path());
  const std::size_t items = 512, n = trained.shape().input;
  std::vector<std::uint8_t> px(items * n);
  // The test set where Debian's package puts it, or where CONVEYOR_FASHION_MNIST_DIR
  // says (a GPU machine gets copied files); else the synthetic images.
  const char* env = std::getenv("CONVEYOR_FASHION_MNIST_DIR");
  const std::string dir = env != nullptr ? env : std::string(cm::fashion_mnist_default_dir);
  std::error_code ec;
  const bool real =
      std::filesystem::exists(cm::fashion_mnist_path(dir, cm::split::test, false), ec);
  if (real) {
    const cm::image_set test = cm::load_fashion_mnist(dir, cm::split::test);
    std::copy_n(test.pixels.begin(), px.size(), px.begin());
  } else {
    for (std::size_t i = 0; i < items; ++i) cm::make_pixels(i, std::span(px).subspan(i * n, n));
  }
  CAPTURE(real);

  cm::mlp_options o = trained.options();
  o.prec = p;
  o.max_items = items;
  cm::mlp model{o};
  cu::stream s;
  cu::pinned_buffer<std::uint8_t> h_px{px.size()};
  std::copy(px.begin(), px.end(), h_px.data());
  cu::device_buffer<std::uint8_t> d_px{px.size()};
  cu::device_buffer<std::uint32_t> d_labels{items};
  cu::pinned_buffer<std::uint32_t> h_labels{items};
  copy_async(d_px.span(), h_px.span(), s);
  model.classify(d_px.span(), d_labels.span(), items, s, 0);
  copy_async(h_labels.span(), cu::device_span<const std::uint32_t>(d_labels.span()), s);
  s.synchronize();

  const cm::reference_mlp ref{*trained.weights, p};
  std::vector<float> x(px.size());
  cm::normalize_ref(px, x, trained.norm);
  const std::vector<float> logits = ref.forward(x, items);
  double scale = 1.0;  // the largest logit's magnitude: what the tolerances are relative to
  for (float v : logits) scale = std::max(scale, static_cast<double>(std::abs(v)));
  // What each precision's rounding and another accumulation order move a logit by (as
  // test_models.cpp), twice: a near-tie may fall either way.
  const double tol = 2 *
                     (p == cm::precision::fp32   ? 1e-4
                      : p == cm::precision::bf16 ? 4e-2
                                                 : 1e-2) *
                     scale;
  for (std::size_t i = 0; i < items; ++i) {
    const float* row = logits.data() + i * 10;
    const float best = *std::max_element(row, row + 10);
    CAPTURE(i, h_labels.data()[i]);
    REQUIRE(h_labels.data()[i] < 10);
    REQUIRE(static_cast<double>(best - row[h_labels.data()[i]]) <= tol);
  }
}
