// conveyor/runtime/cuda/stream.hpp: an owning CUDA stream, always non-blocking, and a
// non-owning view of one.
//
//   conveyor::cuda::stream s;                 // cudaStreamCreateWithFlags(..., NonBlocking)
//   conveyor::cuda::stream_ref r = s;         // copyable view; no stream_ref{0} / {nullptr}
//   my_kernel<<<grid, block, 0, r.native()>>>(...);
//   r.wait(ev);  s.synchronize();             // synchronize blocks; rethrows as cuda_error
//
// Streams never synchronize with the legacy default stream, and nothing here gives a way
// to name it by accident (no default stream argument, no construction from 0 or nullptr).
// stream is move-only: from_native() adopts a handle, release() hands it back.
// Thread-safety: as CUDA streams; work may be enqueued from several threads, and the
// order between threads is the order of the calls. A stream_ref must not outlive its stream.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime_api.h>

#include "conveyor/runtime/cuda/check.hpp"
#include "conveyor/runtime/detail/cuda_counters.hpp"

namespace conveyor::cuda {

class event;
class stream;

class stream_ref {
 public:
  stream_ref(const stream& s) noexcept;  // NOLINT: implicit, a stream is usable as its ref
  // Wraps a handle made elsewhere (a library's stream). Explicit: a cudaStream_t of 0 is
  // the legacy default stream, which conveyor never uses unasked.
  explicit stream_ref(cudaStream_t s) noexcept : s_(s) {}
  stream_ref(int) = delete;
  stream_ref(std::nullptr_t) = delete;

  // @note blocks until the stream's work has finished.
  // @throws cuda_error (an asynchronous error from the stream's work, for example).
  void synchronize() const { CONVEYOR_CUDA_TRY(cudaStreamSynchronize(s_)); }
  // Whether all work enqueued on the stream so far has completed; never blocks.
  // @throws cuda_error when the stream's work failed
  bool query() const {
    const cudaError_t status = cudaStreamQuery(s_);
    if (status == cudaErrorNotReady) return false;
    CONVEYOR_CUDA_TRY(status);
    return true;
  }

  // The stream's later work waits for e's latest record; never blocks the caller.
  // Defined in cuda/event.hpp. @throws cuda_error
  void wait(const event& e) const;

  // True when all work enqueued so far has finished; never blocks. @throws cuda_error
  bool ready() const {
    const cudaError_t status = cudaStreamQuery(s_);
    if (status == cudaErrorNotReady) return false;
    CONVEYOR_CUDA_TRY(status);
    return true;
  }

  cudaStream_t native() const noexcept { return s_; }

  friend bool operator==(const stream_ref&, const stream_ref&) = default;

 private:
  cudaStream_t s_;
};

class stream {
 public:
  // A new non-blocking stream on the calling thread's current device. @throws cuda_error
  stream() {
    CONVEYOR_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    detail::cuda_counters::add(detail::cuda_counters::streams, 1);
  }

  // Adopts a handle (destroyed by this object); nullptr gives an empty stream.
  static stream from_native(cudaStream_t s) noexcept { return stream(s); }
  // Gives up ownership; the caller destroys the handle.
  [[nodiscard]] cudaStream_t release() noexcept {
    if (s_ != nullptr) detail::cuda_counters::add(detail::cuda_counters::streams, -1);
    return std::exchange(s_, nullptr);
  }

  stream(stream&& other) noexcept : s_(std::exchange(other.s_, nullptr)) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      reset();
      s_ = std::exchange(other.s_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  // Returns at once; CUDA frees the stream once its queued work has finished.
  ~stream() { reset(); }

  // A stream converts to stream_ref implicitly through stream_ref(const stream&).
  stream_ref ref() const noexcept { return stream_ref(s_); }
  // @note blocks; see stream_ref::synchronize. @throws cuda_error
  void synchronize() const { ref().synchronize(); }
  cudaStream_t native() const noexcept { return s_; }

 private:
  explicit stream(cudaStream_t s) noexcept : s_(s) {
    if (s_ != nullptr) detail::cuda_counters::add(detail::cuda_counters::streams, 1);
  }
  void reset() noexcept {
    if (s_ == nullptr) return;
    CONVEYOR_CUDA_ASSERT(cudaStreamDestroy(std::exchange(s_, nullptr)));
    detail::cuda_counters::add(detail::cuda_counters::streams, -1);
  }

  cudaStream_t s_ = nullptr;
};

inline stream_ref::stream_ref(const stream& s) noexcept : s_(s.native()) {}

}  // namespace conveyor::cuda

// stream_ref::wait needs the complete event type; event.hpp includes this header first.
#include "conveyor/runtime/cuda/event.hpp"
