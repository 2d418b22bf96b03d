// conveyor/runtime/cuda/event.hpp: an owning CUDA event, with or without timing.
//
//   conveyor::cuda::event done{conveyor::event_timing::disabled};
//   done.record(s);                        // async: behind everything enqueued on s so far
//   other.ref().wait(done);                // other's later work waits for it
//   if (!done.query()) done.synchronize(); // poll, then block (asleep: event_wait::block)
//   float ms = elapsed_ms(start, end);     // both timing-enabled and completed
//
// An event never recorded counts as complete (CUDA's rule). Move-only: from_native()
// adopts a handle, release() hands it back.
// Thread-safety: as CUDA events; query/synchronize from any thread.
#pragma once

#include <utility>

#include <cuda_runtime_api.h>

#include "conveyor/base/config.hpp"
#include "conveyor/base/cpu_relax.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/runtime/cuda/check.hpp"
#include "conveyor/runtime/cuda/stream.hpp"
#include "conveyor/runtime/detail/cuda_counters.hpp"
#include "conveyor/runtime/event_timing.hpp"

namespace conveyor::cuda {

using conveyor::event_timing;

class event {
 public:
  event() : event(event_timing::disabled) {}
  // @throws cuda_error
  explicit event(event_timing t, event_wait w = event_wait::block)
      : timing_(t == event_timing::enabled), spin_(w == event_wait::spin) {
    const unsigned flags = (timing_ ? cudaEventDefault : cudaEventDisableTiming) |
                           (spin_ ? 0u : static_cast<unsigned>(cudaEventBlockingSync));
    CONVEYOR_CUDA_TRY(cudaEventCreateWithFlags(&e_, flags));
    detail::cuda_counters::add(detail::cuda_counters::events, 1);
  }

  // Adopts a handle; say whether it was created with timing. nullptr: an empty event.
  static event from_native(cudaEvent_t e, event_timing t) noexcept {
    return event(e, t == event_timing::enabled);
  }
  [[nodiscard]] cudaEvent_t release() noexcept {
    if (e_ != nullptr) detail::cuda_counters::add(detail::cuda_counters::events, -1);
    return std::exchange(e_, nullptr);
  }

  event(event&& other) noexcept
      : e_(std::exchange(other.e_, nullptr)), timing_(other.timing_), spin_(other.spin_) {}
  event& operator=(event&& other) noexcept {
    if (this != &other) {
      reset();
      e_ = std::exchange(other.e_, nullptr);
      timing_ = other.timing_;
      spin_ = other.spin_;
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { reset(); }

  // @throws cuda_error
  void record(stream_ref s) { CONVEYOR_CUDA_TRY(cudaEventRecord(e_, s.native())); }

  // True once the latest record completed; never blocks. @throws cuda_error
  bool query() const {
    const cudaError_t status = cudaEventQuery(e_);
    if (status == cudaErrorNotReady) return false;
    CONVEYOR_CUDA_TRY(status);
    return true;
  }

  // @note blocks until the latest record completed: asleep (event_wait::block, the
  // default) or polling (spin). @throws cuda_error
  void synchronize() const {
    if (!spin_) {
      CONVEYOR_CUDA_TRY(cudaEventSynchronize(e_));
      return;
    }
    while (!query()) conveyor::detail::cpu_relax();
  }

  bool timing_enabled() const noexcept { return timing_; }
  cudaEvent_t native() const noexcept { return e_; }

  // @throws config_error unless both events have timing enabled; error unless both have
  // completed; cuda_error when CUDA refuses (an event never recorded, for example).
  friend float elapsed_ms(const event& start, const event& end) {
    CONVEYOR_EXPECTS(start.timing_enabled() && end.timing_enabled(),
                     "elapsed_ms: create both events with event_timing::enabled");
    if (!start.query() || !end.query())
      throw error(
          "elapsed_ms: both events must have completed; synchronize() the end "
          "event first");
    float ms = 0.0f;
    CONVEYOR_CUDA_TRY(cudaEventElapsedTime(&ms, start.e_, end.e_));
    return ms;
  }

 private:
  event(cudaEvent_t e, bool timing) noexcept : e_(e), timing_(timing) {
    if (e_ != nullptr) detail::cuda_counters::add(detail::cuda_counters::events, 1);
  }
  void reset() noexcept {
    if (e_ == nullptr) return;
    CONVEYOR_CUDA_ASSERT(cudaEventDestroy(std::exchange(e_, nullptr)));
    detail::cuda_counters::add(detail::cuda_counters::events, -1);
  }

  cudaEvent_t e_ = nullptr;
  bool timing_ = false;
  bool spin_ = false;
};

inline void stream_ref::wait(const event& e) const {
  CONVEYOR_CUDA_TRY(cudaStreamWaitEvent(s_, e.native(), 0));
}

}  // namespace conveyor::cuda
