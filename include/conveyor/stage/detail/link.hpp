// conveyor/stage/detail/link.hpp: the ring between two stages, SPSC where it can be.
//
//   detail::ring_link<envelope<int>> ring{1024, {.pushers = 1, .poppers = 1}};  // an spsc_ring
//   detail::ring_link<envelope<int>> fan{1024, {.pushers = 1, .poppers = 3}};   // an mpmc_ring
//   ring.push(std::move(e));  auto e = ring.pop();                       // either way
//   ring.drain(f, 32);  // an SPSC link's consumer: f(e) on each of up to 32 there now
//   detail::ring_link<envelope<int>> lanes{1024, {.pushers = 2, .poppers = 3, .lanes = true}};
//   lanes.port(1).push(std::move(e));  auto e = lanes.port(2).pop();      // per thread
//   detail::ring_link<envelope<int>> deep{1024, {1, 1}, 8192};  // may move to 8192 slots
//   deep.grow(true);                                             // any thread
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
// Lanes: an ordered map with W workers does not need to share one ring among them and
// restore the order behind them (an MPMC claim, a reorder slot and an emitter handover
// per item, each a contended cache line). Where the
// stage before it deals items in order (one pushing thread, or another such map) and the
// stage after it takes them in order (one popping thread, or another such map), the hop
// is ends{P, C, .lanes = true}: P x C spsc_rings, and element n (counted from 0 over
// the hop) goes from pusher n % P to popper n % C through lane (n % P, n % C). Each end
// keeps its own count, so each knows its next lane, and the order survives any number
// of workers on either side with no shared write at all. Each thread of such a side
// uses its own end: port(i). Progress: the oldest element not yet popped is never
// stuck behind a full lane (every element its pusher pushed before it to that lane is
// older, hence popped), so bounded lanes cannot deadlock. Each lane has the link's
// capacity (a worker may run a lane ahead of a stalled one); only lanes some n uses are
// made (p == c mod gcd(P, C): the diagonal where P == C).
//
// The choice is made once at construction; every call is one predictable branch (two
// for the lanes and the MPMC ring; none through a lane_port(), for a thread that knows
// its link has lanes).
//
// Growing: an SPSC link may be given a reserve (a deeper ring beside its ring). grow(true)
// asks its producer to move there, grow(false) to move back. The producer moves at its
// next push that finds the ring full (where a deeper ring pays: one that never fills
// holds few elements whatever its size; a blocking push() counts too, the stages try
// first): it records how many elements it had pushed to the link so far (the switch
// point), goes on in the other ring, and wakes the consumer in case it sleeps in the
// ring left. The consumer takes elements from its ring until it has taken as many as the
// switch point says, then follows. The other ring is empty when the producer moves into
// it (it moves again only after the consumer has followed), each ring is FIFO, and the
// switch points chain the stretches, so the order holds however often the producer moves
// back and forth. Every SPSC link takes this path, reserve or not (a stage's loop then
// inlines one SPSC path, not two): its common push (a ring with room) and pop (an element
// there) cost the ring's, plus a count on each side (popped(): what the positions of its
// pops count). The pipeline asks a ring to grow where its two stage threads share a CPU
// (see pipeline.hpp, ring_growth). The reserve is made at the first grow(true), on the
// caller's thread, and kept until the link goes: a link that never grows costs no more
// memory than one that cannot. close() and the reserve's making exclude each other (a
// spin flag, both rare), so a reserve is either made before a close() closes it too, or
// not made at all: no producer moves into a ring left open after close().
//
// Thread-safety: as the ring chosen: with ends{1, 1} one pushing and one popping thread
// at a time (happens-before ordered if they change); with lanes the same for each end
// (port) of either side; otherwise any threads. close(), closed(), capacity(),
// size_approx(), can_grow(), reserve(), deepest() from any thread, grow() from one
// thread at a time (the placer's); take_any() only once no thread pushes or pops.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <numeric>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/box.hpp"
#include "conveyor/base/config.hpp"
#include "conveyor/base/cpu_relax.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/ring/mpmc_ring.hpp"
#include "conveyor/ring/spsc_ring.hpp"
#include "conveyor/stage/detail/envelope.hpp"

