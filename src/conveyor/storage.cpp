// src/conveyor/storage.cpp: the rings' capacity check (conveyor/ring/detail/storage.hpp).
#include "conveyor/ring/detail/storage.hpp"

#include <string>

#include "conveyor/base/config.hpp"

namespace conveyor::detail {

void check_ring_capacity(const char* ring, std::size_t capacity) {
  CONVEYOR_EXPECTS(capacity >= 2 && capacity <= max_ring_capacity && is_power_of_two(capacity),
                   std::string(ring) + ": capacity must be a power of two in [2, 2^30], got " +
                       std::to_string(capacity) + "; pass " +
                       std::to_string(next_power_of_two(capacity)) + " instead");
}

}  // namespace conveyor::detail
