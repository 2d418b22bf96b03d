// conveyor/runtime/host/device.hpp: the host runtime's devices, simulated: ids that a
// thread binds as it would a CUDA device, so code that spreads work over several devices
// runs, and is checked, without a GPU.
//
//   conveyor::host::set_device(1);             // this thread's current device
//   conveyor::host::stream s;                  // made on device 1
//   s.ref().enqueue(f);                        // from a thread bound to device 1 only
//   { conveyor::host::device_guard on{2};  make_streams(); }  // previous device restored
//
// There are host::simulated_devices of them. A stream belongs to the device current on
// the thread that made it; enqueueing work on it from a thread bound to another device
// throws (the host runtime's form of launching a kernel in the wrong CUDA context), so a
// thread that forgets to bind its device fails here as it would on a GPU.
// Thread-safety: the current device is per thread; every function from any thread.
#pragma once

#include <string>

#include "conveyor/base/config.hpp"
#include "conveyor/base/error.hpp"

namespace conveyor::detail {
inline thread_local int host_current_device = 0;
}  // namespace conveyor::detail

namespace conveyor::host {

inline constexpr int simulated_devices = 8;

constexpr int device_count() noexcept { return simulated_devices; }
inline int current_device() noexcept { return detail::host_current_device; }

// @throws config_error unless 0 <= id < simulated_devices.
inline void require_device(int id) {
  CONVEYOR_EXPECTS(id >= 0 && id < simulated_devices,
                   "host device " + std::to_string(id) + " requested but the host runtime " +
                       "simulates " + std::to_string(simulated_devices) + " (valid ids: 0.." +
                       std::to_string(simulated_devices - 1) + ")");
}

// Makes `id` the calling thread's current device. @throws as require_device(id).
inline void set_device(int id) {
  require_device(id);
  detail::host_current_device = id;
}

// Makes `id` the calling thread's current device; the destructor restores the previous one.
class device_guard {
 public:
  explicit device_guard(int id) : previous_(current_device()) { set_device(id); }
  ~device_guard() { detail::host_current_device = previous_; }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_;
};

}  // namespace conveyor::host
