// conveyor/pipeline/growth.hpp: when a ring between two stage threads deepens
// (pipeline_options::ring_growth).
//
//   ring.grow(detail::ring_deepens(where, p, ring.reserve()));  // the ring after stage p
//
// Two stage threads pinned to one CPU take turns on it: the producer runs until the ring
// is full, the consumer until it is empty, and every turn costs a context switch. A
// deeper ring makes the turns longer and so fewer. The ring between two pinned CPUs
// next to such a pair deepens with it: while a stage at its end is switched out for a
// turn of its neighbour, the ring must take what the far side sends (or hold what it
// needs) for that long, or the far CPU stalls; the turns last a grown ring's worth.
// A ring moves to its reserve while its consumer works through the reserve's worth
// within shared_core_hold_s of its own CPU time (consumer_ns: its CPU time per element,
// the placer's load): the deeper ring adds about that to an element's wait when it is
// full and the consumer has the CPU, and a ring in front of a stage that needs more than
// shared_core_hold_s / reserve per element (122 ns for 8192) never grows. By CPU time,
// not by the rate the consumer took elements at: on a shared core that rate is what the
// small ring's turns leave.
// Thread-safety: shared_core_grows and ring_deepens are pure functions; a growable_ring's
// grow() from one thread at a time (the placer's).
#pragma once

#include <cstddef>

#include "conveyor/stage/detail/link.hpp"

namespace conveyor::detail {

struct chain_placement;  // pipeline/placement.hpp

inline constexpr double shared_core_hold_s = 1e-3;

constexpr bool shared_core_grows(std::size_t reserve, double consumer_ns) noexcept {
  return consumer_ns > 0 && static_cast<double>(reserve) * consumer_ns <= shared_core_hold_s * 1e9;
}

// Whether the ring after stage `producer`, with a reserve of `reserve` slots, runs in its
// reserve under the placement `where`: its two stages take turns on one CPU, or it runs
// between two pinned CPUs and a stage at one of its ends takes turns with its other
// neighbour; and its consumer works through the reserve within shared_core_hold_s.
bool ring_deepens(const chain_placement& where, std::size_t producer, std::size_t reserve) noexcept;

// A ring the placer may deepen, whatever its element type.
class growable_ring {
 public:
  virtual ~growable_ring() = default;
  virtual std::size_t reserve() const noexcept = 0;  // the deeper ring's capacity
  virtual void grow(bool deeper) noexcept = 0;       // see ring_link::grow()
  virtual std::size_t deepest() const noexcept = 0;  // the deepest it ran
};

// A stage link as a growable_ring (it must can_grow()).
template <class T>
class growable_link final : public growable_ring {
 public:
  explicit growable_link(ring_link<T>& l) noexcept : l_(l) {}
  std::size_t reserve() const noexcept override { return l_.reserve(); }
  void grow(bool deeper) noexcept override { l_.grow(deeper); }
  std::size_t deepest() const noexcept override { return l_.deepest(); }

 private:
  ring_link<T>& l_;
};

}  // namespace conveyor::detail
