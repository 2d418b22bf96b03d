// conveyor/counters/batch_stats.hpp: how full the batches leave the batching stage.
//
//   metrics::batch_stats bs{max_size};                   // the batcher's max batch size
//   bs.record(batch.size(), /*on_timeout=*/deadline_hit); // batcher thread, per batch
//   batch_counters c = bs.snapshot();                    // any thread
//   c.mean_size(); c.flushed_on_timeout;
//
// A batch "left on timeout" when the dynamic batcher's max delay expired before it
// reached max_size. A final partial batch at end of input is not a timeout (pass
// on_timeout = false); it is counted in `batches` and `items` only.
//
// Thread-safety: record() from any thread (relaxed read-modify-writes, once per batch);
// snapshot() from any thread, exact once the writers are joined.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "conveyor/base/config.hpp"

namespace conveyor::metrics {

struct batch_counters {
  std::size_t max_size = 0;
  std::uint64_t batches = 0;
  std::uint64_t items = 0;
  std::uint64_t flushed_on_timeout = 0;
  std::uint64_t full = 0;  // batches that left at max_size

  double mean_size() const noexcept {
    return batches == 0 ? 0.0 : static_cast<double>(items) / static_cast<double>(batches);
  }
};

class batch_stats {
 public:
  // @throws config_error when max_size is 0.
  explicit batch_stats(std::size_t max_size) : max_size_((check(max_size), max_size)) {}

  void record(std::size_t size, bool on_timeout) noexcept {
    // relaxed (all): independent statistics; nothing is published through them.
    counters_.batches.fetch_add(1, std::memory_order_relaxed);
    counters_.items.fetch_add(size, std::memory_order_relaxed);
    if (on_timeout) counters_.timeouts.fetch_add(1, std::memory_order_relaxed);
    if (size >= max_size_) counters_.full.fetch_add(1, std::memory_order_relaxed);
  }

  std::size_t max_size() const noexcept { return max_size_; }

  batch_counters snapshot() const noexcept {
    // relaxed: see record(); untorn values, not all of one instant.
    batch_counters c;
    c.max_size = max_size_;
    c.batches = counters_.batches.load(std::memory_order_relaxed);
    c.items = counters_.items.load(std::memory_order_relaxed);
    c.flushed_on_timeout = counters_.timeouts.load(std::memory_order_relaxed);
    c.full = counters_.full.load(std::memory_order_relaxed);
    return c;
  }

 private:
  static void check(std::size_t max_size) {
    CONVEYOR_EXPECTS(max_size >= 1, "batch_stats: max_size must be >= 1 (the batch size limit)");
  }

  std::size_t max_size_;
  struct alignas(cache_line_size) atomics {
    std::atomic<std::uint64_t> batches{0};
    std::atomic<std::uint64_t> items{0};
    std::atomic<std::uint64_t> timeouts{0};
    std::atomic<std::uint64_t> full{0};
  } counters_;
};

}  // namespace conveyor::metrics
