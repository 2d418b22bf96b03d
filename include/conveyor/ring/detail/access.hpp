// conveyor/ring/detail/access.hpp: the rings' internal calls that the pipeline's stage
// loops use on their hot path.
//
//   auto v = detail::ring_access::take(ring, &position);   // = ring.try_pop(&position),
//                                                          //   always inlined
//
// Thread-safety: as the ring's member called.
#pragma once

#include <cstddef>

#include "conveyor/config.hpp"

namespace conveyor::detail {

struct ring_access {
  // spsc_ring::try_pop(position), forced inline (see spsc_ring::take for why only here).
  template <class Ring>
  CONVEYOR_HOT_INLINE static auto take(Ring& ring, std::size_t* position) noexcept(
      noexcept(ring.take(position))) {
    return ring.take(position);
  }
};

}  // namespace conveyor::detail
