// conveyor/runtime/host/runtime.hpp: the host runtime, the GPU emulated on the CPU with
// really asynchronous streams. Needs no CUDA.
//
//   using R = conveyor::host::runtime;                  // or conveyor::cuda::runtime
//   R::stream s{};  R::event done{conveyor::event_timing::disabled};
//   R::pinned_buffer<float> in{n};  R::device_buffer<float> dev{n};
//   copy_async(dev.span(), in.span(), s);  s.ref().enqueue([d = dev.span()] { kernel(d); });
//   done.record(s);  done.synchronize();
//   R::set_device(1);                                   // simulated devices: host/device.hpp
//
// conveyor::host::runtime is the tag the pipeline takes as a template parameter; it
// satisfies conveyor::runtime (runtime/concepts.hpp). Thread-safety: see each header.
#pragma once

#include <string_view>

#include "conveyor/runtime/event_timing.hpp"
#include "conveyor/runtime/host/device.hpp"
#include "conveyor/runtime/host/event.hpp"
#include "conveyor/runtime/host/memory.hpp"
#include "conveyor/runtime/host/stream.hpp"

namespace conveyor::host {

struct runtime {
  using stream = ::conveyor::host::stream;
  using stream_ref = ::conveyor::host::stream_ref;
  using event = ::conveyor::host::event;
  template <class T>
  using pinned_buffer = ::conveyor::host::pinned_buffer<T>;
  template <class T>
  using pinned_span = ::conveyor::host::pinned_span<T>;
  template <class T>
  using device_buffer = ::conveyor::host::device_buffer<T>;
  template <class T>
  using device_span = ::conveyor::host::device_span<T>;
  static constexpr std::string_view name = "host";
  // Devices (simulated, see host/device.hpp): the calling thread's current one, binding
  // one, and how many there are.
  static int device_count() noexcept { return ::conveyor::host::device_count(); }
  static int current_device() noexcept { return ::conveyor::host::current_device(); }
  static void set_device(int id) { ::conveyor::host::set_device(id); }
};

}  // namespace conveyor::host
