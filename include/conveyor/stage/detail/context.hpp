// conveyor/stage/detail/context.hpp: what every running stage shares: the envelope that
// carries an item between stages, the link (ring) type, and the control block that
// turns the first failure anywhere into a stop everywhere.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "conveyor/config.hpp"
#include "conveyor/detail/first_error.hpp"
#include "conveyor/error.hpp"
#include "conveyor/metrics/clock.hpp"
#include "conveyor/metrics/batch_stats.hpp"
#include "conveyor/metrics/histogram.hpp"
#include "conveyor/metrics/lane_stats.hpp"
#include "conveyor/metrics/stage_stats.hpp"
#include "conveyor/ring/mpmc_ring.hpp"

namespace conveyor::detail {

using metrics::now_ns;

inline constexpr std::uint32_t no_ticket = ~std::uint32_t{0};

// Identity of one item from the source: its sequence number, when it entered the
// pipeline (latency is measured from here), and in service mode the result slot
// (ticket) its future waits on.
struct item_meta {
  std::uint64_t seq = 0;
  std::int64_t t0_ns = 0;
  std::uint32_t ticket = no_ticket;
};

// A value in flight. A batch carries one meta per item it holds (metas); a single item
// carries its own (meta) and leaves metas empty, so it costs no allocation.
template <class T>
struct envelope {
  T value;
  item_meta meta;
  std::vector<item_meta> metas;

  std::uint64_t items() const noexcept { return metas.empty() ? 1 : metas.size(); }
};

template <class T>
using link = mpmc_ring<envelope<T>>;

using latency_recorder = metrics::latency_histogram;

using metrics::stage_kind;

// What a running stage tells the report: its identity and its counters.
struct stage_info {
  stage_info(std::string n, stage_kind k, std::size_t capacity, const metrics::stage_stats* s)
      : name(std::move(n)), kind(k), input_capacity(capacity), stats(s) {}

  std::string name;
  stage_kind kind = stage_kind::map;
  std::size_t input_capacity = 0;  // 0: no input ring (a source)
  const metrics::stage_stats* stats = nullptr;
  metrics::gpu_stats* gpu = nullptr;                // the GPU segment's lanes
  const metrics::batch_stats* batches = nullptr;    // a batch stage's fill
  std::string_view runtime;                         // the GPU segment's runtime name
};

// Shared by every stage of one pipeline run.
class control {
 public:
  std::atomic<bool> stopping{false};     // cancel or failure: stop taking new work
  std::atomic<bool> stop_source{false};  // drain: the source ends as if its input did
  first_error error;
  alignas(cache_line_size) std::atomic<std::uint64_t> produced{0};
  alignas(cache_line_size) std::atomic<std::uint64_t> completed{0};
  alignas(cache_line_size) std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> cancelled{0};

  // Registered at construction (before any thread runs): closes a ring, cancels a pool.
  void on_stop(std::function<void()> closer) { closers_.push_back(std::move(closer)); }

  // Stop taking work and wake every blocked thread. Idempotent.
  void stop() noexcept {
    // release: pairs with the acquire loads in is_stopping(); stages that see the flag
    // also see the failure recorded before it.
    if (stopping.exchange(true, std::memory_order_acq_rel)) return;
    for (auto& close : closers_) close();
  }
  bool is_stopping() const noexcept { return stopping.load(std::memory_order_acquire); }

  // Call from inside a catch block: records the exception being handled, wrapped in a
  // stage_error naming the stage and the item, as the run's error if it is the first,
  // and stops everything. `items` were lost with it and count as failed.
  void fail_current(const std::string& stage, std::uint64_t item, std::uint64_t items) noexcept {
    failed.fetch_add(items, std::memory_order_relaxed);  // relaxed: read after join
    try {
      throw stage_error(stage, item, describe(std::current_exception()));
    } catch (...) {
      error.capture(std::current_exception());
    }
    stop();
  }

  void cancel(std::uint64_t items) noexcept {
    cancelled.fetch_add(items, std::memory_order_relaxed);  // relaxed: read after join
  }

 private:
  static std::string describe(std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      return ex.what();
    } catch (...) {
      return "unknown exception";
    }
  }

  std::vector<std::function<void()>> closers_;
};

}  // namespace conveyor::detail
