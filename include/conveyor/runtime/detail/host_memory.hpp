// conveyor/runtime/detail/host_memory.hpp: the allocator behind host::pinned_buffer and
// host::device_buffer, and the memcpy task behind the host runtime's copies.
//
//   detail::host_buffer<float, host::pinned_space> b{1024, "staging"};
//   detail::enqueue_host_memcpy(*s.native(), dst, src, bytes);
//
// Thread-safety: an owned value; the memory follows stream ordering rules.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/runtime/detail/host_stream_state.hpp"
#include "conveyor/runtime/detail/memory_span.hpp"
#include "conveyor/runtime/detail/owning_buffer.hpp"

namespace conveyor::detail {

inline constexpr std::size_t host_buffer_alignment = 256;  // as cudaMalloc

// Where the host runtime's "pinned" and "device" memory come from: aligned host memory
// (like cudaMalloc's 256 bytes), filled with garbage rather than plausible zeros until
// something copies in, counted so tests can see every buffer freed.
template <class Space>
struct host_allocator {
  static void* allocate(std::size_t bytes, std::string_view label) {
    void* p = ::operator new(bytes, std::align_val_t{host_buffer_alignment}, std::nothrow);
    if (p == nullptr)
      throw error("host runtime: " + std::string(Space::kind) + " allocation of " +
                  std::to_string(bytes) + " bytes for pool '" + std::string(label) +
                  "' failed: out of host memory");
    std::memset(p, 0xA5, bytes);
    host_counters::buffers.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistic
    return p;
  }
  static void deallocate(void* p) noexcept {
    ::operator delete(p, std::align_val_t{host_buffer_alignment});
    host_counters::buffers.fetch_sub(1, std::memory_order_relaxed);  // relaxed: statistic
  }
};

template <class T, class Space>
using host_buffer = owning_buffer<T, Space, host_allocator<Space>>;

// @note blocks while the stream's queue is full.
inline void enqueue_host_memcpy(host_stream_state& s, void* dst, const void* src,
                                std::size_t bytes) {
  if (bytes == 0) return;  // memcpy with null pointers is undefined even for 0 bytes
  s.push(host_task{[dst, src, bytes](host_stream_state& st) {
    if (!st.failed()) std::memcpy(dst, src, bytes);
  }});
}

inline void enqueue_host_memset(host_stream_state& s, void* dst, int byte, std::size_t bytes) {
  if (bytes == 0) return;
  s.push(host_task{[dst, byte, bytes](host_stream_state& st) {
    if (!st.failed()) std::memset(dst, byte, bytes);
  }});
}

}  // namespace conveyor::detail
