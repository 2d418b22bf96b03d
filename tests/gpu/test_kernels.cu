// Kernels for the GPU tests; see test_kernels.hpp. Kept to one small .cu file so the
// CUDA compile stays short.
#include <thrust/reduce.h>
#include <thrust/system/cuda/execution_policy.h>
#include "test_kernels.hpp"

#include "conveyor/runtime/cuda/check.hpp"

namespace conveyor::test::gpu {
namespace {

__global__ void spin_until_kernel(const volatile int* flag, int expect, long long timeout_cycles,
                                  volatile int* started, int* result) {
  *started = 1;
  __threadfence_system();
  const long long start = clock64();
  int seen = 0;
  while (clock64() - start < timeout_cycles) {
    if (*flag == expect) {
      seen = 1;
      break;
    }
  }
  *result = seen;
  __threadfence_system();
}

__global__ void set_flag_kernel(volatile int* flag, int value) {
  *flag = value;
  __threadfence_system();
}

__global__ void affine_kernel(const float* in, float* out, std::size_t n, float a, float b) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = a * in[i] + b;
}

__global__ void empty_kernel() {}

}  // namespace

void launch_spin_until(const int* flag, int expect, long long timeout_cycles, int* started,
                       int* result, cudaStream_t s) {
  spin_until_kernel<<<1, 1, 0, s>>>(flag, expect, timeout_cycles, started, result);
  CONVEYOR_CUDA_TRY(cudaGetLastError());
}

void launch_set_flag(int* flag, int value, cudaStream_t s) {
  set_flag_kernel<<<1, 1, 0, s>>>(flag, value);
  CONVEYOR_CUDA_TRY(cudaGetLastError());
}

void launch_affine(const float* in, float* out, std::size_t n, float a, float b, cudaStream_t s) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024);
  affine_kernel<<<blocks, 256, 0, s>>>(in, out, n, a, b);
  CONVEYOR_CUDA_TRY(cudaGetLastError());
}

void launch_invalid_config(cudaStream_t s) { empty_kernel<<<1, 4096, 0, s>>>(); }

float thrust_sum(const float* in, std::size_t n, cudaStream_t s) {
  return thrust::reduce(thrust::cuda::par_nosync.on(s), in, in + n, 0.0f);
}

long long cycles_for_ms(long long ms) {
  int device = 0, khz = 0;
  CONVEYOR_CUDA_TRY(cudaGetDevice(&device));
  CONVEYOR_CUDA_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  return static_cast<long long>(khz) * ms;
}

}  // namespace conveyor::test::gpu
