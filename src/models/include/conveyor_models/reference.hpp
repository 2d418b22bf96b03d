// conveyor_models/reference.hpp: the example model's pieces on the CPU: uint8 -> float
// normalization, an MLP forward pass (bias + ReLU between layers) at the precision the
// GPU runs it, row-wise argmax and top-k, and the seeded weights both sides share.
//
//   conveyor_models::mlp_shape shape{.input = 256, .hidden = 128, .layers = 3, .classes = 10};
//   conveyor_models::reference_mlp ref{conveyor_models::make_weights(shape, 42),
//                                      conveyor_models::precision::fp16};
//   std::vector<float> logits = ref.forward(inputs, items);           // items * classes
//   conveyor_models::argmax_rows_ref(logits, items, shape.classes, labels);
//
// These are what the GPU kernels are tested against, and what conveyor_models::cpu_mlp
// runs on the host runtime's streams. Plain C++ (library conveyor_models_ref): builds and
// runs without CUDA. At precision p, weights and every layer's input are rounded to p's
// storage format (tf32: the tensor cores' input rounding), products accumulate in float,
// the bias is added in float, and the last layer's output stays float: the same steps
// the cuBLAS path takes, so only the accumulation order differs.
// Thread-safety: free functions are pure; a const reference_mlp may be used from any
// number of threads, each with its own scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace conveyor_models {

// How the GEMMs store their inputs and what they compute in.
enum class precision {
  fp32,  // float storage, float math (CUBLAS_COMPUTE_32F)
  tf32,  // float storage, tensor cores round inputs to 10 mantissa bits (32F_FAST_TF32)
  fp16,  // half storage, float accumulation
  bf16,  // bfloat16 storage, float accumulation
};

constexpr std::string_view to_string(precision p) noexcept {
  switch (p) {
    case precision::fp32:
      return "fp32";
    case precision::tf32:
      return "tf32";
    case precision::fp16:
      return "fp16";
    case precision::bf16:
      return "bf16";
  }
  return "?";
}

// Bytes per stored weight / activation element at precision p.
constexpr std::size_t storage_bytes(precision p) noexcept {
  return p == precision::fp16 || p == precision::bf16 ? 2 : 4;
}

// layers GEMMs: input -> hidden -> ... -> hidden -> classes; ReLU after all but the last.
struct mlp_shape {
  std::size_t input = 256;
  std::size_t hidden = 128;
  std::size_t layers = 3;
  std::size_t classes = 10;

  std::size_t in_features(std::size_t layer) const noexcept { return layer == 0 ? input : hidden; }
  std::size_t out_features(std::size_t layer) const noexcept {
    return layer + 1 == layers ? classes : hidden;
  }
  // The widest activation a layer reads or writes.
  std::size_t max_width() const noexcept;
};

// @throws conveyor::config_error when a dimension is 0 or absurdly large.
void validate(const mlp_shape& s);

// Pixels x in [0, 255] become (x / 255 - mean) / stddev.
struct normalize_params {
  float mean = 0.5f;
  float stddev = 0.25f;
};

struct mlp_weights;

// Everything that defines a model instance; shared by reference_mlp, cpu_mlp and mlp.
enum class label_method { kernel, thrust };

struct mlp_options {
  mlp_shape shape{};
  precision prec = precision::fp32;
  normalize_params norm{};
  std::uint64_t seed = 42;      // weights: make_weights(shape, seed)
  std::size_t lanes = 1;        // per-lane state (scratch, cuBLAS handle): one per gpu lane
  std::size_t max_items = 256;  // the largest batch forward()/classify() accept
  bool cuda_graphs = false;     // mlp (CUDA) only: capture each batch shape once, replay it
  std::size_t graph_cache_capacity = 16;  // mlp with cuda_graphs: graphs kept per lane (LRU)
  std::size_t workspace_bytes = std::size_t{4} << 20;  // mlp (CUDA) only: cuBLAS workspace per lane
  // mlp (CUDA) only: how classify() turns logits into labels: the argmax kernel, or the
  // Thrust top-1 on the lane's stream (thrust_topk.hpp); the same labels either way.
  label_method labels = label_method::kernel;
  // Trained weights (load_mlp in mlp_file.hpp), whose shape must be `shape`; null: the
  // seeded random ones, make_weights(shape, seed).
  std::shared_ptr<const mlp_weights> weights{};
};

