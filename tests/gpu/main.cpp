// The GPU test binary's main: exits 77 (CTest's SKIP_RETURN_CODE) when no CUDA device
// answers, saying why; otherwise runs the Catch2 session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <cuda_runtime_api.h>

int main(int argc, char* argv[]) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    std::printf(
        "gpu_tests: skipped: no CUDA device answers: cudaGetDeviceCount failed with %s (%s)\n",
        cudaGetErrorName(status), cudaGetErrorString(status));
    return 77;
  }
  if (devices == 0) {
    std::printf("gpu_tests: skipped: cudaGetDeviceCount found 0 devices\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
