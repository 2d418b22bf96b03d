// conveyor/runtime/cuda/runtime.hpp: the CUDA runtime, all of it (umbrella header).
//
//   using R = conveyor::cuda::runtime;                  // or conveyor::host::runtime
//   conveyor::cuda::require_device(0);
//   R::stream s{};  R::event done{conveyor::event_timing::disabled};
//   R::pinned_buffer<float> in{n};  R::device_buffer<float> dev{n};
//   copy_async(dev.span(), in.span(), s);  done.record(s);  done.synchronize();
//   R::set_device(1);                                   // this thread's device from now on
//
// conveyor::cuda::runtime is the tag the pipeline takes as a template parameter; it
// satisfies conveyor::runtime (runtime/concepts.hpp). Builds with a plain C++ compiler
// against cuda_runtime_api.h and cublas_v2.h (target conveyor::cuda); no nvcc needed.
// Thread-safety: see each header.
#pragma once

#include <string_view>

#include "conveyor/runtime/cuda/check.hpp"
#include "conveyor/runtime/cuda/cublas.hpp"
#include "conveyor/runtime/cuda/device.hpp"
#include "conveyor/runtime/cuda/event.hpp"
#include "conveyor/runtime/cuda/memory.hpp"
#include "conveyor/runtime/cuda/stream.hpp"
#include "conveyor/runtime/event_timing.hpp"

namespace conveyor::cuda {

struct runtime {
  using stream = ::conveyor::cuda::stream;
  using stream_ref = ::conveyor::cuda::stream_ref;
  using event = ::conveyor::cuda::event;
  template <class T>
  using pinned_buffer = ::conveyor::cuda::pinned_buffer<T>;
  template <class T>
  using pinned_span = ::conveyor::cuda::pinned_span<T>;
  template <class T>
  using device_buffer = ::conveyor::cuda::device_buffer<T>;
  template <class T>
  using device_span = ::conveyor::cuda::device_span<T>;
  static constexpr std::string_view name = "cuda";
  // Devices: the calling thread's current one, binding one, and how many answer.
  static int device_count() noexcept { return ::conveyor::cuda::device_count(); }
  static int current_device() { return ::conveyor::cuda::current_device(); }
  static void set_device(int id) { ::conveyor::cuda::set_device(id); }
};

}  // namespace conveyor::cuda
