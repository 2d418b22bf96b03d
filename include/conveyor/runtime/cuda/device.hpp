// conveyor/runtime/cuda/device.hpp: which CUDA devices answer, and choosing one.
//
//   if (conveyor::cuda::device_count() == 0) use_host_runtime();   // never throws
//   conveyor::cuda::require_device(1);       // config_error: "device 1 requested but only 1 present"
//   { conveyor::cuda::device_guard on{1};  make_streams(); }   // current device restored after
//
// Thread-safety: the current device is per host thread; device_guard changes and
// restores the calling thread's only.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "conveyor/base/config.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/runtime/cuda/check.hpp"

namespace conveyor::cuda {

// Devices that answer; 0 when there is no device, no driver, or the driver fails.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// @throws cuda_error when the runtime cannot count devices (no driver, no device);
// config_error when none is present or id is out of range.
inline void require_device(int id) {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess)
    detail::throw_cuda_error(status, "cudaGetDeviceCount", __FILE__, __LINE__,
                             "no CUDA device answers (run on a machine with a GPU and a "
                             "working driver, or use conveyor::host::runtime)");
  CONVEYOR_EXPECTS(n > 0,
                   "no CUDA device answers: cudaGetDeviceCount found 0 devices; use "
                   "conveyor::host::runtime on machines without a GPU");
  CONVEYOR_EXPECTS(id >= 0 && id < n, "device " + std::to_string(id) + " requested but only " +
                                          std::to_string(n) + " present (valid ids: 0.." +
                                          std::to_string(n - 1) + ")");
}

// @throws cuda_error
inline int current_device() {
  int d = 0;
  CONVEYOR_CUDA_TRY(cudaGetDevice(&d));
  return d;
}

// Makes `id` the calling thread's current device. @throws as require_device(id), or
// cuda_error from cudaSetDevice.
inline void set_device(int id) {
  require_device(id);
  CONVEYOR_CUDA_TRY(cudaSetDevice(id));
}

// Makes `id` the calling thread's current device; the destructor restores the previous one.
class device_guard {
 public:
  // @throws as require_device(id), or cuda_error from cudaSetDevice.
  explicit device_guard(int id) {
    require_device(id);
    CONVEYOR_CUDA_TRY(cudaGetDevice(&previous_));
    CONVEYOR_CUDA_TRY(cudaSetDevice(id));
  }
  ~device_guard() { CONVEYOR_CUDA_ASSERT(cudaSetDevice(previous_)); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace conveyor::cuda
