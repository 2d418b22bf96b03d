// Kernels for the GPU tests, behind plain host functions so the tests themselves are
// ordinary C++ (compiled by the host compiler against conveyor::cuda, as the pipeline's
// own .cpp files are). Only test_kernels.cu needs nvcc.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace conveyor::test::gpu {

// One thread: sets *started = 1, then spins until *flag == expect or timeout_cycles of
// clock64() have passed, and writes 1 (saw the flag) or 0 (timed out) to *result. flag may
// be device memory or pinned host memory. The bounded spin turns a serialization bug
// into a failed check instead of a hung test.
void launch_spin_until(const int* flag, int expect, long long timeout_cycles, int* started,
                       int* result, cudaStream_t s);

// One thread: *flag = value, made visible system-wide.
void launch_set_flag(int* flag, int value, cudaStream_t s);

// out[i] = a * in[i] + b for i < n.
void launch_affine(const float* in, float* out, std::size_t n, float a, float b, cudaStream_t s);

// A launch with 4096 threads per block: cudaErrorInvalidConfiguration, a launch error
// that does not poison the context. Returns nothing; the error waits in cudaGetLastError.
void launch_invalid_config(cudaStream_t s);

// thrust::reduce of in[0 .. n) on s, even with par_nosync: a call that returns a value
// to the host waits for the stream (what a compute functor must not do).
float thrust_sum(const float* in, std::size_t n, cudaStream_t s);

// Cycles of clock64() in `ms` milliseconds on the current device.
long long cycles_for_ms(long long ms);

}  // namespace conveyor::test::gpu
