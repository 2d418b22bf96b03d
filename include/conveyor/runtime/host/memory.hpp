// conveyor/runtime/host/memory.hpp: the host runtime's "pinned" and "device" memory, both
// ordinary host memory, with the same distinct types as the CUDA runtime.
//
//   conveyor::host::pinned_buffer<float> in{1024, "staging in"};   // owning, move-only
//   conveyor::host::device_buffer<float> dev{1024};
//   std::ranges::fill(in.span(), 1.f);                 // pinned memory: host element access
//   copy_async(dev.span(), in.span(), s);              // H2D: memcpy on s's thread, in order
//   memset_async(dev.span(), 0, s);
//
// Copies take only pinned_span / device_span: a std::vector, a std::span or a raw pointer
// finds no overload, as on CUDA, where a pageable source would silently synchronize.
// device_span has no element access, only unsafe_host() for tests and host "kernels".
// Buffers are 256-byte aligned (as cudaMalloc) and filled with 0xA5 when allocated, so
// code that reads memory nobody copied into sees garbage rather than plausible zeros.
// Thread-safety: buffers are owned values; the memory follows stream ordering rules.
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "conveyor/runtime/detail/host_memory.hpp"
#include "conveyor/runtime/detail/memory_span.hpp"
#include "conveyor/runtime/host/stream.hpp"

namespace conveyor::host {

struct pinned_space {
  static constexpr bool host_accessible = true;
  static constexpr bool unsafe_host_accessible = true;
  static constexpr std::string_view kind = "host pinned";
  static void check_adopted(const void*, std::size_t) noexcept {}
};

struct device_space {
  static constexpr bool host_accessible = false;
  static constexpr bool unsafe_host_accessible = true;
  static constexpr std::string_view kind = "host device";
  static void check_adopted(const void*, std::size_t) noexcept {}
};

template <class T>
using pinned_span = detail::memory_span<T, pinned_space>;
template <class T>
using device_span = detail::memory_span<T, device_space>;

// pinned_buffer(count) / pinned_buffer(count, label): count elements, uninitialized (0xA5).
// @throws config_error above 1 TiB; conveyor::error naming bytes and label when out of memory.
template <class T>
class pinned_buffer : public detail::host_buffer<T, pinned_space> {
  using base = detail::host_buffer<T, pinned_space>;

 public:
  using base::base;
};

template <class T>
class device_buffer : public detail::host_buffer<T, device_space> {
  using base = detail::host_buffer<T, device_space>;

 public:
  using base::base;
};

// Host to "device". @throws config_error when the sizes differ.
template <class T>
void copy_async(device_span<T> dst, std::type_identity_t<pinned_span<const T>> src, stream_ref s) {
  static_assert(!std::is_const_v<T>, "copy_async: the destination must be writable");
  detail::check_copy_sizes(dst.size(), src.size(), "copy_async (H2D)");
  detail::enqueue_host_memcpy(*s.native(), dst.data(), src.data(), dst.size_bytes());
}

// "Device" to host. @throws config_error when the sizes differ.
template <class T>
void copy_async(pinned_span<T> dst, std::type_identity_t<device_span<const T>> src, stream_ref s) {
  static_assert(!std::is_const_v<T>, "copy_async: the destination must be writable");
  detail::check_copy_sizes(dst.size(), src.size(), "copy_async (D2H)");
  detail::enqueue_host_memcpy(*s.native(), dst.data(), src.data(), dst.size_bytes());
}

// "Device" to "device". @throws config_error when the sizes differ.
template <class T>
void copy_async(device_span<T> dst, std::type_identity_t<device_span<const T>> src, stream_ref s) {
  static_assert(!std::is_const_v<T>, "copy_async: the destination must be writable");
  detail::check_copy_sizes(dst.size(), src.size(), "copy_async (D2D)");
  detail::enqueue_host_memcpy(*s.native(), dst.data(), src.data(), dst.size_bytes());
}

// Sets every byte of dst to `byte`, as cudaMemsetAsync.
template <class T>
void memset_async(device_span<T> dst, int byte, stream_ref s) {
  static_assert(!std::is_const_v<T>, "memset_async: the destination must be writable");
  detail::enqueue_host_memset(*s.native(), dst.data(), byte, dst.size_bytes());
}

}  // namespace conveyor::host
