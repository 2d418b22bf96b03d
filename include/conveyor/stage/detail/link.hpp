// conveyor/stage/detail/link.hpp: the ring between two stages, SPSC where it can be.
//
//   detail::ring_link<envelope<int>> ring{1024, {.pushers = 1, .poppers = 1}};  // an spsc_ring
//   detail::ring_link<envelope<int>> fan{1024, {.pushers = 1, .poppers = 3}};   // an mpmc_ring
//   ring.push(std::move(e));  auto e = ring.pop();                       // either way
//
// A hop between stages is the whole per-item cost of a pipeline of cheap stages, and an
// SPSC hop is several times cheaper than an MPMC one: no compare-and-swap on a shared
// index, slots packed instead of one per cache line. Most hops have exactly one thread
// on each side (a source, a batcher, a one-worker map, an ordered map's emitter, a
// one-worker sink), so the pipeline asks each stage how many
// threads may push to its output and pop from its input *at the same time*, and picks
// spsc_ring when both are 1. "At the same time" matters: an ordered map's workers take
// turns emitting under the reorder buffer's emitter flag, whose handover (release by one
// emitter, acquire by the next) orders their pushes as spsc_ring requires.
//
// The choice is made once at construction; every call is one predictable branch.
//
// Thread-safety: as the ring chosen: with ends{1, 1} one pushing and one popping thread
// at a time (happens-before ordered if they change); otherwise any threads. close(),
// closed(), capacity() and size_approx() from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>

#include "conveyor/ring/mpmc_ring.hpp"
#include "conveyor/ring/spsc_ring.hpp"

namespace conveyor::detail {

// How many threads may push to / pop from one ring at the same time.
struct ring_ends {
  std::size_t pushers = 1;
  std::size_t poppers = 1;
  bool single() const noexcept { return pushers == 1 && poppers == 1; }
};

// Threads that push or pop concurrently "without limit" (e.g. submit() callers).
inline constexpr std::size_t any_threads = ~std::size_t{0};

template <class T>
class ring_link {
 public:
  using value_type = T;

  // @throws config_error unless capacity is a power of two in [2, 2^30].
  ring_link(std::size_t capacity, ring_ends ends) {
    if (ends.single())
      spsc_.emplace(capacity);
    else
      mpmc_.emplace(capacity);
  }

  bool is_spsc() const noexcept { return spsc_.has_value(); }

  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_push(T&& v) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return spsc_ ? spsc_->try_push(std::move(v)) : mpmc_->try_push(std::move(v));
  }
  // As try_push(T(args...)), constructed in the ring's slot (see spsc_ring::try_emplace).
  template <class... Args>
    requires std::is_nothrow_constructible_v<T, Args&&...>
  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_emplace(Args&&... args) noexcept {
    return spsc_ ? spsc_->try_emplace(std::forward<Args>(args)...)
                 : mpmc_->try_emplace(std::forward<Args>(args)...);
  }
  // Blocks while full; false (v dropped) once closed. With timing: adds what its waits
  // cost to *timing (see detail::wait_timing).
  CONVEYOR_HOT_INLINE bool push(T v, wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return spsc_ ? ring_access::push(*spsc_, std::move(v), timing)
                 : ring_access::push(*mpmc_, std::move(v), timing);
  }
  // position: how many elements were pushed before this one (see mpmc_ring::try_pop).
  CONVEYOR_HOT_INLINE std::optional<T> try_pop(std::size_t* position = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return spsc_ ? ring_access::take(*spsc_, position) : mpmc_->try_pop(position);
  }
  // Blocks while empty; nullopt only when closed and drained. With timing: adds what its
  // waits cost to *timing (see detail::wait_timing).
  CONVEYOR_HOT_INLINE std::optional<T> pop(std::size_t* position = nullptr,
                                           wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return spsc_ ? ring_access::pop(*spsc_, position, timing)
                 : ring_access::pop(*mpmc_, position, timing);
  }
  std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return spsc_ ? spsc_->pop_until(deadline) : mpmc_->pop_until(deadline);
  }

  void close() noexcept { spsc_ ? spsc_->close() : mpmc_->close(); }
  bool closed() const noexcept { return spsc_ ? spsc_->closed() : mpmc_->closed(); }
  std::size_t capacity() const noexcept { return spsc_ ? spsc_->capacity() : mpmc_->capacity(); }
  std::size_t size_approx() const noexcept {
    return spsc_ ? spsc_->size_approx() : mpmc_->size_approx();
  }

 private:
  // Exactly one is engaged, for the object's whole life.
  std::optional<spsc_ring<T>> spsc_;
  std::optional<mpmc_ring<T>> mpmc_;
};

}  // namespace conveyor::detail
