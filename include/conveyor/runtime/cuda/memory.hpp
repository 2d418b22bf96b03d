// conveyor/runtime/cuda/memory.hpp: pinned host memory and device memory as distinct
// owning types, typed views over them, and the async copies between them.
//
//   conveyor::cuda::pinned_buffer<float> in{n, "staging in"};   // cudaHostAlloc
//   conveyor::cuda::device_buffer<float> dev{n, "activations"}; // cudaMalloc
//   std::ranges::fill(in.span(), 1.f);                // pinned memory: host element access
//   copy_async(dev.span(), in.span(), s);             // H2D, truly asynchronous
//   copy_async(out.span(), dev.span(), s);            // D2H
//
// Copies take only pinned_span / device_span, so handing pageable memory (a std::vector,
// a std::span, a raw pointer) to an async copy does not compile: cudaMemcpyAsync from
// pageable memory silently synchronizes. device_span has no host element access at all.
// from_native() on a span adopts foreign memory; every build checks the pointer kind once
// (cudaPointerGetAttributes: config_error for pageable memory behind a pinned_span).
// Allocation happens at construction only: cudaMalloc and cudaHostAlloc synchronize
// implicitly, so a pipeline makes its buffers before it starts.
// Freeing (cudaFree, cudaFreeHost) also synchronizes the device; destroy buffers once no
// stream uses them.
// Thread-safety: buffers are owned values; the memory follows stream ordering rules.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <cuda_runtime_api.h>

#include "conveyor/base/config.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/runtime/cuda/check.hpp"
#include "conveyor/runtime/cuda/stream.hpp"
#include "conveyor/runtime/detail/cuda_counters.hpp"
#include "conveyor/runtime/detail/memory_span.hpp"
#include "conveyor/runtime/detail/owning_buffer.hpp"

namespace conveyor::detail {

// Once per adopted buffer (from_native), in every build: pageable memory behind a
// pinned_span would make each copy of the GPU segment synchronous, silently.
inline void check_cuda_pointer_kind(const void* p, std::size_t bytes, bool want_device) {
  if (p == nullptr || bytes == 0) return;
  cudaPointerAttributes attr{};
  CONVEYOR_CUDA_TRY(cudaPointerGetAttributes(&attr, p));
  const bool ok = want_device
                      ? (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)
                      : (attr.type == cudaMemoryTypeHost);
  CONVEYOR_EXPECTS(ok, want_device
                           ? "device_span::from_native: the pointer is not device memory"
                           : "pinned_span::from_native: the pointer is not pinned host memory "
                             "(pageable memory makes cudaMemcpyAsync synchronous); allocate "
                             "it with pinned_buffer or cudaHostAlloc, or cudaHostRegister it");
}

inline void cuda_memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                              cudaStream_t s) {
  if (bytes == 0) return;
  CONVEYOR_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, s));
}

// An allocation failure names the bytes and the pool, then the CUDA error.
[[noreturn]] inline void throw_allocation_error(cudaError_t status, const char* api,
                                                const char* kind, std::size_t bytes,
                                                std::string_view label) {
  throw_cuda_error(status, api, __FILE__, __LINE__,
                   std::string(kind) + " allocation of " + std::to_string(bytes) +
                       " bytes for pool '" + std::string(label) + "' failed");
}

// Where cuda::pinned_buffer and cuda::device_buffer get their memory (owning_buffer.hpp).
struct cuda_pinned_allocator {
  static void* allocate(std::size_t bytes, std::string_view label) {
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (status != cudaSuccess)
      throw_allocation_error(status, "cudaHostAlloc", "pinned", bytes, label);
    cuda_counters::add(cuda_counters::pinned, 1);
    return p;
  }
  static void deallocate(void* p) noexcept {
    CONVEYOR_CUDA_ASSERT(cudaFreeHost(p));
    cuda_counters::add(cuda_counters::pinned, -1);
  }
};

