// conveyor/base/power_of_two.hpp: the power-of-two sizes rings, windows and pools use (a
// slot is found with a mask, not a division).
//
//   if (!conveyor::detail::is_power_of_two(n)) ...
//   std::size_t window = conveyor::detail::next_power_of_two(4 * workers + 60);
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>

namespace conveyor::detail {

// Largest capacity a ring accepts: far above any sane in-flight bound, low enough that
// a typo (a byte count, -1 cast to size_t) fails loudly instead of allocating the host.
inline constexpr std::size_t max_ring_capacity = std::size_t{1} << 30;

constexpr bool is_power_of_two(std::size_t n) noexcept { return n != 0 && (n & (n - 1)) == 0; }

// The smallest power of two >= n, at least 2 and at most max_ring_capacity.
constexpr std::size_t next_power_of_two(std::size_t n) noexcept {
  std::size_t p = 2;
  while (p < n && p < max_ring_capacity) p <<= 1;
  return p;
}

}  // namespace conveyor::detail