namespace conveyor::detail {

// How many threads may push to / pop from one ring at the same time.
// With lanes: pushers and poppers are the threads of each side, each with its own end.
struct ring_ends {
  std::size_t pushers = 1;
  std::size_t poppers = 1;
  bool lanes = false;
  bool single() const noexcept { return pushers == 1 && poppers == 1; }
};

// Threads that push or pop concurrently "without limit" (e.g. submit() callers).
inline constexpr std::size_t any_threads = ~std::size_t{0};

// The SPSC ring of a hop between stages: spsc_ring's default layout for the envelope,
// the one a plain user gets (line_turns up to 28 bytes: three envelopes of a 64-bit
// value per line); over slot_turns the trivial chain moved fewer items (RESULTS.md).
template <class T>
using hop_ring = spsc_ring<T>;

// Which ring a port's calls go to: whichever the link has (asked on every call), or its
// lanes, where its user knows the link has them.
enum class port_kind { any, lanes };

template <class T, port_kind Kind = port_kind::any>
class ring_port;

template <class T>
class ring_link {
 public:
  using value_type = T;

  // @throws config_error unless capacity (and a reserve above it) is a power of two in
  // [2, 2^30]. reserve: the deeper ring an SPSC link may grow into (see "Growing"); none
  // at or below capacity, or on other links.
  // Its rings' sleepers accept batched wake-ups under load (see detail::wait_point): the
  // stage threads that put them off end before the link does.
  ring_link(std::size_t capacity, ring_ends ends, std::size_t reserve = 0) {
    if (ends.lanes && !ends.single()) {
      lanes_ = make_box<lane_set>(capacity, ends.pushers, ends.poppers);
    } else if (ends.single()) {
      batch_wakeups(spsc_.emplace(capacity));
      grow_.emplace(reserve > capacity ? reserve : capacity, &*spsc_);
    } else {
      batch_wakeups(mpmc_.emplace(capacity));
    }
  }

  // Out of line: one copy for all of a pipeline's links, not one inlined per link.
  [[gnu::noinline]] ~ring_link() = default;
  ring_link(const ring_link&) = delete;
  ring_link& operator=(const ring_link&) = delete;

  // A pipeline's rings let their sleepers accept a wake-up put off for half a ring.
  template <class Ring>
  static Ring& batch_wakeups(Ring& ring) noexcept {
    ring.batch_wakeups(static_cast<std::uint32_t>(ring.capacity() / 2));
    return ring;
  }

  bool is_spsc() const noexcept { return spsc_.has_value(); }
  bool is_lanes() const noexcept { return lanes_ != nullptr; }

  // Whether the link has a reserve to grow into.
  bool can_grow() const noexcept { return grow_ && grow_->reserve > spsc_->capacity(); }
  // Asks the producer to move to the reserve (true) or back (false); see "Growing".
  // The first grow(true) makes the reserve; if that fails (out of memory), the link
  // stays where it is.
  void grow(bool deep) noexcept {
    if (!can_grow()) return;
    if (deep && grow_->deep.load(std::memory_order_relaxed) == nullptr && !grow_->make_deep())
      return;  // relaxed: only this thread (grow()'s) writes the pointer
    // release: pairs with the producer's acquire in move_wanted(): a producer asked to
    // move sees the reserve made. The elements themselves follow the switch points.
    grow_->want_deep.store(deep, std::memory_order_release);
  }
  // The reserve's capacity (capacity() for a link that cannot grow), and the deepest
  // ring the producer has moved to so far.
  std::size_t reserve() const noexcept { return grow_ ? grow_->reserve : capacity(); }
  // How many elements the consumer has taken (an SPSC link; else 0): what the positions
  // of its pops count, across the moves between the two rings.
  std::size_t popped() const noexcept {
    return grow_ ? grow_->popped.load(std::memory_order_relaxed) : 0;  // relaxed: a count
  }
  std::size_t deepest() const noexcept {
    // relaxed: a statistic, exact after join.
    return grow_ && grow_->grew.load(std::memory_order_relaxed) ? reserve() : capacity();
  }

