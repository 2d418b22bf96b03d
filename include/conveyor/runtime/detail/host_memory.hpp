// conveyor/runtime/detail/host_memory.hpp: the owning buffer behind host::pinned_buffer
// and host::device_buffer, and the memcpy task behind the host runtime's copies.
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

#include "conveyor/config.hpp"
#include "conveyor/error.hpp"
#include "conveyor/runtime/detail/host_stream_state.hpp"
#include "conveyor/runtime/detail/memory_span.hpp"

namespace conveyor::detail {

inline constexpr std::size_t host_buffer_alignment = 256;  // as cudaMalloc

template <class T, class Space>
class host_buffer {
  static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>,
                "host buffers hold non-const trivially copyable elements");

 public:
  // @throws config_error above 1 TiB; conveyor::error (bytes and label) when out of memory.
  explicit host_buffer(std::size_t count, std::string_view label = Space::kind) : count_(count) {
    const std::size_t bytes = checked_bytes<T>(count, Space::kind, label);
    if (bytes == 0) return;
    void* p = ::operator new(bytes, std::align_val_t{host_buffer_alignment}, std::nothrow);
    if (p == nullptr)
      throw error("host runtime: " + std::string(Space::kind) + " allocation of " +
                  std::to_string(bytes) + " bytes for pool '" + std::string(label) +
                  "' failed: out of host memory");
    std::memset(p, 0xA5, bytes);  // garbage, not plausible zeros, until something copies in
    data_ = static_cast<T*>(p);
    host_counters::buffers.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistic
  }

  host_buffer(host_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  host_buffer& operator=(host_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  // No stream may still use the memory (synchronize, or wait for the event behind it).
  ~host_buffer() { reset(); }

  memory_span<T, Space> span() const noexcept { return span_access::make<T, Space>(data_, count_); }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  bool empty() const noexcept { return count_ == 0; }

 private:
  void reset() noexcept {
    count_ = 0;
    if (data_ == nullptr) return;
    ::operator delete(static_cast<void*>(std::exchange(data_, nullptr)),
                      std::align_val_t{host_buffer_alignment});
    host_counters::buffers.fetch_sub(1, std::memory_order_relaxed);  // relaxed: statistic
  }

  T* data_ = nullptr;
  std::size_t count_ = 0;
};

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
