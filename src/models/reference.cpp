// The CPU references of the example model (see conveyor_models/reference.hpp). Plain C++:
// this file is the whole of conveyor_models_ref, which builds without CUDA.
#include "conveyor_models/reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "conveyor/base/config.hpp"

namespace conveyor_models {
namespace {

constexpr std::size_t max_dim = std::size_t{1} << 20;

std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [-a, a), from the top 24 bits (exact in float).
float uniform(std::uint64_t& state, float a) noexcept {
  const float u = static_cast<float>(splitmix64(state) >> 40) * (1.0f / 16777216.0f);
  return (2.0f * u - 1.0f) * a;
}

void check_size(std::size_t have, std::size_t need, const char* what) {
  CONVEYOR_EXPECTS(have >= need, std::string(what) + ": span holds " + std::to_string(have) +
                                     " elements but " + std::to_string(need) +
                                     " are needed; pass a larger span or fewer items");
}

// y[i * n + o] = bias[o] + sum_k x[i * k_dim + k] * w[o * k_dim + k], then ReLU if asked.
// Eight partial sums in a fixed order: deterministic, and the compiler can vectorize it.
void dense(const float* x, const float* w, const float* bias, float* y, std::size_t items,
           std::size_t k_dim, std::size_t n, bool relu) noexcept {
  for (std::size_t i = 0; i < items; ++i) {
    const float* xi = x + i * k_dim;
    for (std::size_t o = 0; o < n; ++o) {
      const float* wo = w + o * k_dim;
      float acc[8] = {};
      std::size_t k = 0;
      for (; k + 8 <= k_dim; k += 8)
        for (std::size_t j = 0; j < 8; ++j) acc[j] += xi[k + j] * wo[k + j];
      for (; k < k_dim; ++k) acc[0] += xi[k] * wo[k];
      float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      sum += bias[o];
      y[i * n + o] = relu ? std::max(sum, 0.0f) : sum;
    }
  }
}

}  // namespace

std::size_t mlp_shape::max_width() const noexcept { return std::max({input, hidden, classes}); }

void validate(const mlp_shape& s) {
  CONVEYOR_EXPECTS(s.layers >= 1 && s.layers <= 64,
                   "mlp_shape: layers must be in [1, 64], got " + std::to_string(s.layers));
  CONVEYOR_EXPECTS(s.input >= 1 && s.input <= max_dim && s.classes >= 1 && s.classes <= max_dim &&
                       (s.layers == 1 || (s.hidden >= 1 && s.hidden <= max_dim)),
                   "mlp_shape: input, hidden and classes must be in [1, 2^20]");
}

mlp_weights make_weights(const mlp_shape& shape, std::uint64_t seed) {
  validate(shape);
  mlp_weights m{shape, {}, {}};
  std::uint64_t state = seed;
  for (std::size_t l = 0; l < shape.layers; ++l) {
    const std::size_t in = shape.in_features(l), out = shape.out_features(l);
    const float a = std::sqrt(6.0f / static_cast<float>(in));
    std::vector<float> w(in * out), b(out);
    for (float& x : w) x = uniform(state, a);
    for (float& x : b) x = uniform(state, 0.1f);
    m.w.push_back(std::move(w));
    m.b.push_back(std::move(b));
  }
  return m;
}

mlp_weights weights_of(const mlp_options& o) {
  if (!o.weights) return make_weights(o.shape, o.seed);
  const mlp_shape& a = o.weights->shape;
  const mlp_shape& b = o.shape;
  CONVEYOR_EXPECTS(
      a.input == b.input && a.hidden == b.hidden && a.layers == b.layers && a.classes == b.classes,
      "mlp_options: the weights are of another shape than mlp_options::shape; set "
      "shape = weights->shape (trained_mlp::options() does)");
  return *o.weights;
}

// ---- precision emulation ------------------------------------------------------------

std::uint16_t to_fp16_bits(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t a = bits & 0x7fffffffu;
  if (a >= 0x7f800000u)
    return static_cast<std::uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal half, in units of 2^-24. The product is exact, and
    // nearbyint rounds to nearest even; 1024 units is the smallest normal's encoding.
    const float units = std::nearbyint(std::bit_cast<float>(a) * 16777216.0f);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(units));
  }
  const std::uint32_t mant = a & 0x7fffffu;
  const std::uint32_t exp = (a >> 23) - 127 + 15;
  std::uint32_t h = (exp << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry bumps the exponent
  return static_cast<std::uint16_t>(sign | h);
}

