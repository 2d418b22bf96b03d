// conveyor_models/kernels.hpp: the example model's CUDA kernels, behind plain host
// functions (callable from g++-compiled code; only kernels.cu needs nvcc).
//
//   namespace km = conveyor_models::kernels;
//   km::normalize_async(pixels, x, {.mean = 0.5f, .stddev = 0.25f}, s);   // uint8 -> float
//   km::argmax_rows_async(logits, items, classes, labels, s);            // one index per row
//   km::topk_rows_async(logits, items, classes, 5, top5, s);             // k indices per row
//
// Every function only enqueues on s and returns; none allocates or synchronizes, so all
// of them may be captured into a CUDA graph. Launch errors throw conveyor::cuda_error.
// Results match the references in reference.hpp: argmax ties go to the lowest index,
// top-k is ordered by score, ties by index.
// Thread-safety: stateless; stream ordering rules apply to the memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "conveyor/runtime/cuda/memory.hpp"
#include "conveyor/runtime/cuda/stream.hpp"
#include "conveyor_models/reference.hpp"

namespace conveyor_models::kernels {

// The widest row topk_rows accepts (one thread block sorts a row in shared memory).
inline constexpr std::size_t max_topk_cols = 1024;

// ---- raw launches (device pointers) ---------------------------------------------------

// out[i] = (in[i] / 255 - mean) / stddev for i < n.
void normalize(const std::uint8_t* in, float* out, std::size_t n, normalize_params p,
               cudaStream_t s);
// out[i] = in[i] rounded to p's 16-bit format (p is fp16 or bf16; out holds its bits).
void to_storage16(const float* in, std::uint16_t* out, std::size_t n, precision p, cudaStream_t s);
// out[r][c] = act(acc[r][c] + bias[c]), act = ReLU or identity, stored as float
// (p fp32/tf32) or as p's 16-bit format. rows x cols, row-major.
void bias_act(const float* acc, const float* bias, std::size_t rows, std::size_t cols, bool relu,
              void* out, precision p, cudaStream_t s);
// out[r] = argmax of row r; one warp per row.
void argmax_rows(const float* scores, std::size_t rows, std::size_t cols, std::uint32_t* out,
                 cudaStream_t s);
// out[r * k + j] = j-th best index of row r; cols <= max_topk_cols, 1 <= k <= cols.
void topk_rows(const float* scores, std::size_t rows, std::size_t cols, std::size_t k,
               std::uint32_t* out, cudaStream_t s);

// ---- span versions (size-checked: conveyor::config_error) -----------------------------

inline void normalize_async(conveyor::cuda::device_span<const std::uint8_t> in,
                            conveyor::cuda::device_span<float> out, normalize_params p,
                            conveyor::cuda::stream_ref s) {
  CONVEYOR_EXPECTS(out.size() >= in.size(), "normalize_async: out is smaller than in");
  CONVEYOR_EXPECTS(p.stddev > 0.0f, "normalize_async: stddev must be > 0");
  normalize(in.data(), out.data(), in.size(), p, s.native());
}

inline void argmax_rows_async(conveyor::cuda::device_span<const float> scores, std::size_t rows,
                              std::size_t cols, conveyor::cuda::device_span<std::uint32_t> out,
                              conveyor::cuda::stream_ref s) {
  CONVEYOR_EXPECTS(cols >= 1 && scores.size() >= rows * cols && out.size() >= rows,
                   "argmax_rows_async: need cols >= 1, rows * cols scores and rows outputs");
  argmax_rows(scores.data(), rows, cols, out.data(), s.native());
}

inline void topk_rows_async(conveyor::cuda::device_span<const float> scores, std::size_t rows,
                            std::size_t cols, std::size_t k,
                            conveyor::cuda::device_span<std::uint32_t> out,
                            conveyor::cuda::stream_ref s) {
  CONVEYOR_EXPECTS(
      cols >= 1 && cols <= max_topk_cols,
      "topk_rows_async: cols must be in [1, 1024]; use a segmented sort for wider rows");
  CONVEYOR_EXPECTS(k >= 1 && k <= cols, "topk_rows_async: k must be in [1, cols]");
  CONVEYOR_EXPECTS(scores.size() >= rows * cols && out.size() >= rows * k,
                   "topk_rows_async: need rows * cols scores and rows * k outputs");
  topk_rows(scores.data(), rows, cols, k, out.data(), s.native());
}

}  // namespace conveyor_models::kernels