  // End i of the side that has several threads, for that thread alone (with lanes; on
  // other links every port is the link itself). The plain calls below are port 0's.
  ring_port<T> port(std::size_t i) noexcept { return ring_port<T>(this, i); }
  // As port(i), for a thread that knows the link has lanes (is_lanes()): its calls go to
  // its lane without asking which ring the link has.
  ring_port<T, port_kind::lanes> lane_port(std::size_t i) noexcept { return {this, i}; }

  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_push(T&& v) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return try_push_at(0, std::move(v));
  }
  // As try_push(T(args...)), constructed in the ring's slot (see spsc_ring::try_emplace).
  template <class... Args>
    requires std::is_nothrow_constructible_v<T, Args&&...>
  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_emplace(Args&&... args) noexcept {
    return try_emplace_at(0, std::forward<Args>(args)...);
  }
  // Blocks while full; false (v dropped) once closed. With timing: adds what its waits
  // cost to *timing (see detail::wait_timing).
  CONVEYOR_HOT_INLINE bool push(T v, wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return push_at(0, std::move(v), timing);
  }
  // position: how many elements were pushed before this one (see mpmc_ring::try_pop).
  CONVEYOR_HOT_INLINE std::optional<T> try_pop(std::size_t* position = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    return try_pop_at(0, position);
  }
  // Whether drain() works here: an SPSC link (growing or not), whose one consumer may
  // take what is there in bursts.
  bool can_drain() const noexcept { return spsc_.has_value(); }
  // The consumer of an SPSC link (can_drain()): f(T&&) on each element there now, up to
  // max, in order, past a switch point into the other ring of a growing link; f returns false to
  // stop after its element. How many f was given (0: none there). See spsc_ring::drain.
  template <class F>
  CONVEYOR_HOT_INLINE std::size_t drain(F& f, std::size_t max) noexcept {
    return grow_->drain(f, max);
  }
  // Blocks while empty; nullopt only when closed and drained. With timing: adds what its
  // waits cost to *timing (see detail::wait_timing).
  CONVEYOR_HOT_INLINE std::optional<T> pop(
      std::size_t* position = nullptr,
      wait_timing* timing = nullptr) noexcept(std::is_nothrow_move_constructible_v<T>) {
    return pop_at(0, position, timing);
  }
  std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    if (spsc_) return grow_->pop_until(deadline);
    if (mpmc_) return mpmc_->pop_until(deadline);
    return lanes_->pop_until(0, deadline);
  }
  // Once no thread pushes or pops (after join): any element left, from any lane.
  std::optional<T> take_any() noexcept(std::is_nothrow_move_constructible_v<T>) {
    if (spsc_) {  // both rings
      for (hop_ring<T>* ring : {&*spsc_, grow_->deep.load(std::memory_order_acquire)})
        if (ring != nullptr)  // null: no reserve made
          if (auto v = ring->try_pop()) return v;
      return std::nullopt;
    }
    if (mpmc_) return mpmc_->try_pop();
    for (auto& lane : lanes_->rings)
      if (lane)
        if (auto v = lane->try_pop()) return v;
    return std::nullopt;
  }

  void close() noexcept {
    if (grow_) grow_->close_deep();  // and no reserve is made from now on (see "Growing")
    if (spsc_) return spsc_->close();
    if (mpmc_) return mpmc_->close();
    for (auto& lane : lanes_->rings)
      if (lane) lane->close();
  }
  bool closed() const noexcept {
    if (spsc_) return spsc_->closed();
    if (mpmc_) return mpmc_->closed();
    return lanes_->rings.front()->closed();  // lane (0, 0) is always made
  }
  // With lanes: of all lanes together.
  std::size_t capacity() const noexcept {
    if (spsc_) return spsc_->capacity();
    if (mpmc_) return mpmc_->capacity();
    std::size_t n = 0;
    for (const auto& lane : lanes_->rings)
      if (lane) n += lane->capacity();
    return n;
  }
  std::size_t size_approx() const noexcept {
    if (spsc_) {
      const hop_ring<T>* deep = grow_->deep.load(std::memory_order_acquire);
      return spsc_->size_approx() + (deep ? deep->size_approx() : 0);
    }
    if (mpmc_) return mpmc_->size_approx();
    std::size_t n = 0;
    for (const auto& lane : lanes_->rings)
      if (lane) n += lane->size_approx();
    return n;
  }

 private:
  template <class, port_kind>
  friend class ring_port;

  // The calls of end `end` (a port): with lanes, that end's lane; else the one ring.
  CONVEYOR_HOT_INLINE bool try_push_at(std::size_t end,
                                       T&& v) noexcept(std::is_nothrow_move_constructible_v<T>) {
    if (spsc_) return grow_->try_push(std::move(v));
    if (mpmc_) return mpmc_->try_push(std::move(v));
    return lanes_->try_push(end, std::move(v));
  }
  template <class... Args>
  CONVEYOR_HOT_INLINE bool try_emplace_at(std::size_t end, Args&&... args) noexcept {
    if (spsc_) return grow_->try_emplace(std::forward<Args>(args)...);
    if (mpmc_) return mpmc_->try_emplace(std::forward<Args>(args)...);
    return lanes_->try_emplace(end, std::forward<Args>(args)...);
  }
  // The blocking calls come after a try found the ring full or empty: left to the
  // compiler (a stage inlines them in each of its waits otherwise).
  bool push_at(std::size_t end, T&& v,
               wait_timing* timing) noexcept(std::is_nothrow_move_constructible_v<T>) {
    if (spsc_) return grow_->push(std::move(v), timing);
    if (mpmc_) return mpmc_->push(std::move(v), timing);
    return lanes_->push(end, std::move(v), timing);
  }
  CONVEYOR_HOT_INLINE std::optional<T> try_pop_at(std::size_t end, std::size_t* position) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    if (spsc_) return grow_->try_pop(position);
    if (mpmc_) return mpmc_->try_pop(position);
    return lanes_->try_pop(end, position);
  }
  std::optional<T> pop_at(std::size_t end, std::size_t* position,
                          wait_timing* timing) noexcept(std::is_nothrow_move_constructible_v<T>) {
    if (spsc_) return grow_->pop(position, timing);
    if (mpmc_) return mpmc_->pop(position, timing);
    return lanes_->pop(end, position, timing);
  }

  // The lanes and each end's count. Pusher p's m-th element is n = p + m * P, so its lane
  // is (p, n % C), and n % C advances by P % C per element; likewise popper c's m-th is
  // n = c + m * C, from lane (n % P, c). Each end is written by its own thread only.
  struct lane_set {
    lane_set(std::size_t capacity, std::size_t pushers, std::size_t poppers)
        : P(pushers),
          C(poppers),
          push_step(pushers % poppers),
          pop_step(poppers % pushers),
          rings(pushers * poppers),
          pushed(pushers),
          popped(poppers) {
      const std::size_t g = std::gcd(P, C);
      for (std::size_t p = 0; p < P; ++p)
        for (std::size_t c = 0; c < C; ++c)
          if (p % g == c % g) {
            rings[p * C + c] = make_box<hop_ring<T>>(capacity);
            batch_wakeups(*rings[p * C + c]);
          }
      for (std::size_t p = 0; p < P; ++p) pushed[p].lane = p % C;
      for (std::size_t c = 0; c < C; ++c) {
        popped[c].lane = c % P;
        popped[c].n = c;
      }
    }

    struct alignas(cache_line_size) end_state {
      std::size_t lane = 0;  // the other side's index of the next element's lane
      std::size_t n = 0;     // poppers: the next element's number over the hop
    };

    CONVEYOR_HOT_INLINE hop_ring<T>& push_lane(std::size_t p) noexcept {
      return *rings[p * C + pushed[p].lane];
    }
    CONVEYOR_HOT_INLINE hop_ring<T>& pop_lane(std::size_t c) noexcept {
      return *rings[popped[c].lane * C + c];
    }
    CONVEYOR_HOT_INLINE void pushed_one(std::size_t p) noexcept {
      pushed[p].lane = advance(pushed[p].lane, push_step, C);
    }
    CONVEYOR_HOT_INLINE void popped_one(std::size_t c, std::size_t* position) noexcept {
      end_state& e = popped[c];
      if (position) *position = e.n;
      e.n += C;
      e.lane = advance(e.lane, pop_step, P);
    }
    CONVEYOR_HOT_INLINE static std::size_t advance(std::size_t i, std::size_t step,
                                                   std::size_t n) noexcept {
      i += step;
      return i >= n ? i - n : i;
    }

    CONVEYOR_HOT_INLINE bool try_push(std::size_t p,
                                      T&& v) noexcept(std::is_nothrow_move_constructible_v<T>) {
      if (!push_lane(p).try_push(std::move(v))) return false;
      pushed_one(p);
      return true;
    }
    template <class... Args>
    CONVEYOR_HOT_INLINE bool try_emplace(std::size_t p, Args&&... args) noexcept {
      if (!push_lane(p).try_emplace(std::forward<Args>(args)...)) return false;
      pushed_one(p);
      return true;
    }
    bool push(std::size_t p, T&& v,
              wait_timing* timing) noexcept(std::is_nothrow_move_constructible_v<T>) {
      if (!push_lane(p).push(std::move(v), timing)) return false;
      pushed_one(p);
      return true;
    }
    CONVEYOR_HOT_INLINE std::optional<T> try_pop(std::size_t c, std::size_t* position) noexcept(
        std::is_nothrow_move_constructible_v<T>) {
      auto v = pop_lane(c).try_pop();
      if (v) popped_one(c, position);
      return v;
    }
    // nullopt: the lane of this popper's next element is closed and drained. The
    // element does not exist then: its pusher has pushed everything it will.
    std::optional<T> pop(std::size_t c, std::size_t* position,
                         wait_timing* timing) noexcept(std::is_nothrow_move_constructible_v<T>) {
      auto v = pop_lane(c).pop(nullptr, timing);
      if (v) popped_one(c, position);
      return v;
    }
    std::optional<T> pop_until(std::size_t c,
                               std::chrono::steady_clock::time_point
                                   deadline) noexcept(std::is_nothrow_move_constructible_v<T>) {
      auto v = pop_lane(c).pop_until(deadline);
      if (v) popped_one(c, nullptr);
      return v;
    }

    const std::size_t P, C, push_step, pop_step;
    std::vector<box<hop_ring<T>>> rings;  // lane (p, c) at p * C + c; null: unused
    std::vector<end_state> pushed, popped;
  };

  // A link that can grow: the reserve, and which ring each side uses now (each side's
  // state on a line of its own: it reads it on every call, the other side never).
  // position: for an SPSC link, how many elements were popped before (counted here:
  // each ring counts only its own).
  struct grow_set {
    static constexpr std::size_t no_switch = ~std::size_t{0};

    grow_set(std::size_t reserve_slots, hop_ring<T>* shallow)
        : reserve(reserve_slots), shallow_(shallow), in(shallow), out(shallow) {}

    // grow()'s thread: makes the reserve and publishes it; false when out of memory or
    // after close() (see "Growing").
    bool make_deep() noexcept {
      lock();
      if (!closing_) {
        try {
          made_ = make_box<hop_ring<T>>(reserve);
          batch_wakeups(*made_);
          // release: pairs with the acquire loads of deep; the ring is constructed.
          deep.store(made_.get(), std::memory_order_release);
        } catch (...) {
        }
      }
      unlock();
      return made_ != nullptr;
    }
    // close()'s: closes the reserve if made, and no reserve is made after it.
    void close_deep() noexcept {
      lock();
      closing_ = true;
      // relaxed: written under the same flag, by make_deep().
      if (hop_ring<T>* d = deep.load(std::memory_order_relaxed)) d->close();
      unlock();
    }
    // acquire: pairs with unlock()'s release; the previous holder's writes are visible.
    void lock() noexcept {
      while (guard_.exchange(true, std::memory_order_acquire)) cpu_relax();
    }
    void unlock() noexcept { guard_.store(false, std::memory_order_release); }

    // The ring a side goes on in after the one it is in.
    hop_ring<T>* other(hop_ring<T>* from) const noexcept {
      // acquire: pairs with make_deep()'s release (the producer moves only after it saw
      // the reserve; the consumer follows the producer's switch point, whose release
      // store comes after it).
      return from == shallow_ ? deep.load(std::memory_order_acquire) : shallow_;
    }

    // The producer's push after its try found the ring full (or a blocking push() of
    // its own): where it is asked to move, and the consumer has followed its last move,
    // it moves (see "Growing"); else it waits for room.
    bool push(T&& v, wait_timing* timing) noexcept(std::is_nothrow_move_constructible_v<T>) {
      if (move_wanted() && followed()) {
        hop_ring<T>* left = in;
        // release: pairs with the consumer's acquire in at_switch(); every element pushed
        // to the ring left (each published by that ring's own release) is visible to a
        // consumer that sees the switch point.
        switch_at.store(pushed, std::memory_order_release);
        in = other(in);
        // relaxed: a statistic (deepest()).
        if (in != shallow_) grew.store(true, std::memory_order_relaxed);
        left->wake_consumer();  // it may sleep in the ring left, waiting for no more
      }
      if (!in->push(std::move(v), timing)) return false;  // closed: v dropped
      ++pushed;
      return true;
    }
    CONVEYOR_HOT_INLINE bool try_push(T&& v) noexcept(std::is_nothrow_move_constructible_v<T>) {
      if (!in->try_push(std::move(v))) return false;
      ++pushed;
      return true;
    }
    template <class... Args>
    CONVEYOR_HOT_INLINE bool try_emplace(Args&&... args) noexcept {
      if (!in->try_emplace(std::forward<Args>(args)...)) return false;
      ++pushed;
      return true;
    }
    bool move_wanted() const noexcept {
      // acquire: pairs with grow()'s release: asked to move, the producer sees the reserve.
      return want_deep.load(std::memory_order_acquire) != (in != shallow_);
    }
    // The producer: the consumer has followed its last move (the other ring is empty).
    bool followed() const noexcept {
      // acquire: pairs with the consumer's release in follow(); it has left the other
      // ring, and taken all it held.
      return switch_at.load(std::memory_order_acquire) == no_switch;
    }

    // The consumer: the next element, past a switch point into the other ring. Inlined
    // into the stage's loop, the switch out of line.
    CONVEYOR_HOT_INLINE std::optional<T> try_pop(std::size_t* position) noexcept(
        std::is_nothrow_move_constructible_v<T>) {
      std::optional<T> v = out->try_pop();
      if (v) [[likely]]
        counted(position);
      else
        past_switch(v, position);
      return v;
    }
    [[gnu::noinline]] void past_switch(std::optional<T>& v, std::size_t* position) noexcept(
        std::is_nothrow_move_constructible_v<T>) {
      if (at_switch()) follow();
      // After the acquire in at_switch(), the elements before a switch point still to
      // come are visible: they, or the other ring's first, may be there now.
      if (std::optional<T> w = out->try_pop()) {
        v.emplace(std::move(*w));
        counted(position);
      }
    }
    // The consumer: whether it has taken every element before a switch point the
    // producer left (the ring it is in is then empty for good).
    bool at_switch() const noexcept {
      // acquire: pairs with the producer's release store in push().
      return switch_at.load(std::memory_order_acquire) ==
             popped.load(std::memory_order_relaxed);  // relaxed: the consumer's own count
    }
    void follow() noexcept {
      out = other(out);
      // release: pairs with the producer's acquire in followed(); the consumer is done
      // with the ring it left.
      switch_at.store(no_switch, std::memory_order_release);
    }

    std::optional<T> pop(std::size_t* position,
                         wait_timing* timing) noexcept(std::is_nothrow_move_constructible_v<T>) {
      for (;;) {
        if (auto v = out->pop_unless([this] { return at_switch(); }, nullptr, timing)) {
          counted(position);
          return v;
        }
        if (!at_switch()) return std::nullopt;  // closed and drained
        follow();
      }
    }
    std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) noexcept(
        std::is_nothrow_move_constructible_v<T>) {
      for (;;) {
        if (at_switch()) follow();
        if (auto v = out->pop_until(deadline)) {
          counted(nullptr);
          return v;
        }
        if (!at_switch()) return std::nullopt;  // closed and drained, or late
      }
    }
    // The consumer's burst (ring_link::drain), counted like its pops. None there and past
    // a switch point: a burst in the ring it leads to (the burst inlined once, the switch
    // out of line as in past_switch()).
    template <class F>
    CONVEYOR_HOT_INLINE std::size_t drain(F& f, std::size_t max) noexcept {
      std::size_t n;
      do {
        n = out->drain(f, max);
      } while (n == 0 && follow_at_switch());
      // relaxed: the consumer's own count, as in counted().
      popped.store(popped.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
      return n;
    }
    // The consumer: follows the producer into the other ring where it has taken every
    // element before the switch point; whether it did.
    [[gnu::noinline]] bool follow_at_switch() noexcept {
      if (!at_switch()) return false;
      follow();
      return true;
    }
    // One more element taken; position: how many were taken before it.
    CONVEYOR_HOT_INLINE void counted(std::size_t* position) noexcept {
      // relaxed: the consumer's own count (it alone writes it), read by others as a
      // statistic (popped()).
      const std::size_t n = popped.load(std::memory_order_relaxed);
      if (position) *position = n;
      popped.store(n + 1, std::memory_order_relaxed);
    }

    const std::size_t reserve;                // the reserve's capacity (the ring's: none)
    box<hop_ring<T>> made_;                   // the reserve, once made (grow()'s thread)
    std::atomic<hop_ring<T>*> deep{nullptr};  // made_, published; null until then
    hop_ring<T>* const shallow_;
    std::atomic<bool> want_deep{false};
    std::atomic<bool> grew{false};
    std::atomic<bool> guard_{false};  // make_deep() against close_deep()
    bool closing_ = false;            // under guard_
    // The producer's count of elements pushed to the link when it last moved; no_switch
    // once the consumer has followed.
    alignas(cache_line_size) std::atomic<std::size_t> switch_at{no_switch};
    alignas(cache_line_size) hop_ring<T>* in;   // the producer's
    std::size_t pushed = 0;                     // the producer's count
    alignas(cache_line_size) hop_ring<T>* out;  // the consumer's
    std::atomic<std::size_t> popped{0};         // written by the consumer only
  };

  // Exactly one is engaged, for the object's whole life.
  std::optional<hop_ring<T>> spsc_;
  std::optional<mpmc_ring<T>> mpmc_;
  box<lane_set> lanes_;
  // With spsc_, always, whether or not it has a reserve (can_grow()): an SPSC link's
  // calls all go through it, so a stage's loop inlines one SPSC path, not two.
  std::optional<grow_set> grow_;
};