float from_fp16_bits(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

std::uint16_t to_bf16_bits(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float from_bf16_bits(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

float round_to_tf32(float x) noexcept {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;  // inf, nan
  bits += 0xfffu + ((bits >> 13) & 1u);
  return std::bit_cast<float>(bits & 0xffffe000u);
}

float round_to(precision p, float x) noexcept {
  switch (p) {
    case precision::fp32:
      return x;
    case precision::tf32:
      return round_to_tf32(x);
    case precision::fp16:
      return from_fp16_bits(to_fp16_bits(x));
    case precision::bf16:
      return from_bf16_bits(to_bf16_bits(x));
  }
  return x;
}

// ---- kernels' references --------------------------------------------------------------

void normalize_ref(std::span<const std::uint8_t> in, std::span<float> out, normalize_params p) {
  check_size(out.size(), in.size(), "normalize_ref output");
  CONVEYOR_EXPECTS(p.stddev > 0.0f, "normalize_params: stddev must be > 0");
  const float scale = 1.0f / 255.0f, inv_std = 1.0f / p.stddev;
  for (std::size_t i = 0; i < in.size(); ++i)
    out[i] = (static_cast<float>(in[i]) * scale - p.mean) * inv_std;
}

void argmax_rows_ref(std::span<const float> scores, std::size_t rows, std::size_t cols,
                     std::span<std::uint32_t> out) {
  CONVEYOR_EXPECTS(cols >= 1, "argmax_rows_ref: cols must be >= 1");
  check_size(scores.size(), rows * cols, "argmax_rows_ref scores");
  check_size(out.size(), rows, "argmax_rows_ref output");
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = scores.data() + r * cols;
    out[r] = static_cast<std::uint32_t>(std::max_element(row, row + cols) - row);
  }
}

void topk_rows_ref(std::span<const float> scores, std::size_t rows, std::size_t cols, std::size_t k,
                   std::span<std::uint32_t> out) {
  CONVEYOR_EXPECTS(k >= 1 && k <= cols, "topk_rows_ref: k must be in [1, cols]");
  check_size(scores.size(), rows * cols, "topk_rows_ref scores");
  check_size(out.size(), rows * k, "topk_rows_ref output");
  std::vector<std::uint32_t> idx(cols);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = scores.data() + r * cols;
    std::iota(idx.begin(), idx.end(), 0u);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                      [row](std::uint32_t a, std::uint32_t b) {
                        return row[a] > row[b] || (row[a] == row[b] && a < b);
                      });
    std::copy_n(idx.begin(), k, out.begin() + static_cast<std::ptrdiff_t>(r * k));
  }
}

// ---- reference_mlp --------------------------------------------------------------------

reference_mlp::reference_mlp(mlp_weights w, precision p) : w_(std::move(w)), p_(p) {
  validate(w_.shape);
  CONVEYOR_EXPECTS(w_.w.size() == w_.shape.layers && w_.b.size() == w_.shape.layers,
                   "reference_mlp: weights need one matrix and one bias per layer");
  for (std::size_t l = 0; l < w_.shape.layers; ++l) {
    CONVEYOR_EXPECTS(w_.w[l].size() == w_.shape.in_features(l) * w_.shape.out_features(l) &&
                         w_.b[l].size() == w_.shape.out_features(l),
                     "reference_mlp: layer " + std::to_string(l) +
                         "'s weights do not match the shape; build them with make_weights");
    for (float& x : w_.w[l]) x = round_to(p_, x);
  }
}

std::size_t reference_mlp::scratch_floats(std::size_t items) const noexcept {
  // two activation buffers (ping-pong), the normalized input and the logits
  const mlp_shape& s = w_.shape;
  return items * (2 * s.max_width() + s.input + s.classes);
}

void reference_mlp::forward(std::span<const float> in, std::span<float> out, std::size_t items,
                            std::span<float> scratch) const {
  const mlp_shape& s = w_.shape;
  check_size(in.size(), items * s.input, "reference_mlp::forward input");
  check_size(out.size(), items * s.classes, "reference_mlp::forward output");
  check_size(scratch.size(), 2 * items * s.max_width(), "reference_mlp::forward scratch");
  float* act[2] = {scratch.data(), scratch.data() + items * s.max_width()};
  // The first layer's input, rounded to the storage format (the GPU converts it too).
  for (std::size_t i = 0; i < items * s.input; ++i) act[0][i] = round_to(p_, in[i]);
  int cur = 0;
  for (std::size_t l = 0; l < s.layers; ++l) {
    const bool last = l + 1 == s.layers;
    float* y = last ? out.data() : act[1 - cur];
    const std::size_t n = s.out_features(l);
    dense(act[cur], w_.w[l].data(), w_.b[l].data(), y, items, s.in_features(l), n, !last);
    if (!last) {
      for (std::size_t i = 0; i < items * n; ++i) y[i] = round_to(p_, y[i]);  // stored at p
      cur = 1 - cur;
    }
  }
}

std::vector<float> reference_mlp::forward(std::span<const float> in, std::size_t items) const {
  std::vector<float> out(items * w_.shape.classes), scratch(scratch_floats(items));
  forward(in, out, items, scratch);
  return out;
}

void reference_mlp::classify(std::span<const std::uint8_t> pixels, normalize_params norm,
                             std::span<std::uint32_t> labels, std::size_t items,
                             std::span<float> scratch) const {
  const mlp_shape& s = w_.shape;
  check_size(pixels.size(), items * s.input, "reference_mlp::classify pixels");
  check_size(labels.size(), items, "reference_mlp::classify labels");
  check_size(scratch.size(), scratch_floats(items), "reference_mlp::classify scratch");
  const std::span<float> x = scratch.subspan(0, items * s.input);
  normalize_ref(pixels.first(items * s.input), x, norm);
  classify(x, labels, items, scratch.subspan(items * s.input));
}

void reference_mlp::classify(std::span<const float> normalized, std::span<std::uint32_t> labels,
                             std::size_t items, std::span<float> scratch) const {
  const mlp_shape& s = w_.shape;
  check_size(normalized.size(), items * s.input, "reference_mlp::classify inputs");
  check_size(labels.size(), items, "reference_mlp::classify labels");
  check_size(scratch.size(), scratch_floats(items) - items * s.input,
             "reference_mlp::classify scratch");
  const std::span<float> logits = scratch.subspan(0, items * s.classes);
  const std::span<float> rest = scratch.subspan(items * s.classes);
  forward(normalized.first(items * s.input), logits, items, rest);
  argmax_rows_ref(logits, items, s.classes, labels);
}

void make_pixels(std::uint64_t id, std::span<std::uint8_t> out) noexcept {
  std::uint64_t state = id * 0x2545f4914f6cdd1dULL + 1;
  std::uint64_t r = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (i % 8 == 0) r = splitmix64(state);
    out[i] = static_cast<std::uint8_t>(r >> (8 * (i % 8)));
  }
}

}  // namespace conveyor_models
