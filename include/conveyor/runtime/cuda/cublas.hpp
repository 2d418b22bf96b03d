// conveyor/runtime/cuda/cublas.hpp: a cuBLAS handle bound to one stream, with its own
// device workspace.
//
//   conveyor::cuda::cublas_handle blas{lane_stream, 4 << 20};   // one per lane
//   CONVEYOR_CUBLAS_TRY(cublasSgemm(blas.native(), CUBLAS_OP_N, CUBLAS_OP_N, ...));
//
// The handle's work goes to the stream it was made with (cublasSetStream), never the
// legacy default stream. Its own workspace (cublasSetWorkspace) keeps concurrent lanes
// from sharing cuBLAS's internal one, and makes CUDA graph capture of its calls legal.
// Move-only; the destructor destroys the handle, then frees the workspace.
// Thread-safety: one thread at a time per handle (cuBLAS's rule); one handle per lane.
#pragma once

#include <cstddef>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "conveyor/runtime/cuda/check.hpp"
#include "conveyor/runtime/cuda/memory.hpp"
#include "conveyor/runtime/cuda/stream.hpp"
#include "conveyor/runtime/detail/cuda_counters.hpp"

namespace conveyor::cuda {

class cublas_handle {
 public:
  // @param workspace_bytes cuBLAS's workspace on the current device; NVIDIA suggests
  //        4 MiB, 32 MiB on Hopper. 0 disables workspace use.
  // @throws cuda_error from cublasCreate / cublasSetStream / cublasSetWorkspace or the
  //         workspace allocation.
  cublas_handle(stream_ref s, std::size_t workspace_bytes)
      : workspace_(workspace_bytes, "cublas workspace"), stream_(s) {
    CONVEYOR_CUBLAS_TRY(cublasCreate(&handle_));
    try {
      CONVEYOR_CUBLAS_TRY(cublasSetStream(handle_, s.native()));
      CONVEYOR_CUBLAS_TRY(cublasSetWorkspace(handle_, workspace_.data(), workspace_.size_bytes()));
    } catch (...) {
      CONVEYOR_CUBLAS_ASSERT(cublasDestroy(std::exchange(handle_, nullptr)));
      throw;
    }
    detail::cuda_counters::add(detail::cuda_counters::cublas, 1);
  }

  cublas_handle(cublas_handle&& other) noexcept
      : workspace_(std::move(other.workspace_)),
        stream_(other.stream_),
        handle_(std::exchange(other.handle_, nullptr)) {}
  cublas_handle& operator=(cublas_handle&& other) noexcept {
    if (this != &other) {
      reset();  // the old handle goes before the old workspace it points into
      workspace_ = std::move(other.workspace_);
      stream_ = other.stream_;
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() { reset(); }

  cublasHandle_t native() const noexcept { return handle_; }
  stream_ref bound_stream() const noexcept { return stream_; }
  std::size_t workspace_bytes() const noexcept { return workspace_.size_bytes(); }

 private:
  void reset() noexcept {
    if (handle_ == nullptr) return;
    CONVEYOR_CUBLAS_ASSERT(cublasDestroy(std::exchange(handle_, nullptr)));
    detail::cuda_counters::add(detail::cuda_counters::cublas, -1);
  }

  device_buffer<std::byte> workspace_;  // declared first: outlives the handle
  stream_ref stream_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace conveyor::cuda