// One thread's end of a ring_link: with lanes, the pusher or popper `index` of its side;
// on any other link, the link itself. Has the calls a stage makes on its rings, so a
// stage's worker can hand it to its probe in place of the link. A lane_port() calls its
// lane directly: a stage loop that knows its link has lanes inlines their code alone.
template <class T, port_kind Kind>
class ring_port {
 public:
  using value_type = T;

  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_push(T&& v) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    if constexpr (Kind == port_kind::lanes)
      return l_->lanes_->try_push(i_, std::move(v));
    else
      return l_->try_push_at(i_, std::move(v));
  }
  template <class... Args>
    requires std::is_nothrow_constructible_v<T, Args&&...>
  [[nodiscard]] CONVEYOR_HOT_INLINE bool try_emplace(Args&&... args) noexcept {
    if constexpr (Kind == port_kind::lanes)
      return l_->lanes_->try_emplace(i_, std::forward<Args>(args)...);
    else
      return l_->try_emplace_at(i_, std::forward<Args>(args)...);
  }
  CONVEYOR_HOT_INLINE bool push(T v, wait_timing* timing = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    if constexpr (Kind == port_kind::lanes)
      return l_->lanes_->push(i_, std::move(v), timing);
    else
      return l_->push_at(i_, std::move(v), timing);
  }
  CONVEYOR_HOT_INLINE std::optional<T> try_pop(std::size_t* position = nullptr) noexcept(
      std::is_nothrow_move_constructible_v<T>) {
    if constexpr (Kind == port_kind::lanes)
      return l_->lanes_->try_pop(i_, position);
    else
      return l_->try_pop_at(i_, position);
  }
  CONVEYOR_HOT_INLINE std::optional<T> pop(
      std::size_t* position = nullptr,
      wait_timing* timing = nullptr) noexcept(std::is_nothrow_move_constructible_v<T>) {
    if constexpr (Kind == port_kind::lanes)
      return l_->lanes_->pop(i_, position, timing);
    else
      return l_->pop_at(i_, position, timing);
  }
  std::size_t size_approx() const noexcept { return l_->size_approx(); }

 private:
  friend class ring_link<T>;
  ring_port(ring_link<T>* l, std::size_t i) noexcept : l_(l), i_(i) {}
  ring_link<T>* l_;
  std::size_t i_;
};

// The ring between two stages.
template <class T>
using link = ring_link<envelope<T>>;

// Starts f on a new thread of `threads` (a stage's worker) that may put off the wake-ups
// of the links it pushes to and pops from (wait_point's batched wakes, under load from
// other processes): the links outlive the thread, and the thread wakes what it put off
// before it ends.
template <class F>
void spawn_stage_thread(thread_group& threads, F&& f) {
  threads.spawn([f = std::decay_t<F>(std::forward<F>(f))]() mutable {
    wake_batching batching;
    f();
  });
}

}  // namespace conveyor::detail
