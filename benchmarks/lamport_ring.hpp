// benchmarks/lamport_ring.hpp: the benchmarks' reference SPSC ring: Lamport's ring with
// cached indices (the algorithm and layout of rigtorp's SPSCQueue, written here), try
// calls only, whose layout is a parameter. bench_rings compares conveyor's rings with it;
// bench_pipeline's bare chain runs four threads over it. backoff: the wait their try
// loops share.
//
//   bench::lamport_ring<std::uint64_t, 64> q{1024};   // each side on its own 64-byte line
//   while (!q.try_push(v)) backoff();
//   while (!q.try_pop(v)) backoff();
//
// Align == 0 packs both indices and both caches into one line; otherwise each side (its
// index and its cache of the other's) gets its own Align-byte line.
// Thread-safety: one producer thread and one consumer thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>

#include "conveyor/base/cpu_relax.hpp"

namespace bench {

// A failed try's wait: pause, and every 64th failure yield, so a spinning thread hands a
// shared core to the thread it waits for (4 threads on 2 cores in bench_rings' mpmc2x2
// and bench_pipeline's bare chain).
class backoff {
 public:
  void operator()() noexcept {
    if (++fails_ % 64 == 0)
      std::this_thread::yield();
    else
      conveyor::detail::cpu_relax();
  }

 private:
  unsigned fails_ = 0;
};

template <class E, std::size_t Align>
class lamport_ring {
  static constexpr std::size_t side_align = Align == 0 ? alignof(std::size_t) : Align;
  static constexpr std::size_t block_align = Align == 0 ? 64 : Align;

 public:
  using value_type = E;

  explicit lamport_ring(std::size_t cap) : mask_(cap - 1), slots_(new E[cap]) {}

  bool try_push(const E& v) {
    const std::size_t tail = idx_.p.index.load(std::memory_order_relaxed);  // we own tail
    if (tail - idx_.p.cache > mask_) {
      // acquire: pairs with the release store of head in try_pop().
      idx_.p.cache = idx_.c.index.load(std::memory_order_acquire);
      if (tail - idx_.p.cache > mask_) return false;
    }
    slots_[tail & mask_] = v;
    idx_.p.index.store(tail + 1, std::memory_order_release);  // release: pairs with try_pop()
    return true;
  }
  bool try_pop(E& v) {
    const std::size_t head = idx_.c.index.load(std::memory_order_relaxed);  // we own head
    if (head == idx_.c.cache) {
      // acquire: pairs with the release store of tail in try_push().
      idx_.c.cache = idx_.p.index.load(std::memory_order_acquire);
      if (head == idx_.c.cache) return false;
    }
    v = slots_[head & mask_];
    idx_.c.index.store(head + 1, std::memory_order_release);  // release: pairs with try_push()
    return true;
  }

 private:
  struct alignas(side_align) side {
    std::atomic<std::size_t> index{0};
    std::size_t cache{0};
  };
  struct alignas(block_align) indices {
    side p, c;
  };
  static_assert(Align == 0 ? sizeof(indices) <= 64 : sizeof(side) == Align,
                "lamport_ring: the layout under test is not the one intended");

  const std::size_t mask_;
  std::unique_ptr<E[]> slots_;
  indices idx_;
};

}  // namespace bench
