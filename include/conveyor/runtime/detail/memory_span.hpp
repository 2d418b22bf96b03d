// conveyor/runtime/detail/memory_span.hpp: the typed, non-owning view behind
// pinned_span<T> and device_span<T> in both runtimes.
//
//   template <class T> using pinned_span = detail::memory_span<T, host::pinned_space>;
//   pinned_span<float> p = buffer.span();           // only buffers (or from_native) make one
//   pinned_span<const float> c = p;                 // T -> const T converts implicitly
//   auto tail = p.subspan(16, 32);                  // bounds-checked: config_error if outside
//   p[7] = 1.f;                                     // bounds-checked too, in release builds
//   p.write_at(64, std::span<const float>{row});    // checked bulk copy (memcpy) into p
//
// The Space tag says where the memory lives and what the host may do with it:
//   host_accessible         element access (operator[], begin/end, host(), std::span)
//   unsafe_host_accessible  unsafe_host() only (the host runtime's "device" memory, for tests)
//   check_adopted(p, bytes) called by from_native() (the CUDA tags verify the pointer kind)
// Two spans over the same T but different spaces are unrelated types, so pinned and
// device memory (and either runtime's) cannot be mixed up, and nothing converts a raw
// pointer or a std::vector into one implicitly.
// Host element access is bounds-checked: operator[] and write_at() throw config_error
// before a write outside the span lands, so a gpu stage-in that writes more than a slot
// holds fails without touching the neighbouring slot (a lane's slots are adjacent in one
// region, where ASan sees nothing). data(), begin()/end(), host() and the std::span
// conversion are raw views, unchecked: code that bounds itself (a checked subspan per
// row, then a raw loop) uses them: a check per row costs next to nothing, while
// operator[] element by element keeps an -O3 loop from vectorizing.
// Thread-safety: a trivially copyable value (pointer + size); the memory's rules apply.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "conveyor/base/config.hpp"

namespace conveyor::detail {

struct span_access;

// The failure path of memory_span's checked access (src/conveyor/error.cpp).
[[noreturn]] void throw_outside_span(std::size_t offset, std::size_t count, std::size_t size);

template <class T, class Space>
class memory_span {
  static_assert(std::is_trivially_copyable_v<std::remove_cv_t<T>>,
                "conveyor spans hold trivially copyable elements: copies are memcpy / DMA");

 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using space = Space;

  constexpr memory_span() noexcept = default;

  // span<T> -> span<const T>, like std::span.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr memory_span(memory_span<U, Space> other) noexcept  // NOLINT: implicit on purpose
      : data_(other.data()), size_(other.size()) {}

  // Adopts memory the caller vouches for: it must have been allocated as Space (pinned
  // host memory for a pinned span). The CUDA spaces check the pointer kind in debug builds.
  static memory_span from_native(T* data, std::size_t count) {
    Space::check_adopted(static_cast<const void*>(data), count * sizeof(T));
    return memory_span(data, count);
  }

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  constexpr bool empty() const noexcept { return size_ == 0; }

  // @throws config_error when [offset, offset + count) is not inside this span.
  memory_span subspan(std::size_t offset, std::size_t count) const {
    CONVEYOR_EXPECTS(offset <= size_ && count <= size_ - offset,
                     "subspan(" + std::to_string(offset) + ", " + std::to_string(count) +
                         ") is outside a span of " + std::to_string(size_) + " elements");
    return memory_span(data_ + offset, count);
  }

  // Host element access: pinned memory only.
  std::span<T> host() const noexcept
    requires Space::host_accessible
  {
    return {data_, size_};
  }
  operator std::span<T>() const noexcept  // NOLINT: a pinned span is host memory
    requires Space::host_accessible
  {
    return {data_, size_};
  }
  // @throws config_error when i >= size(): nothing is read or written.
  T& operator[](std::size_t i) const
    requires Space::host_accessible
  {
    if (i >= size_) [[unlikely]]
      throw_outside_span(i, 1, size_);
    return data_[i];
  }
  // Copies src to [offset, offset + src.size()). @throws config_error, writing nothing,
  // when that range is not inside this span.
  void write_at(std::size_t offset, std::span<const value_type> src) const
    requires(Space::host_accessible && !std::is_const_v<T>)
  {
    if (offset > size_ || src.size() > size_ - offset) [[unlikely]]
      throw_outside_span(offset, src.size(), size_);
    if (!src.empty()) std::memcpy(data_ + offset, src.data(), src.size_bytes());
  }
  T* begin() const noexcept
    requires Space::host_accessible
  {
    return data_;
  }
  T* end() const noexcept
    requires Space::host_accessible
  {
    return data_ + size_;
  }

  // The host runtime's device memory is host memory too. Tests and host "kernels" read it
  // through this deliberately loud name; the CUDA device span has no such member.
  std::span<T> unsafe_host() const noexcept
    requires Space::unsafe_host_accessible
  {
    return {data_, size_};
  }

 private:
  friend struct span_access;
  constexpr memory_span(T* data, std::size_t count) noexcept : data_(data), size_(count) {}

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// The buffers' way to make a span over memory they allocated themselves (no check).
struct span_access {
  template <class T, class Space>
  static constexpr memory_span<T, Space> make(T* data, std::size_t count) noexcept {
    return memory_span<T, Space>(data, count);
  }
};

// Element count -> bytes, refusing overflow and sizes no allocator can satisfy.
inline constexpr std::size_t max_allocation_bytes = std::size_t{1} << 40;  // 1 TiB

template <class T>
std::size_t checked_bytes(std::size_t count, std::string_view what, std::string_view label) {
  CONVEYOR_EXPECTS(count <= max_allocation_bytes / sizeof(T),
                   std::string(what) + " allocation of " + std::to_string(count) + " x " +
                       std::to_string(sizeof(T)) + " bytes for pool '" + std::string(label) +
                       "' exceeds the 1 TiB limit; check the units (elements, not bytes)");
  return count * sizeof(T);
}

inline void check_copy_sizes(std::size_t dst, std::size_t src, const char* what) {
  CONVEYOR_EXPECTS(dst == src, std::string(what) + ": destination has " + std::to_string(dst) +
                                   " elements but source has " + std::to_string(src) +
                                   "; copy a subspan of the larger one");
}

}  // namespace conveyor::detail
