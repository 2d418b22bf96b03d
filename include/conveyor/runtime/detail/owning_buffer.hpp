// conveyor/runtime/detail/owning_buffer.hpp: the one owning buffer behind both runtimes'
// pinned_buffer and device_buffer. What differs between them, where the memory comes
// from, is the Allocator; ownership, moves and views are written once here.
//
//   struct my_allocator {
//     static void* allocate(std::size_t bytes, std::string_view label);  // throws on failure
//     static void deallocate(void* p) noexcept;
//   };
//   template <class T> class my_buffer : public detail::owning_buffer<T, my_space, my_allocator> {
//     using detail::owning_buffer<T, my_space, my_allocator>::owning_buffer;
//   };
//
// Thread-safety: an owned value; the memory follows the stream ordering rules of its runtime.
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

#include "conveyor/runtime/detail/memory_span.hpp"

namespace conveyor::detail {

template <class T, class Space, class Allocator>
class owning_buffer {
  static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>,
                "buffers hold non-const trivially copyable elements");

 public:
  // @throws config_error above 1 TiB; whatever Allocator::allocate throws (naming the
  // bytes and the label) when the memory cannot be had.
  explicit owning_buffer(std::size_t count, std::string_view label = Space::kind) : count_(count) {
    const std::size_t bytes = checked_bytes<T>(count, Space::kind, label);
    if (bytes != 0) data_ = static_cast<T*>(Allocator::allocate(bytes, label));
  }

  owning_buffer(owning_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  owning_buffer& operator=(owning_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  owning_buffer(const owning_buffer&) = delete;
  owning_buffer& operator=(const owning_buffer&) = delete;
  // No stream may still use the memory (synchronize, or wait for the event behind it).
  ~owning_buffer() { reset(); }

  memory_span<T, Space> span() const noexcept { return span_access::make<T, Space>(data_, count_); }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  bool empty() const noexcept { return count_ == 0; }

 private:
  void reset() noexcept {
    count_ = 0;
    if (data_ != nullptr) Allocator::deallocate(std::exchange(data_, nullptr));
  }

  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace conveyor::detail
