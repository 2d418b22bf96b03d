// conveyor/stage/detail/latency_samples.hpp: which items of a source pipeline are timed,
// and where their entry times wait for them.
//
//   if (std::uint32_t w = detail::latency_sample_weight(seq)) samples.put(seq, now_ns());
//   ...                                                  // at the terminal stage:
//   if (std::int64_t t0 = samples.take(seq)) latency.record(now_ns() - t0, w);
//
// Thread-safety: latency_samples::put() from one thread (the source's), take() from any.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "conveyor/counters/histogram.hpp"

namespace conveyor::detail {

// A source pipeline times the latency of a sample of its items (one clock read at each
// end); submit() times every item. The sample: 1 item in 8 of the first
// latency_dense_items (1024 samples, enough for the P99 of a short run), then 1 in 64
// up to latency_sparse_items (4096 more), then 1 in 256. Each timed item is recorded with
// its period as its weight, so the histogram stands for every item and the later,
// sparser part of a long run is not under-weighted. Sparse because the two clock reads
// per sample would otherwise be most of what measuring costs a pipeline of cheap stages.
inline constexpr std::uint64_t latency_dense_items = 8192;
inline constexpr std::uint64_t latency_sparse_items = 262144;

// The weight of item `seq` in the latency sample; 0: not timed.
constexpr std::uint32_t latency_sample_weight(std::uint64_t seq) noexcept {
  // Every period is a power of two: a mask. `seq % period` compiled to a 64-bit div on
  // every item.
  const std::uint32_t period = seq < latency_dense_items    ? 8
                               : seq < latency_sparse_items ? 64
                                                            : 256;
  return (seq & (period - 1)) == 0 ? period : 0;
}

// The number of the sample that item `seq` is (meaningful where its weight is not 0):
// 0, 1, 2, ... over the timed items in order.
constexpr std::uint64_t latency_sample_number(std::uint64_t seq) noexcept {
  constexpr std::uint64_t dense = latency_dense_items / 8;
  constexpr std::uint64_t sparse = (latency_sparse_items - latency_dense_items) / 64;
  if (seq < latency_dense_items) return seq / 8;
  if (seq < latency_sparse_items) return dense + (seq - latency_dense_items) / 64;
  return dense + sparse + (seq - latency_sparse_items) / 256;
}

// The entry times of a source pipeline's timed items, by sample number: written by the
// source thread as it sends a timed item, read by the terminal stage when the item
// arrives there. The table holds the last `size` samples; a sample overwritten before
// its item arrived (more than 1024 samples in flight: over 8192 items in the first
// ones, 65536 to 262144 later) is dropped, never misread: each entry is a seqlock keyed
// by the item's sequence number.
// Thread-safety: put() from one thread (the source's); take() from any.
class latency_samples {
 public:
  static constexpr std::size_t size = 1024;

  void put(std::uint64_t seq, std::int64_t t0_ns) noexcept {
    entry& e = entries_[latency_sample_number(seq) & (size - 1)];
    // A seqlock without fences (ThreadSanitizer does not model them): mark the entry as
    // being written, then the time, then the key.
    // relaxed: the release store of the time below orders the mark before it.
    e.seq.store(writing, std::memory_order_relaxed);
    // release: a reader whose acquire load reads this time also sees the mark (or a
    // later key), so it cannot pair the new time with the old key.
    e.t0_ns.store(t0_ns, std::memory_order_release);
    // release: a reader that sees this key sees this time (or a later one).
    e.seq.store(seq, std::memory_order_release);
  }

  // Item seq's entry time; 0 when the table no longer holds it (or never did).
  std::int64_t take(std::uint64_t seq) const noexcept {
    const entry& e = entries_[latency_sample_number(seq) & (size - 1)];
    // acquire: pairs with put()'s release store of the key.
    if (e.seq.load(std::memory_order_acquire) != seq) return 0;
    // acquire: pairs with put()'s release store of the time: if this is a later put's
    // time, that put's mark happens-before the next load, which then cannot read our key.
    const std::int64_t t0 = e.t0_ns.load(std::memory_order_acquire);
    // relaxed: ordered after the load above by its acquire.
    return e.seq.load(std::memory_order_relaxed) == seq ? t0 : 0;
  }

 private:
  static constexpr std::uint64_t writing = ~std::uint64_t{0};
  struct entry {
    std::atomic<std::uint64_t> seq{writing};
    std::atomic<std::int64_t> t0_ns{0};
  };
  std::unique_ptr<entry[]> entries_ = std::make_unique<entry[]>(size);
};

using latency_recorder = metrics::latency_histogram;

}  // namespace conveyor::detail
