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
// from_native() on a span adopts foreign memory; debug builds check the pointer kind
// with cudaPointerGetAttributes. Allocation happens at construction only: cudaMalloc and
// cudaHostAlloc synchronize implicitly, so a pipeline makes its buffers before it starts.
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

#include "conveyor/config.hpp"
#include "conveyor/error.hpp"
#include "conveyor/runtime/cuda/check.hpp"
#include "conveyor/runtime/cuda/stream.hpp"
#include "conveyor/runtime/detail/cuda_counters.hpp"
#include "conveyor/runtime/detail/memory_span.hpp"

namespace conveyor::detail {

inline void check_cuda_pointer_kind(const void* p, std::size_t bytes, bool want_device) {
#ifndef NDEBUG
  if (p == nullptr || bytes == 0) return;
  cudaPointerAttributes attr{};
  CONVEYOR_CUDA_TRY(cudaPointerGetAttributes(&attr, p));
  const bool ok = want_device ? (attr.type == cudaMemoryTypeDevice ||
                                 attr.type == cudaMemoryTypeManaged)
                              : (attr.type == cudaMemoryTypeHost);
  CONVEYOR_EXPECTS(ok, want_device
                           ? "device_span::from_native: the pointer is not device memory"
                           : "pinned_span::from_native: the pointer is not pinned host memory "
                             "(pageable memory makes cudaMemcpyAsync synchronous); allocate "
                             "it with pinned_buffer or cudaHostAlloc, or cudaHostRegister it");
#else
  (void)p;
  (void)bytes;
  (void)want_device;
#endif
}

inline void cuda_memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                              cudaStream_t s) {
  if (bytes == 0) return;
  CONVEYOR_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, s));
}

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
template <class T>
class pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>,
                "pinned_buffer holds non-const trivially copyable elements");

 public:
  // @throws config_error above 1 TiB; cuda_error naming the bytes and the label on failure.
  explicit pinned_buffer(std::size_t count, std::string_view label = "pinned") : count_(count) {
    const std::size_t bytes = detail::checked_bytes<T>(count, "pinned", label);
    if (bytes == 0) return;
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (status != cudaSuccess)
      detail::throw_cuda_error(status, "cudaHostAlloc", __FILE__, __LINE__,
                               "pinned allocation of " + std::to_string(bytes) +
                                   " bytes for pool '" + std::string(label) + "' failed");
    data_ = static_cast<T*>(p);
    detail::cuda_counters::add(detail::cuda_counters::pinned, 1);
  }

  pinned_buffer(pinned_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { reset(); }

  pinned_span<T> span() const noexcept {
    return detail::span_access::make<T, pinned_space>(data_, count_);
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  bool empty() const noexcept { return count_ == 0; }

 private:
  void reset() noexcept {
    count_ = 0;
    if (data_ == nullptr) return;
    CONVEYOR_CUDA_ASSERT(cudaFreeHost(std::exchange(data_, nullptr)));
    detail::cuda_counters::add(detail::cuda_counters::pinned, -1);
  }

  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// Device memory (cudaMalloc) on the current device. Uninitialized.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>,
                "device_buffer holds non-const trivially copyable elements");

 public:
  // @throws config_error above 1 TiB; cuda_error naming the bytes and the label on failure.
  explicit device_buffer(std::size_t count, std::string_view label = "device") : count_(count) {
    const std::size_t bytes = detail::checked_bytes<T>(count, "device", label);
    if (bytes == 0) return;
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess)
      detail::throw_cuda_error(status, "cudaMalloc", __FILE__, __LINE__,
                               "device allocation of " + std::to_string(bytes) +
                                   " bytes for pool '" + std::string(label) + "' failed");
    data_ = static_cast<T*>(p);
    detail::cuda_counters::add(detail::cuda_counters::device, 1);
  }

  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  device_span<T> span() const noexcept {
    return detail::span_access::make<T, device_space>(data_, count_);
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  bool empty() const noexcept { return count_ == 0; }

 private:
  void reset() noexcept {
    count_ = 0;
    if (data_ == nullptr) return;
    CONVEYOR_CUDA_ASSERT(cudaFree(std::exchange(data_, nullptr)));
    detail::cuda_counters::add(detail::cuda_counters::device, -1);
  }

  T* data_ = nullptr;
  std::size_t count_ = 0;
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