// Row-major weights: w[l] is out_features(l) x in_features(l), b[l] is out_features(l).
struct mlp_weights {
  mlp_shape shape;
  std::vector<std::vector<float>> w;
  std::vector<std::vector<float>> b;
};

// Deterministic He-uniform weights and small biases from a splitmix64 stream: the same
// (shape, seed) gives the same bits on every machine.
mlp_weights make_weights(const mlp_shape& shape, std::uint64_t seed);

// The weights o describes: *o.weights (checked against o.shape), or make_weights(o.shape,
// o.seed). @throws conveyor::config_error when o.weights has another shape.
mlp_weights weights_of(const mlp_options& o);

// ---- precision emulation (round to nearest, ties to even; what __float2half_rn does) ----
std::uint16_t to_fp16_bits(float x) noexcept;
float from_fp16_bits(std::uint16_t h) noexcept;
std::uint16_t to_bf16_bits(float x) noexcept;
float from_bf16_bits(std::uint16_t h) noexcept;
float round_to_tf32(float x) noexcept;
// x after being stored at precision p (fp32: x itself).
float round_to(precision p, float x) noexcept;

// ---- the kernels' references ----------------------------------------------------------

// out[i] = (in[i] / 255 - mean) / stddev, computed as the GPU kernel does.
// @throws conveyor::config_error when out is smaller than in.
void normalize_ref(std::span<const std::uint8_t> in, std::span<float> out, normalize_params p);

// out[r] = index of the largest of scores[r * cols .. r * cols + cols); ties: lowest index.
void argmax_rows_ref(std::span<const float> scores, std::size_t rows, std::size_t cols,
                     std::span<std::uint32_t> out);

// out[r * k + j] = index of the j-th largest score of row r; ties: lower index first.
void topk_rows_ref(std::span<const float> scores, std::size_t rows, std::size_t cols, std::size_t k,
                   std::span<std::uint32_t> out);

// The MLP forward pass on the CPU at one precision. Weights are rounded once, here.
class reference_mlp {
 public:
  // @throws conveyor::config_error when the weights do not match their shape.
  reference_mlp(mlp_weights w, precision p);

  const mlp_shape& shape() const noexcept { return w_.shape; }
  precision prec() const noexcept { return p_; }
  // The rounded weights this model computes with.
  const mlp_weights& weights() const noexcept { return w_; }

  // Floats of scratch that forward()/classify() need for `items` items.
  std::size_t scratch_floats(std::size_t items) const noexcept;

  // out[0 .. items * classes) = logits of in[0 .. items * input). Allocates nothing.
  // @throws conveyor::config_error when a span is too small.
  void forward(std::span<const float> in, std::span<float> out, std::size_t items,
               std::span<float> scratch) const;
  std::vector<float> forward(std::span<const float> in, std::size_t items) const;

  // normalize -> forward -> argmax: one label per item. Allocates nothing.
  void classify(std::span<const std::uint8_t> pixels, normalize_params norm,
                std::span<std::uint32_t> labels, std::size_t items, std::span<float> scratch) const;
  // forward -> argmax from inputs normalized already (on the CPU, by the caller).
  void classify(std::span<const float> normalized, std::span<std::uint32_t> labels,
                std::size_t items, std::span<float> scratch) const;

 private:
  mlp_weights w_;
  precision p_;
};

// Deterministic test/example input: item `id`'s n pixels.
void make_pixels(std::uint64_t id, std::span<std::uint8_t> out) noexcept;

}  // namespace conveyor_models