struct cuda_device_allocator {
  static void* allocate(std::size_t bytes, std::string_view label) {
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess) throw_allocation_error(status, "cudaMalloc", "device", bytes, label);
    cuda_counters::add(cuda_counters::device, 1);
    return p;
  }
  static void deallocate(void* p) noexcept {
    CONVEYOR_CUDA_ASSERT(cudaFree(p));
    cuda_counters::add(cuda_counters::device, -1);
  }
};

}  // namespace conveyor::detail

namespace conveyor::cuda {

struct pinned_space {
  static constexpr bool host_accessible = true;
  static constexpr bool unsafe_host_accessible = false;
  static constexpr std::string_view kind = "pinned";
  static void check_adopted(const void* p, std::size_t bytes) {
    detail::check_cuda_pointer_kind(p, bytes, false);
  }
};

struct device_space {
  static constexpr bool host_accessible = false;
  static constexpr bool unsafe_host_accessible = false;
  static constexpr std::string_view kind = "device";
  static void check_adopted(const void* p, std::size_t bytes) {
    detail::check_cuda_pointer_kind(p, bytes, true);
  }
};

template <class T>
using pinned_span = detail::memory_span<T, pinned_space>;
template <class T>
using device_span = detail::memory_span<T, device_space>;

// Page-locked host memory (cudaHostAlloc, portable across devices). Uninitialized.
// @throws config_error above 1 TiB; cuda_error naming the bytes and the label on failure.
template <class T>
class pinned_buffer : public detail::owning_buffer<T, pinned_space, detail::cuda_pinned_allocator> {
  using base = detail::owning_buffer<T, pinned_space, detail::cuda_pinned_allocator>;

 public:
  using base::base;
};

// Device memory (cudaMalloc) on the current device. Uninitialized.
// @throws config_error above 1 TiB; cuda_error naming the bytes and the label on failure.
template <class T>
class device_buffer : public detail::owning_buffer<T, device_space, detail::cuda_device_allocator> {
  using base = detail::owning_buffer<T, device_space, detail::cuda_device_allocator>;

 public:
  using base::base;
};

// Host (pinned) to device. @throws config_error when the sizes differ; cuda_error.
template <class T>
void copy_async(device_span<T> dst, std::type_identity_t<pinned_span<const T>> src, stream_ref s) {
  static_assert(!std::is_const_v<T>, "copy_async: the destination must be writable");
  detail::check_copy_sizes(dst.size(), src.size(), "copy_async (H2D)");
  detail::cuda_memcpy_async(dst.data(), src.data(), dst.size_bytes(), cudaMemcpyHostToDevice,
                            s.native());
}

// Device to host (pinned). @throws config_error when the sizes differ; cuda_error.
template <class T>
void copy_async(pinned_span<T> dst, std::type_identity_t<device_span<const T>> src, stream_ref s) {
  static_assert(!std::is_const_v<T>, "copy_async: the destination must be writable");
  detail::check_copy_sizes(dst.size(), src.size(), "copy_async (D2H)");
  detail::cuda_memcpy_async(dst.data(), src.data(), dst.size_bytes(), cudaMemcpyDeviceToHost,
                            s.native());
}

// Device to device. @throws config_error when the sizes differ; cuda_error.
template <class T>
void copy_async(device_span<T> dst, std::type_identity_t<device_span<const T>> src, stream_ref s) {
  static_assert(!std::is_const_v<T>, "copy_async: the destination must be writable");
  detail::check_copy_sizes(dst.size(), src.size(), "copy_async (D2D)");
  detail::cuda_memcpy_async(dst.data(), src.data(), dst.size_bytes(), cudaMemcpyDeviceToDevice,
                            s.native());
}

// Sets every byte of dst to `byte`. @throws cuda_error
template <class T>
void memset_async(device_span<T> dst, int byte, stream_ref s) {
  static_assert(!std::is_const_v<T>, "memset_async: the destination must be writable");
  if (dst.empty()) return;
  CONVEYOR_CUDA_TRY(cudaMemsetAsync(dst.data(), byte, dst.size_bytes(), s.native()));
}

}  // namespace conveyor::cuda
