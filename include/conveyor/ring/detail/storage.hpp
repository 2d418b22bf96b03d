// conveyor/ring/detail/storage.hpp: capacity checks, cache-line-aligned raw storage and
// how push() takes its element, shared by spsc_ring and mpmc_ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <type_traits>

#include "conveyor/base/config.hpp"
#include "conveyor/base/power_of_two.hpp"

namespace conveyor::detail {

// @throws config_error unless capacity is a power of two in [2, max_ring_capacity]; the
// message names the ring and the capacity to pass instead (src/conveyor/storage.cpp).
void check_ring_capacity(const char* ring, std::size_t capacity);

// Whether a ring's push() takes T by value: then it never takes its element's address, so
// a caller's loop keeps a small element in registers instead of storing it to the stack
// and reading it back for each push. Any other T is taken by reference and copied or
// moved once, into its slot, not first into the parameter.
template <class T>
inline constexpr bool push_by_value =
    std::is_trivially_copyable_v<T> && sizeof(T) <= 2 * sizeof(std::uint64_t);

// Owns `count` uninitialized objects of type Slot, aligned to a cache line, with one
// line of padding on each side so neighbours on the heap never share a line with a slot.
template <class Slot>
class aligned_slots {
 public:
  explicit aligned_slots(std::size_t count)
      : raw_(static_cast<std::byte*>(
            ::operator new(bytes(count), std::align_val_t{cache_line_size}))) {}
  ~aligned_slots() { ::operator delete(raw_, std::align_val_t{cache_line_size}); }
  aligned_slots(const aligned_slots&) = delete;
  aligned_slots& operator=(const aligned_slots&) = delete;

  // Storage only: callers placement-new into it and std::launder what they read back.
  Slot* data() const noexcept { return reinterpret_cast<Slot*>(raw_ + cache_line_size); }

 private:
  static std::size_t bytes(std::size_t count) {
    static_assert(cache_line_size % alignof(Slot) == 0,
                  "ring element alignment above conveyor::cache_line_size is not supported");
    return count * sizeof(Slot) + 2 * cache_line_size;
  }
  std::byte* raw_;
};

}  // namespace conveyor::detail
