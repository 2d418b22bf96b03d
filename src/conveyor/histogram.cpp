// src/conveyor/histogram.cpp: latency_histogram's percentile scan
// (conveyor/counters/histogram.hpp).
#include "conveyor/counters/histogram.hpp"

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace conveyor::metrics {

std::int64_t latency_histogram::percentile(double p) const noexcept {
  std::uint64_t total = 0;  // from the buckets themselves, so the scan is self-consistent
  for (const auto& b : buckets_) total += b.load(std::memory_order_relaxed);
  if (total == 0) return 0;
  if (!(p > 0.0)) return min();  // also catches NaN
  if (p >= 100.0) return max();
  // p * total first: exact for integral p and total < 2^53, so p = 95, total = 1000
  // gives rank 950, not 951.
  const double r = std::ceil(p * static_cast<double>(total) / 100.0);
  const std::uint64_t rank = r < 1.0 ? 1 : static_cast<std::uint64_t>(r);
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < bucket_count; ++i) {
    seen += buckets_[i].load(std::memory_order_relaxed);
    if (seen >= rank) return clamp_to_range(bucket_midpoint(i));
  }
  return max();  // writers raced the two scans
}

}  // namespace conveyor::metrics
