// conveyor/runtime/cuda/check.hpp: every CUDA and cuBLAS call goes through one of these.
//
//   CONVEYOR_CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));  // throws
//   CONVEYOR_CUBLAS_TRY(cublasSgemm(h, ...));                                      // throws
//   ~stream() { CONVEYOR_CUDA_ASSERT(cudaStreamDestroy(s_)); }                     // destructors
//   CONVEYOR_CUDA_LOG(cudaEventDestroy(e));                                        // noexcept paths
//
// TRY throws conveyor::cuda_error: api name (the expression up to its '('), the numeric
// code, its name (cudaErrorInvalidValue), the message, file:line. ASSERT and LOG never
// throw: LOG prints to stderr; ASSERT prints and, in builds without NDEBUG, aborts,
// except for errors that only say the context is already gone or poisoned (process exit,
// a sticky kernel fault reported earlier), which a destructor cannot do anything about.
// All of them call cudaGetLastError() on failure, so the error does not resurface at the
// next, unrelated call. Compiles with a plain C++ compiler and cuda_runtime_api.h.
// Thread-safety: stateless; CUDA's last error is per host thread.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "conveyor/base/error.hpp"

namespace conveyor::detail {

// "::cudaMalloc(&p, n)" -> "cudaMalloc"; an expression with no call keeps its text.
inline std::string cuda_api_name(std::string_view expr) {
  while (!expr.empty() && (expr.front() == ':' || expr.front() == ' ')) expr.remove_prefix(1);
  const std::size_t paren = expr.find('(');
  if (paren != std::string_view::npos) expr = expr.substr(0, paren);
  while (!expr.empty() && expr.back() == ' ') expr.remove_suffix(1);
  return std::string(expr);
}

// @param context prefixed to CUDA's message ("pinned allocation of 64 bytes for pool 'x'")
[[noreturn]] inline void throw_cuda_error(cudaError_t status, std::string_view expr,
                                          const char* file, int line,
                                          std::string_view context = {}) {
  (void)cudaGetLastError();  // clear, so the next call does not report this one again
  std::string message = cudaGetErrorString(status);
  if (!context.empty()) message = std::string(context) + ": " + message;
  throw cuda_error(cuda_api_name(expr), static_cast<int>(status), cudaGetErrorName(status), message,
                   file, line);
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, std::string_view expr,
                                            const char* file, int line) {
  (void)cudaGetLastError();
  throw cuda_error(cuda_api_name(expr), static_cast<int>(status), cublasGetStatusName(status),
                   cublasGetStatusString(status), file, line);
}

// Errors a destructor may meet without any bug of its own: the runtime is shutting down,
// or an earlier kernel fault poisoned the context (already reported where it happened).
inline bool cuda_context_gone(cudaError_t status) noexcept {
  switch (status) {
    case cudaErrorCudartUnloading:
    case cudaErrorContextIsDestroyed:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

inline void log_cuda_error(cudaError_t status, const char* expr, const char* file,
                           int line) noexcept {
  (void)cudaGetLastError();
  if (status == cudaErrorCudartUnloading) return;  // process exit: nothing worth saying
  std::fprintf(stderr, "conveyor: %s failed: %s (%d): %s at %s:%d\n", expr,
               cudaGetErrorName(status), static_cast<int>(status), cudaGetErrorString(status), file,
               line);
}

inline void assert_cuda_success(cudaError_t status, const char* expr, const char* file,
                                int line) noexcept {
  log_cuda_error(status, expr, file, line);
#ifndef NDEBUG
  if (!cuda_context_gone(status)) std::abort();
#endif
}

inline void assert_cublas_success(cublasStatus_t status, const char* expr, const char* file,
                                  int line) noexcept {
  (void)cudaGetLastError();
  std::fprintf(stderr, "conveyor: %s failed: %s (%d): %s at %s:%d\n", expr,
               cublasGetStatusName(status), static_cast<int>(status), cublasGetStatusString(status),
               file, line);
#ifndef NDEBUG
  if (status != CUBLAS_STATUS_NOT_INITIALIZED) std::abort();
#endif
}

}  // namespace conveyor::detail

// Throws conveyor::cuda_error when expr (a cudaError_t) is not cudaSuccess.
#define CONVEYOR_CUDA_TRY(expr)                                                              \
  do {                                                                                       \
    const cudaError_t conveyor_cuda_status = (expr);                                         \
    if (conveyor_cuda_status != cudaSuccess)                                                 \
      ::conveyor::detail::throw_cuda_error(conveyor_cuda_status, #expr, __FILE__, __LINE__); \
  } while (false)

// For destructors: never throws; logs, and aborts in debug builds unless the context is gone.
#define CONVEYOR_CUDA_ASSERT(expr)                                                              \
  do {                                                                                          \
    const cudaError_t conveyor_cuda_status = (expr);                                            \
    if (conveyor_cuda_status != cudaSuccess)                                                    \
      ::conveyor::detail::assert_cuda_success(conveyor_cuda_status, #expr, __FILE__, __LINE__); \
  } while (false)

// For noexcept paths that may fail and carry on: logs to stderr.
#define CONVEYOR_CUDA_LOG(expr)                                                            \
  do {                                                                                     \
    const cudaError_t conveyor_cuda_status = (expr);                                       \
    if (conveyor_cuda_status != cudaSuccess)                                               \
      ::conveyor::detail::log_cuda_error(conveyor_cuda_status, #expr, __FILE__, __LINE__); \
  } while (false)

// Throws conveyor::cuda_error (code: the cublasStatus_t) unless expr is CUBLAS_STATUS_SUCCESS.
#define CONVEYOR_CUBLAS_TRY(expr)                                                                \
  do {                                                                                           \
    const cublasStatus_t conveyor_cublas_status = (expr);                                        \
    if (conveyor_cublas_status != CUBLAS_STATUS_SUCCESS)                                         \
      ::conveyor::detail::throw_cublas_error(conveyor_cublas_status, #expr, __FILE__, __LINE__); \
  } while (false)

// For destructors: as CONVEYOR_CUDA_ASSERT, for cuBLAS.
#define CONVEYOR_CUBLAS_ASSERT(expr)                                                     \
  do {                                                                                   \
    const cublasStatus_t conveyor_cublas_status = (expr);                                \
    if (conveyor_cublas_status != CUBLAS_STATUS_SUCCESS)                                 \
      ::conveyor::detail::assert_cublas_success(conveyor_cublas_status, #expr, __FILE__, \
                                                __LINE__);                               \
  } while (false)
