// conveyor/ring/detail/access.hpp: the rings' internal calls that the pipeline's stage
// loops use on their hot path.
//
//   auto v = detail::ring_access::take(ring, &position);   // = ring.try_pop(&position),
//                                                          //   always inlined
//   detail::wait_timing t;                                 // = ring.pop(&position), and
//   auto w = detail::ring_access::pop(ring, &position, &t);  // what its waits cost
//   bool ok = detail::ring_access::push(ring, std::move(x), &t);
//   std::size_t n = detail::ring_access::drain(ring, f, 32);  // f(T&&) on up to 32 there
//
// Thread-safety: as the ring's member called.
#pragma once

#include <cstddef>
#include <cstdint>

#include "conveyor/base/config.hpp"
#include "conveyor/ring/detail/wait.hpp"

namespace conveyor {
template <class T>
class spsc_ring;
}  // namespace conveyor

namespace conveyor::detail {

struct ring_access {
  // spsc_ring::try_pop(position), forced inline (see spsc_ring::take for why only here).
  template <class Ring>
  CONVEYOR_HOT_INLINE static auto take(Ring& ring, std::size_t* position) noexcept(
      noexcept(ring.take(position))) {
    return ring.take(position);
  }

  // spsc_ring's burst: f(T&&) on each element there now, up to max (see spsc_ring::drain).
  template <class T, class F>
  CONVEYOR_HOT_INLINE static std::size_t drain(spsc_ring<T>& ring, F& f, std::size_t max) noexcept {
    return ring.drain(f, max);
  }

  // The blocking pop() and push() of spsc_ring and mpmc_ring, adding what their waits
  // cost to *timing (see wait_timing): a caller that measures its waits (a pipeline
  // stage) waits exactly as one that does not.
  template <class Ring>
  static auto pop(Ring& ring, std::size_t* position, wait_timing* timing) noexcept(
      noexcept(ring.pop_impl(position, nullptr, timing))) {
    return ring.pop_impl(position, nullptr, timing);
  }
  template <class Ring, class T>
  static bool push(Ring& ring, T&& v, wait_timing* timing) noexcept(
      noexcept(ring.push_impl(std::move(v), timing))) {
    return ring.push_impl(std::move(v), timing);
  }

  // Marks, for a link that moves its producer and consumer to another spsc_ring (see
  // spsc_ring's "Marks"): the producer leaves one (false: full or closed), or waits for
  // room to leave one (false: closed); the consumer takes one (false: none there).
  template <class T>
  static bool try_mark(spsc_ring<T>& ring) noexcept {
    return ring.try_mark();
  }
  template <class T>
  static bool wait_room(spsc_ring<T>& ring, wait_timing* timing) noexcept {
    return ring.wait_room(timing);
  }
  template <class T>
  static bool take_mark(spsc_ring<T>& ring) noexcept {
    return ring.take_mark();
  }

  // Lets the ring's sleepers accept batched wake-ups under load (see wait_point::
  // batch_wakes). For a pipeline's rings only: they outlive the stage threads, the only
  // threads that put wake-ups off and keep pointers to them meanwhile. Call before the
  // ring is shared.
  template <class Ring>
  static void batch_wakes(Ring& ring) noexcept {
    const auto batch = static_cast<std::uint32_t>(ring.capacity() / 2);
    ring.not_empty_.batch_wakes(batch);
    ring.not_full_.batch_wakes(batch);
  }

  // The wait points of either ring, for tests: where consumers and producers sleep.
  template <class Ring>
  static wait_point& not_empty(Ring& ring) noexcept {
    return ring.not_empty_;
  }
  template <class Ring>
  static wait_point& not_full(Ring& ring) noexcept {
    return ring.not_full_;
  }
};

}  // namespace conveyor::detail
