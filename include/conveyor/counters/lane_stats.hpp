// conveyor/counters/lane_stats.hpp: per-lane GPU counters (H2D / compute / D2H time and
// bytes per batch) and the GPU busy time (union of all lanes' compute intervals).
//
//   metrics::gpu_stats gpu{lanes};                       // at construction: allocates
//   metrics::batch_timing t;                             // from the lane's timing events
//   t.items = n; t.h2d = {e0, e1}; t.compute = {e1, e2}; t.d2h = {e2, e3};
//   t.h2d_bytes = in_bytes; t.d2h_bytes = out_bytes;
//   t.stage_in_ns = ...; t.enqueue_ns = ...; t.stage_out_ns = ...;   // host time
//   gpu.record_batch(lane, t);                           // lane thread, once per batch
//   lane_counters c = gpu.lane(lane).snapshot();        // any thread
//   std::int64_t busy = gpu.compute_busy_ns();           // any thread (not a hot path)
//
// Timestamps are now_ns() time (see clock.hpp): the host runtime's stream thread reads
// the clock when it reaches each event; on CUDA, elapsed times from a reference event
// recorded next to a now_ns() reading. A phase is the time between the events recorded
// on the lane's stream before and after it, so a phase that waited for the engine
// (another lane's kernel, a busy copy engine) includes that wait.
//
// Thread-safety: record_batch() from any thread (relaxed read-modify-writes, once per
// batch, so the lane need not have a single recording thread); snapshot() and
// compute_busy_ns() from any thread, exact once the writers are joined. Nothing locks;
// compute_busy_ns() may wait for a concurrent fold (see concurrent_interval_union).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"
#include "conveyor/counters/interval_union.hpp"

namespace conveyor::metrics {

// What one batch did on one lane.
struct batch_timing {
  std::uint64_t items = 0;  // items in the batch
  interval h2d{};           // host-to-device copy
  interval compute{};       // kernels / cuBLAS / the user's compute functor
  interval d2h{};           // device-to-host copy
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::int64_t stage_in_ns = 0;       // stage-in, on the lane's thread (host clock)
  std::int64_t enqueue_ns = 0;        // the compute functor's call (host clock): enqueueing
  bool drained = false;               // the lane's stream was idle when that call returned
  std::int64_t stage_out_ns = 0;      // stage-out, on the lane's completion thread (host clock)
  std::int64_t stage_out_cpu_ns = 0;  // of it, the completion thread's CPU time
};

// One lane's totals.
struct lane_counters {
  std::uint64_t batches = 0;
  std::uint64_t items = 0;
  std::int64_t h2d_ns = 0;
  std::int64_t compute_ns = 0;
  std::int64_t d2h_ns = 0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::int64_t cpu_ns = 0;  // CPU time of the lane's host threads (enqueue and completion)
  std::int64_t stage_in_ns = 0;
  std::int64_t enqueue_ns = 0;
  std::uint64_t drained_batches = 0;  // batches whose compute call returned to an idle stream
  std::int64_t stage_out_ns = 0;
  std::int64_t stage_out_cpu_ns = 0;
};

class alignas(cache_line_size) lane_stats {
 public:
  void record_batch(const batch_timing& t) noexcept {
    // relaxed (all): independent statistics, nothing published through them; an atomic
    // read-modify-write keeps every increment even with several recording threads.
    batches_.fetch_add(1, std::memory_order_relaxed);
    items_.fetch_add(t.items, std::memory_order_relaxed);
    h2d_ns_.fetch_add(static_cast<std::uint64_t>(t.h2d.length_ns()), std::memory_order_relaxed);
    compute_ns_.fetch_add(static_cast<std::uint64_t>(t.compute.length_ns()),
                          std::memory_order_relaxed);
    d2h_ns_.fetch_add(static_cast<std::uint64_t>(t.d2h.length_ns()), std::memory_order_relaxed);
    h2d_bytes_.fetch_add(t.h2d_bytes, std::memory_order_relaxed);
    d2h_bytes_.fetch_add(t.d2h_bytes, std::memory_order_relaxed);
    stage_in_ns_.fetch_add(positive(t.stage_in_ns), std::memory_order_relaxed);
    enqueue_ns_.fetch_add(positive(t.enqueue_ns), std::memory_order_relaxed);
    if (t.drained) drained_.fetch_add(1, std::memory_order_relaxed);
    stage_out_ns_.fetch_add(positive(t.stage_out_ns), std::memory_order_relaxed);
    stage_out_cpu_ns_.fetch_add(positive(t.stage_out_cpu_ns), std::memory_order_relaxed);
  }

  // CPU time one of the lane's threads used since it last added (any thread).
  void add_cpu_ns(std::int64_t ns) noexcept {
    // relaxed: a statistic, as in record_batch().
    if (ns > 0) cpu_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
  }

