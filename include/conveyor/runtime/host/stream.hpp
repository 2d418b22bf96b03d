// conveyor/runtime/host/stream.hpp: the host runtime's stream, a worker thread that runs
// the work enqueued on it in order, after the enqueueing call has returned.
//
//   conveyor::host::stream s;                            // or stream{host::jitter{seed, 20us}}
//   s.ref().enqueue([p = pinned.span()] { p[0] = 1; });  // a host "kernel": runs on s's thread
//   copy_async(dev.span(), pinned.span(), s);            // memcpy on s's thread, in order
//   s.synchronize();                                     // blocks; rethrows a kernel's exception
//
// stream owns the thread (move-only; the destructor drains the queue, then joins);
// stream_ref is a copyable view that never owns and cannot be made from 0 or nullptr.
// A kernel that throws puts the stream in a sticky error state, as a CUDA fault does: later
// work on it is skipped, and synchronize() / an event behind the failure rethrow the first
// exception. Jitter mode delays every operation by a seeded random amount, so a missing
// wait between streams (or between a stream and the host) shows up as corrupted data.
// Thread-safety: enqueue/wait/synchronize from any thread; work from several threads is
// ordered by when each enqueue call took its place in the queue. A stream_ref must not
// outlive its stream.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "conveyor/base/config.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/runtime/detail/host_stream_state.hpp"
#include "conveyor/runtime/detail/host_task.hpp"
#include "conveyor/runtime/host/device.hpp"

namespace conveyor::host {

class event;
class stream;

// Seeded random delay before every stream operation: uniform in [0, max_delay].
struct jitter {
  std::uint64_t seed;
  std::chrono::microseconds max_delay;
};

class stream_ref {
 public:
  stream_ref(const stream& s) noexcept;  // NOLINT: implicit, like CUDA's stream handles
  stream_ref(int) = delete;              // no "default stream": name the stream
  stream_ref(std::nullptr_t) = delete;

  // Runs f() on the stream's thread after all work enqueued before it, and returns before
  // f runs. Callables up to detail::host_task::inline_capacity bytes with a nothrow move
  // are stored without allocating.
  // @note blocks while the stream's queue (detail::host_stream_state::queue_capacity) is full.
  // @throws error when the calling thread's current device is not the stream's (see
  // host/device.hpp: a thread that launches work binds its device first).
  template <class F>
  void enqueue(F&& f) const {
    static_assert(std::is_invocable_v<std::decay_t<F>&>,
                  "host::stream_ref::enqueue: f must be callable with no arguments");
    if (state_->device != current_device()) [[unlikely]]
      wrong_device(state_->device);
    state_->push(detail::host_task{[fn = std::forward<F>(f)](detail::host_stream_state& s) mutable {
      if (s.failed()) return;  // sticky: skip work behind a failure
      try {
        fn();
      } catch (...) {
        s.fail(std::current_exception());
      }
    }});
  }

  // The stream's later work waits until e's most recent record (at the time of this call)
  // has completed; never blocks the caller. An event never recorded does not hold it up.
  // Defined in host/event.hpp.
  void wait(const event& e) const;

  // @note blocks until all work enqueued before the call has run.
  // @throws the stream's sticky error, if any of its work threw.
  void synchronize() const { state_->synchronize(); }
  // Whether all work enqueued so far has run; never blocks. Not an error check: a failed
  // stream's skipped work counts as run (synchronize() reports the error).
  bool query() const noexcept { return state_->idle(); }

  detail::host_stream_state* native() const noexcept { return state_; }

  friend bool operator==(const stream_ref&, const stream_ref&) = default;

 private:
  friend class stream;
  explicit stream_ref(detail::host_stream_state* s) noexcept : state_(s) {}
  [[noreturn]] static void wrong_device(int device) {
    throw error("host::stream_ref::enqueue: the stream belongs to device " +
                std::to_string(device) + " but the calling thread's current device is " +
                std::to_string(current_device()) + "; call set_device(" + std::to_string(device) +
                ") on this thread first");
  }
  detail::host_stream_state* state_;
};

class stream {
 public:
  // A new stream with its own worker thread.
  stream() : state_(new detail::host_stream_state(std::nullopt)) {}
  // @throws config_error when j.max_delay is negative or above 1 s.
  explicit stream(jitter j)
      : state_(new detail::host_stream_state(detail::jitter_config{j.seed, j.max_delay})) {}

  // Adopts a state released by release() (or leaked on purpose); nullptr gives an empty stream.
  static stream from_native(detail::host_stream_state* s) noexcept { return stream(s); }
  // Gives up ownership: the caller must hand it back to from_native() or delete it.
  [[nodiscard]] detail::host_stream_state* release() noexcept {
    return std::exchange(state_, nullptr);
  }

  stream(stream&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      reset();
      state_ = std::exchange(other.state_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  // Drains the queue (all enqueued work runs), then joins the thread.
  ~stream() { reset(); }

  // A stream converts to stream_ref implicitly through stream_ref(const stream&).
  stream_ref ref() const noexcept { return stream_ref(state_); }

  template <class F>
  void enqueue(F&& f) const {
    ref().enqueue(std::forward<F>(f));
  }
  // @note blocks; see stream_ref::synchronize.
  void synchronize() const { ref().synchronize(); }
  detail::host_stream_state* native() const noexcept { return state_; }

 private:
  explicit stream(detail::host_stream_state* s) noexcept : state_(s) {}
  void reset() noexcept { delete std::exchange(state_, nullptr); }

  detail::host_stream_state* state_;
};

inline stream_ref::stream_ref(const stream& s) noexcept : state_(s.native()) {}

}  // namespace conveyor::host

// stream_ref::wait needs the complete event type; event.hpp includes this header first.
#include "conveyor/runtime/host/event.hpp"
