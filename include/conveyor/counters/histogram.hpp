// conveyor/counters/histogram.hpp: fixed-memory latency histogram with bounded relative error.
//
//   conveyor::metrics::latency_histogram h;            // ~29 KiB, allocated once, inline
//   h.record(conveyor::now_ns() - item.submit_ns);       // any thread, lock-free
//   std::int64_t p99 = h.percentile(99.0);             // ns, within 1/128 of the exact value
//   h.count(); h.min(); h.max(); h.mean();
//
// Log-linear buckets (the HdrHistogram idea; our own code): values below 128 ns get one
// bucket each (exact); above that, every power of two [2^e, 2^(e+1)) is cut into 64
// equal buckets of width 2^(e-6). A bucket is therefore never wider than 1/64 of its
// lower bound, and reporting its midpoint is off by at most half a width:
//
//   |percentile(p) - exact nearest-rank percentile| <= relative_error * exact,
//   relative_error = 1/128 (< 0.8 %),
//
// for every value in [0, 2^63) ns (0 .. 292 years; 3712 buckets). Results are also
// clamped to [min(), max()], which are exact, so percentile(0) == min() and
// percentile(100) == max(). Negative inputs (a clock read out of order) count as 0.
//
// Percentiles use the nearest-rank definition: the smallest recorded value v such that
// at least ceil(p/100 * count) values are <= v.
//
// Thread-safety: record() from any number of threads concurrently (relaxed atomic
// read-modify-writes, see record()). Readers (percentile, count, min, max, mean) may run
// concurrently with writers and then see a snapshot that is not taken at a single
// instant; after the writers have been joined they are exact. merge() reads `other`
// like a reader and writes like a writer. reset() must not race with writers.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "conveyor/base/config.hpp"

namespace conveyor::metrics {

class latency_histogram {
 public:
  // Buckets per power of two is 2^sub_bucket_bits.
  static constexpr unsigned sub_bucket_bits = 6;
  static constexpr std::uint64_t sub_buckets = std::uint64_t{1} << sub_bucket_bits;  // 64
  // Values below this get a bucket each.
  static constexpr std::uint64_t exact_limit = 2 * sub_buckets;  // 128
  // Largest recordable value; larger ones are clamped to it.
  static constexpr std::uint64_t max_value =
      std::uint64_t{std::numeric_limits<std::int64_t>::max()};
  static constexpr std::size_t bucket_count =
      exact_limit + (std::bit_width(max_value) - 1 - sub_bucket_bits) * sub_buckets;  // 3712
  // Bound on |reported - exact| / exact for percentiles (see the header comment).
  static constexpr double relative_error = 1.0 / static_cast<double>(2 * sub_buckets);

  latency_histogram() noexcept = default;
  latency_histogram(const latency_histogram&) = delete;
  latency_histogram& operator=(const latency_histogram&) = delete;

  // Records one value in nanoseconds, standing for `weight` values (a sample taken once
  // in `weight` items: counts, sum, mean and percentiles are then those of all the items,
  // as if each had been recorded). Lock-free, allocation-free.
  void record(std::int64_t ns, std::uint64_t weight = 1) noexcept {
    const std::uint64_t v = clamp(ns);
    // relaxed (all of these): each counter is an independent statistic; an atomic
    // read-modify-write loses no increment whatever the order, and no other memory is
    // published through them. Readers that need exact totals read after joining the
    // writers (thread join is the happens-before edge).
    buckets_[bucket_index(v)].fetch_add(weight, std::memory_order_relaxed);
    totals_.count.fetch_add(weight, std::memory_order_relaxed);
    totals_.sum.fetch_add(v * weight, std::memory_order_relaxed);
    raise(totals_.max, v);
    lower(totals_.min, v);
  }

  std::uint64_t count() const noexcept { return totals_.count.load(std::memory_order_relaxed); }
  // Exact sum of all recorded values (ns); wraps only after 584 years of latency.
  std::uint64_t sum() const noexcept { return totals_.sum.load(std::memory_order_relaxed); }
  // Exact; 0 when empty.
  std::int64_t min() const noexcept {
    const std::uint64_t m = totals_.min.load(std::memory_order_relaxed);
    return m == empty_min ? 0 : static_cast<std::int64_t>(m);
  }
  std::int64_t max() const noexcept {
    return static_cast<std::int64_t>(totals_.max.load(std::memory_order_relaxed));
  }
  // Exact mean in ns; 0 when empty.
  double mean() const noexcept {
    const std::uint64_t n = count();
    return n == 0 ? 0.0 : static_cast<double>(sum()) / static_cast<double>(n);
  }

