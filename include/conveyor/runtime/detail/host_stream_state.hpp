// conveyor/runtime/detail/host_stream_state.hpp: the machinery behind conveyor::host
// streams and events: a worker thread draining a bounded queue of host_tasks, the
// generation counters that events and synchronize() wait on, the sticky error, and the
// seeded jitter.
//
//   detail::host_stream_state st{std::nullopt};           // starts the worker thread
//   st.push(detail::host_task{[](detail::host_stream_state&) { ... }});
//   st.synchronize();                                     // waits, rethrows a sticky error
//
// Thread-safety: push(), synchronize() and the observers from any thread; the worker
// thread alone runs tasks and calls fail(). Destruction joins the worker after it has
// drained the queue, and must not race with push().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/ring/mpmc_ring.hpp"
#include "conveyor/runtime/detail/host_task.hpp"
#include "conveyor/runtime/host/device.hpp"

namespace conveyor::detail {

// Live objects of the host runtime, for leak and double-free tests.
// relaxed everywhere: statistics; tests read them after joins or synchronizations
// that already order the updates.
struct host_counters {
  static inline std::atomic<long> streams{0};  // worker threads started and not yet joined
  static inline std::atomic<long> events{0};   // event states alive
  static inline std::atomic<long> buffers{0};  // pinned + device buffers holding memory

  static long live_streams() noexcept { return streams.load(std::memory_order_relaxed); }
  static long live_events() noexcept { return events.load(std::memory_order_relaxed); }
  static long live_buffers() noexcept { return buffers.load(std::memory_order_relaxed); }
};

// SplitMix64 (Steele, Lea, Flood 2014): a tiny seeded generator; one per stream.
class jitter_rng {
 public:
  explicit jitter_rng(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_;
};

struct jitter_config {
  std::uint64_t seed;
  std::chrono::microseconds max_delay;
};

// Generations of a recordable marker (an event, or a stream's synchronize points).
// record: next() claims generation g, then the task that completes g is enqueued.
// complete(g) runs on a stream thread when it reaches the task; waiters for g return once
// the highest completed generation is >= g.
class host_completion {
 public:
  // acq_rel: claims are totally ordered, and a claim happens-after the claimer's earlier
  // pushes. So when generation g completes, every generation <= g was claimed by a thread
  // whose earlier work is ahead of the completing task in the queue (synchronize relies
  // on this across threads). Pairs with itself in other claimers and with last_claimed().
  std::uint64_t next() noexcept { return claimed_.fetch_add(1, std::memory_order_acq_rel) + 1; }

  // acquire: pairs with next(); 0 when never recorded.
  std::uint64_t last_claimed() const noexcept { return claimed_.load(std::memory_order_acquire); }

  // acquire: pairs with the release CAS in complete(); what the stream thread wrote before
  // completing (time, error, the work before the marker) is visible after this returns true.
  bool reached(std::uint64_t gen) const noexcept {
    return completed_.load(std::memory_order_acquire) >= gen;
  }

  // Stream thread only. Completions of one marker are monotonic: an older generation
  // completing after a newer one (re-recorded on another stream) changes nothing.
  void complete(std::uint64_t gen) noexcept {
    // relaxed: the first read only seeds the CAS loop.
    std::uint64_t cur = completed_.load(std::memory_order_relaxed);
    // release: pairs with the acquire load in reached().
    while (cur < gen && !completed_.compare_exchange_weak(cur, gen, std::memory_order_release,
                                                          std::memory_order_relaxed)) {
    }
    waiters_.notify();
  }

  // @note blocks until generation gen completed.
  void wait(std::uint64_t gen) noexcept {
    if (reached(gen)) return;
    waiters_.wait([this, gen] { return reached(gen); });
  }

