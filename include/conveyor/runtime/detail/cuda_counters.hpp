// conveyor/runtime/detail/cuda_counters.hpp: how many CUDA handles conveyor objects own
// right now, per kind, for leak and double-free tests.
//
//   const long before = detail::cuda_counters::live(detail::cuda_counters::streams);
//   { cuda::stream a, b; a = std::move(b); }                // one destroyed, one moved
//   REQUIRE(detail::cuda_counters::live(detail::cuda_counters::streams) == before);
//
// A handle counts from its creation (or from_native adoption) until it is destroyed or
// handed back by release(). Thread-safety: atomic counters.
#pragma once

#include <atomic>

namespace conveyor::detail {

struct cuda_counters {
  enum kind { streams, events, pinned, device, cublas, kinds };

  // relaxed: statistics; tests read them after the operations they check have returned.
  static void add(kind k, long n) noexcept { slots()[k].fetch_add(n, std::memory_order_relaxed); }
  static long live(kind k) noexcept { return slots()[k].load(std::memory_order_relaxed); }

 private:
  static std::atomic<long>* slots() noexcept {
    static std::atomic<long> counts[kinds] = {};
    return counts;
  }
};

}  // namespace conveyor::detail