  // Nearest-rank percentile in ns, p in [0, 100] (clamped); 0 when empty.
  std::int64_t percentile(double p) const noexcept;

  // Adds every value recorded in `other` (which must not be *this).
  void merge(const latency_histogram& other) noexcept {
    // relaxed: same reasoning as record().
    for (std::size_t i = 0; i < bucket_count; ++i) {
      const std::uint64_t n = other.buckets_[i].load(std::memory_order_relaxed);
      if (n != 0) buckets_[i].fetch_add(n, std::memory_order_relaxed);
    }
    totals_.count.fetch_add(other.count(), std::memory_order_relaxed);
    totals_.sum.fetch_add(other.sum(), std::memory_order_relaxed);
    raise(totals_.max, other.totals_.max.load(std::memory_order_relaxed));
    lower(totals_.min, other.totals_.min.load(std::memory_order_relaxed));
  }

  // Forgets everything. Not concurrently with record() or merge().
  void reset() noexcept {
    // relaxed: no writer runs (precondition); the next writer's thread start or a later
    // synchronization publishes the zeros.
    for (auto& b : buckets_) b.store(0, std::memory_order_relaxed);
    totals_.count.store(0, std::memory_order_relaxed);
    totals_.sum.store(0, std::memory_order_relaxed);
    totals_.max.store(0, std::memory_order_relaxed);
    totals_.min.store(empty_min, std::memory_order_relaxed);
  }

  // The bucket layout, public so tests and exporters can check it.
  static constexpr std::size_t bucket_index(std::uint64_t v) noexcept {
    if (v < exact_limit) return static_cast<std::size_t>(v);
    const unsigned e = static_cast<unsigned>(std::bit_width(v)) - 1;  // 2^e <= v < 2^(e+1)
    const unsigned shift = e - sub_bucket_bits;
    return static_cast<std::size_t>(exact_limit + (e - sub_bucket_bits - 1) * sub_buckets +
                                    ((v >> shift) - sub_buckets));
  }
  static constexpr std::uint64_t bucket_lower(std::size_t i) noexcept {
    if (i < exact_limit) return i;
    const std::uint64_t k = i - exact_limit;
    const unsigned shift = static_cast<unsigned>(k / sub_buckets) + 1;
    return (sub_buckets + k % sub_buckets) << shift;
  }
  static constexpr std::uint64_t bucket_width(std::size_t i) noexcept {
    if (i < exact_limit) return 1;
    return std::uint64_t{1} << (static_cast<unsigned>((i - exact_limit) / sub_buckets) + 1);
  }
  static constexpr std::uint64_t bucket_midpoint(std::size_t i) noexcept {
    return bucket_lower(i) + bucket_width(i) / 2;
  }

 private:
  static constexpr std::uint64_t empty_min = ~std::uint64_t{0};

  static constexpr std::uint64_t clamp(std::int64_t ns) noexcept {
    return ns > 0 ? static_cast<std::uint64_t>(ns) : 0;
  }
  std::int64_t clamp_to_range(std::uint64_t v) const noexcept {
    const auto lo = static_cast<std::uint64_t>(min());
    const auto hi = static_cast<std::uint64_t>(max());
    return static_cast<std::int64_t>(v < lo ? lo : (v > hi ? hi : v));
  }
  // relaxed CAS loops: min and max are independent statistics (see record()); a failed
  // CAS reloads the current value and retries only while v would still improve it.
  static void raise(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
    std::uint64_t cur = a.load(std::memory_order_relaxed);
    while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }
  static void lower(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
    std::uint64_t cur = a.load(std::memory_order_relaxed);
    while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }

  // Written on every record(): kept off the bucket array's first line.
  struct alignas(cache_line_size) totals {
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::uint64_t> sum{0};
    std::atomic<std::uint64_t> min{empty_min};
    std::atomic<std::uint64_t> max{0};
  };
  totals totals_;
  alignas(cache_line_size) std::array<std::atomic<std::uint64_t>, bucket_count> buckets_{};
};

static_assert(latency_histogram::bucket_count == 3712);
static_assert(latency_histogram::bucket_index(latency_histogram::max_value) ==
              latency_histogram::bucket_count - 1);
static_assert(latency_histogram::bucket_index(127) == 127 &&
              latency_histogram::bucket_index(128) == 128 &&
              latency_histogram::bucket_lower(128) == 128 &&
              latency_histogram::bucket_width(128) == 2);

}  // namespace conveyor::metrics