 private:
  std::atomic<std::uint64_t> claimed_{0};
  std::atomic<std::uint64_t> completed_{0};
  wait_point waiters_;
};

// An event's shared state. Held by the event and by every task that completes or waits
// on it, so destroying an event with a record still pending is safe (as in CUDA). An
// event is re-recorded while other streams wait on its earlier records (every batch, in
// a pipeline), so what completion writes is atomic or written once.
struct host_event_state {
  using clock = std::chrono::steady_clock;
  static constexpr clock::rep no_time = std::numeric_limits<clock::rep>::min();

  explicit host_event_state(bool with_timing) noexcept : timing(with_timing) {
    host_counters::events.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistic
  }
  ~host_event_state() { host_counters::events.fetch_sub(1, std::memory_order_relaxed); }
  host_event_state(const host_event_state&) = delete;
  host_event_state& operator=(const host_event_state&) = delete;

  // Stream thread, before done.complete(): the completion time of the latest record.
  void stamp() noexcept {
    // relaxed: published by the release in done.complete() that follows.
    when_.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  // After done.reached(): no_time when never stamped. If the event has been re-recorded
  // meanwhile, this is the time of one of the completed records.
  clock::rep when() const noexcept { return when_.load(std::memory_order_relaxed); }

  // Stream thread: an event reached behind a failed stream keeps that stream's first
  // error for good (the stream's error is sticky too). Written once, then published.
  void set_error(std::exception_ptr e) noexcept {
    if (!e) return;
    // relaxed: only elects the single writer; error_ready_ publishes the write.
    if (error_claimed_.exchange(true, std::memory_order_relaxed)) return;
    error_ = std::move(e);
    // release: pairs with the acquire load in error().
    error_ready_.store(true, std::memory_order_release);
  }
  std::exception_ptr error() const noexcept {
    // acquire: pairs with the release store in set_error(); error_ is never written again.
    return error_ready_.load(std::memory_order_acquire) ? error_ : nullptr;
  }

  const bool timing;
  host_completion done;

 private:
  std::atomic<clock::rep> when_{no_time};
  std::atomic<bool> error_claimed_{false};
  std::atomic<bool> error_ready_{false};
  std::exception_ptr error_;
};

class host_stream_state {
 public:
  // Ops the queue holds before push() blocks (CUDA's launch queue is ~1k entries too).
  static constexpr std::size_t queue_capacity = 1024;

  // The stream belongs to the calling thread's current (simulated) device.
  explicit host_stream_state(std::optional<jitter_config> jitter)
      : device(host::current_device()),
        queue_(queue_capacity),
        jitter_on_(jitter.has_value() && jitter->max_delay.count() > 0),
        max_delay_us_(jitter ? static_cast<std::uint64_t>(jitter->max_delay.count()) : 0),
        rng_(jitter ? jitter->seed : 0) {
    CONVEYOR_EXPECTS(!jitter || jitter->max_delay.count() >= 0,
                     "host::jitter: max_delay must be >= 0 microseconds");
    CONVEYOR_EXPECTS(!jitter || jitter->max_delay <= std::chrono::seconds(1),
                     "host::jitter: max_delay above 1 s would only make tests time out; use "
                     "microseconds to milliseconds");
    worker_ = std::thread([this] { run(); });
    host_counters::streams.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistic
  }

  const int device;  // see host/device.hpp

  ~host_stream_state() {
    queue_.close();  // the worker drains what is queued, then pop() reports closed
    worker_.join();
    host_counters::streams.fetch_sub(1, std::memory_order_relaxed);  // relaxed: statistic
  }

  host_stream_state(const host_stream_state&) = delete;
  host_stream_state& operator=(const host_stream_state&) = delete;

  // @note blocks while the queue is full.
  void push(host_task task) noexcept {
    // The queue closes only in the destructor, which must not race with push().
    // relaxed: idle() compares it with ran_ and needs no other memory ordered by it;
    // a push by the thread calling idle() is sequenced before that call anyway.
    pushed_.fetch_add(1, std::memory_order_relaxed);
    const bool pushed = queue_.push(std::move(task));
    if (!pushed) std::terminate();
  }