  lane_counters snapshot() const noexcept {
    // relaxed: see record_batch(); each value is untorn, not all of one instant.
    lane_counters c;
    c.batches = batches_.load(std::memory_order_relaxed);
    c.items = items_.load(std::memory_order_relaxed);
    c.h2d_ns = static_cast<std::int64_t>(h2d_ns_.load(std::memory_order_relaxed));
    c.compute_ns = static_cast<std::int64_t>(compute_ns_.load(std::memory_order_relaxed));
    c.d2h_ns = static_cast<std::int64_t>(d2h_ns_.load(std::memory_order_relaxed));
    c.h2d_bytes = h2d_bytes_.load(std::memory_order_relaxed);
    c.d2h_bytes = d2h_bytes_.load(std::memory_order_relaxed);
    c.cpu_ns = static_cast<std::int64_t>(cpu_ns_.load(std::memory_order_relaxed));
    c.stage_in_ns = static_cast<std::int64_t>(stage_in_ns_.load(std::memory_order_relaxed));
    c.enqueue_ns = static_cast<std::int64_t>(enqueue_ns_.load(std::memory_order_relaxed));
    c.drained_batches = drained_.load(std::memory_order_relaxed);
    c.stage_out_ns = static_cast<std::int64_t>(stage_out_ns_.load(std::memory_order_relaxed));
    c.stage_out_cpu_ns =
        static_cast<std::int64_t>(stage_out_cpu_ns_.load(std::memory_order_relaxed));
    return c;
  }

 private:
  static std::uint64_t positive(std::int64_t ns) noexcept {
    return ns > 0 ? static_cast<std::uint64_t>(ns) : 0;
  }

  std::atomic<std::uint64_t> batches_{0};
  std::atomic<std::uint64_t> items_{0};
  std::atomic<std::uint64_t> h2d_ns_{0};
  std::atomic<std::uint64_t> compute_ns_{0};
  std::atomic<std::uint64_t> d2h_ns_{0};
  std::atomic<std::uint64_t> h2d_bytes_{0};
  std::atomic<std::uint64_t> d2h_bytes_{0};
  std::atomic<std::uint64_t> cpu_ns_{0};
  std::atomic<std::uint64_t> stage_in_ns_{0};
  std::atomic<std::uint64_t> enqueue_ns_{0};
  std::atomic<std::uint64_t> drained_{0};
  std::atomic<std::uint64_t> stage_out_ns_{0};
  std::atomic<std::uint64_t> stage_out_cpu_ns_{0};
};
static_assert(sizeof(lane_stats) == cache_line_size,
              "lane_stats: each lane's counters must own exactly one cache line");

// All lanes of a pipeline, plus the union of their compute intervals.
class gpu_stats {
 public:
  // window: how far out of start order compute intervals may arrive and still be
  // unioned exactly (see interval_union); >= lanes x batches in flight per lane.
  // @throws config_error when lanes is 0 or above 1024, or for a bad window.
  explicit gpu_stats(std::size_t lanes, std::size_t window = interval_union::default_window);
  ~gpu_stats();
  gpu_stats(const gpu_stats&) = delete;
  gpu_stats& operator=(const gpu_stats&) = delete;

  // Setup only (before any batch): lane i runs on device lane_devices[i] (one per lane).
  // Unset, every lane is on device 0. With several devices each also gets its own busy
  // union (device_busy_ns()). @throws config_error on a list of the wrong length.
  void set_devices(const std::vector<int>& lane_devices);
  int device_of(std::size_t lane) const noexcept { return lane_device_[lane]; }
  // The distinct devices, in the order of their first lane.
  const std::vector<int>& devices() const noexcept { return devices_; }

  std::size_t lanes() const noexcept { return lanes_; }
  lane_stats& lane(std::size_t i) noexcept { return stats_[i]; }
  const lane_stats& lane(std::size_t i) const noexcept { return stats_[i]; }

  // Counts the batch on lane i and adds its compute interval to the busy union.
  // Lock-free; allocation-free.
  void record_batch(std::size_t i, const batch_timing& t) noexcept {
    stats_[i].record_batch(t);
    compute_busy_.add(t.compute);
    if (!per_device_.empty()) per_device_[lane_slot_[i]]->add(t.compute);
  }

  // Time at least one lane's compute phase was running (union over lanes), in ns.
  std::int64_t compute_busy_ns() noexcept { return compute_busy_.total_ns(); }
  // As compute_busy_ns(), over the lanes of devices()[d] only.
  std::int64_t device_busy_ns(std::size_t d) noexcept {
    return per_device_.empty() ? compute_busy_.total_ns() : per_device_[d]->total_ns();
  }
  // Compute intervals lost (queue full) or clipped (beyond the window); 0 when sized right.
  std::uint64_t compute_intervals_dropped() const noexcept { return compute_busy_.dropped(); }
  std::uint64_t compute_intervals_late() noexcept { return compute_busy_.late(); }

 private:
  std::size_t lanes_;
  std::unique_ptr<lane_stats[]> stats_;
  std::size_t window_;
  concurrent_interval_union compute_busy_;
  std::vector<int> lane_device_;        // lane -> its device id
  std::vector<std::size_t> lane_slot_;  // lane -> its device's index in devices_
  std::vector<int> devices_;
  std::vector<std::unique_ptr<concurrent_interval_union>> per_device_;  // empty: one device
};

}  // namespace conveyor::metrics
