// The example model's kernels (see conveyor_models/kernels.hpp).
#include "conveyor_models/kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_radix_sort.cuh>

#include "conveyor/runtime/cuda/check.hpp"

namespace conveyor_models::kernels {
namespace {

constexpr unsigned block = 256;

unsigned grid_for(std::size_t n, unsigned threads) {
  const std::size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);  // grid-stride loops do the rest
}

__global__ void normalize_kernel(const std::uint8_t* in, float* out, std::size_t n, float scale,
                                 float mean, float inv_std) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    // _rn: no contraction into an FMA, so the result is the reference's bit for bit.
    out[i] = __fmul_rn(__fsub_rn(__fmul_rn(static_cast<float>(in[i]), scale), mean), inv_std);
}

__device__ std::uint16_t store16(float x, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}

__global__ void to_storage16_kernel(const float* in, std::uint16_t* out, std::size_t n, bool bf16) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = store16(in[i], bf16);
}

// mode: 0 float, 1 fp16, 2 bf16
__global__ void bias_act_kernel(const float* acc, const float* bias, std::size_t rows,
                                std::size_t cols, bool relu, void* out, int mode) {
  const std::size_t n = rows * cols;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float y = __fadd_rn(acc[i], bias[i % cols]);
    if (relu) y = fmaxf(y, 0.0f);
    if (mode == 0)
      static_cast<float*>(out)[i] = y;
    else
      static_cast<std::uint16_t*>(out)[i] = store16(y, mode == 2);
  }
}

// One warp per row: each lane scans a strided part, then a shuffle reduction. Ties go to
// the lower index, as std::max_element's first maximum.
__global__ void argmax_kernel(const float* scores, std::size_t rows, std::size_t cols,
                              std::uint32_t* out) {
  const std::size_t warps_per_block = blockDim.x / 32;
  const std::size_t row = static_cast<std::size_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together: row is uniform within a warp
  const float* r = scores + row * cols;
  float best = -INFINITY;
  unsigned best_i = 0xffffffffu;
  for (std::size_t c = lane; c < cols; c += 32) {
    const float v = r[c];
    if (best_i == 0xffffffffu || v > best) {
      best = v;
      best_i = static_cast<unsigned>(c);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float v = __shfl_down_sync(0xffffffffu, best, offset);
    const unsigned i = __shfl_down_sync(0xffffffffu, best_i, offset);
    if (i != 0xffffffffu && (best_i == 0xffffffffu || v > best || (v == best && i < best_i))) {
      best = v;
      best_i = i;
    }
  }
  if (lane == 0) out[row] = best_i;
}

// One block per row: CUB's block radix sort orders (score, index) pairs, descending and
// stable (equal scores keep index order), in shared memory; the first k indices go out.
constexpr int topk_threads = 128;

template <int ItemsPerThread>
__global__ void topk_kernel(const float* scores, std::size_t cols, std::size_t k,
                            std::uint32_t* out) {
  using sort_t = cub::BlockRadixSort<float, topk_threads, ItemsPerThread, std::uint32_t>;
  __shared__ typename sort_t::TempStorage temp;
  const float* r = scores + static_cast<std::size_t>(blockIdx.x) * cols;
  float keys[ItemsPerThread];
  std::uint32_t idx[ItemsPerThread];
  for (int j = 0; j < ItemsPerThread; ++j) {
    const std::size_t c = static_cast<std::size_t>(threadIdx.x) * ItemsPerThread + j;  // blocked
    keys[j] = c < cols ? r[c] : -INFINITY;
    idx[j] = static_cast<std::uint32_t>(c);
  }
  sort_t(temp).SortDescending(keys, idx);
  for (int j = 0; j < ItemsPerThread; ++j) {
    const std::size_t rank = static_cast<std::size_t>(threadIdx.x) * ItemsPerThread + j;
    if (rank < k) out[static_cast<std::size_t>(blockIdx.x) * k + rank] = idx[j];
  }
}

}  // namespace

void normalize(const std::uint8_t* in, float* out, std::size_t n, normalize_params p,
               cudaStream_t s) {
  if (n == 0) return;
  normalize_kernel<<<grid_for(n, block), block, 0, s>>>(in, out, n, 1.0f / 255.0f, p.mean,
                                                        1.0f / p.stddev);
  CONVEYOR_CUDA_TRY(cudaGetLastError());
}

void to_storage16(const float* in, std::uint16_t* out, std::size_t n, precision p, cudaStream_t s) {
  CONVEYOR_EXPECTS(p == precision::fp16 || p == precision::bf16,
                   "to_storage16: precision must be fp16 or bf16");
  if (n == 0) return;
  to_storage16_kernel<<<grid_for(n, block), block, 0, s>>>(in, out, n, p == precision::bf16);
  CONVEYOR_CUDA_TRY(cudaGetLastError());
}

void bias_act(const float* acc, const float* bias, std::size_t rows, std::size_t cols, bool relu,
              void* out, precision p, cudaStream_t s) {
  const std::size_t n = rows * cols;
  if (n == 0) return;
  const int mode = p == precision::fp16 ? 1 : p == precision::bf16 ? 2 : 0;
  bias_act_kernel<<<grid_for(n, block), block, 0, s>>>(acc, bias, rows, cols, relu, out, mode);
  CONVEYOR_CUDA_TRY(cudaGetLastError());
}

void argmax_rows(const float* scores, std::size_t rows, std::size_t cols, std::uint32_t* out,
                 cudaStream_t s) {
  if (rows == 0) return;
  constexpr unsigned warps = block / 32;
  const std::size_t blocks = (rows + warps - 1) / warps;
  CONVEYOR_EXPECTS(blocks <= 0x7fffffffu, "argmax_rows: too many rows for one launch");
  argmax_kernel<<<static_cast<unsigned>(blocks), block, 0, s>>>(scores, rows, cols, out);
  CONVEYOR_CUDA_TRY(cudaGetLastError());
}

void topk_rows(const float* scores, std::size_t rows, std::size_t cols, std::size_t k,
               std::uint32_t* out, cudaStream_t s) {
  CONVEYOR_EXPECTS(cols >= 1 && cols <= max_topk_cols && k >= 1 && k <= cols,
                   "topk_rows: need 1 <= k <= cols <= 1024");
  CONVEYOR_EXPECTS(rows <= 0x7fffffffu, "topk_rows: too many rows for one launch");
  if (rows == 0) return;
  const auto grid = static_cast<unsigned>(rows);
  if (cols <= topk_threads)
    topk_kernel<1><<<grid, topk_threads, 0, s>>>(scores, cols, k, out);
  else if (cols <= 2 * topk_threads)
    topk_kernel<2><<<grid, topk_threads, 0, s>>>(scores, cols, k, out);
  else if (cols <= 4 * topk_threads)
    topk_kernel<4><<<grid, topk_threads, 0, s>>>(scores, cols, k, out);
  else
    topk_kernel<8><<<grid, topk_threads, 0, s>>>(scores, cols, k, out);
  CONVEYOR_CUDA_TRY(cudaGetLastError());
}

}  // namespace conveyor_models::kernels