  // Whether every task pushed so far (as this thread sees the count) has run.
  bool idle() const noexcept {
    // acquire: pairs with the worker's release increment; a task counted as run has
    // finished its writes. pushed_ first: ran_ can only catch up with it, never pass.
    const std::uint64_t pushed = pushed_.load(std::memory_order_relaxed);
    return ran_.load(std::memory_order_acquire) >= pushed;
  }

  // @note blocks until everything pushed before this call has run.
  // @throws the stream's sticky error (the first exception a task threw).
  void synchronize() {
    const std::uint64_t gen = sync_.next();
    push(host_task{[gen](host_stream_state& s) {
      s.count_as_run();  // before the caller wakes: idle() is true once synchronize returns
      s.sync_.complete(gen);
    }});
    sync_.wait(gen);
    if (std::exception_ptr e = error()) std::rethrow_exception(e);
  }

  // acquire: pairs with the release store in fail(); error_ is then fully written.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  std::exception_ptr error() const noexcept { return failed() ? error_ : nullptr; }

  // Worker thread only: records the first error; later tasks are skipped.
  void fail(std::exception_ptr e) noexcept {
    // relaxed: only this thread writes failed_.
    if (failed_.load(std::memory_order_relaxed)) return;
    error_ = std::move(e);
    // release: pairs with the acquire load in failed().
    failed_.store(true, std::memory_order_release);
  }

  // Test hook: how many event waits this stream's worker is blocked in right now.
  long blocked_waits() const noexcept { return blocked_waits_.load(std::memory_order_acquire); }

  // Worker thread only: blocks the stream until generation gen of ev completed, and
  // inherits the error of the stream that completed it.
  void wait_for(host_event_state& ev, std::uint64_t gen) noexcept {
    if (!ev.done.reached(gen)) {
      // release / acquire: pairs with blocked_waits() in tests, which open a gate only
      // once this stream is provably blocked here.
      blocked_waits_.fetch_add(1, std::memory_order_release);
      ev.done.wait(gen);
      blocked_waits_.fetch_sub(1, std::memory_order_release);
    }
    if (std::exception_ptr e = ev.error()) fail(std::move(e));
  }

  std::thread::id worker_id() const noexcept { return worker_.get_id(); }

 private:
  void run() noexcept {
    while (std::optional<host_task> task = queue_.pop()) {
      if (jitter_on_) delay();
      // NOLINTNEXTLINE(bugprone-unchecked-optional-access): the loop's condition checked it
      (*task)(*this);
      if (!counted_) count_as_run();
      counted_ = false;
    }
  }

  // Worker thread only: the running task is done as far as idle() is concerned.
  void count_as_run() noexcept {
    // release: pairs with idle()'s acquire load.
    ran_.fetch_add(1, std::memory_order_release);
    counted_ = true;
  }

  // Uniform in [0, max_delay]. Short delays yield in a loop (a sleep has ~50 us of slack),
  // long ones sleep.
  void delay() noexcept {
    const auto us = static_cast<std::int64_t>(rng_.next() % (max_delay_us_ + 1));
    if (us == 0) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    if (us >= 200) {
      std::this_thread::sleep_until(until);
      return;
    }
    while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
  }

  mpmc_ring<host_task> queue_;
  host_completion sync_;
  std::exception_ptr error_;  // written once by the worker, before failed_
  std::atomic<bool> failed_{false};
  std::atomic<long> blocked_waits_{0};
  std::atomic<std::uint64_t> pushed_{0};  // tasks pushed (any thread)
  std::atomic<std::uint64_t> ran_{0};     // tasks the worker has run (the worker only)
  bool counted_ = false;                  // the worker only: the running task counted itself
  const bool jitter_on_;
  const std::uint64_t max_delay_us_;
  jitter_rng rng_;      // worker thread only
  std::thread worker_;  // started last, in the constructor body
};

}  // namespace conveyor::detail
