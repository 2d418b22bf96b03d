// upload / download for the GPU tests: a host vector to a new device buffer and back,
// through pinned staging, synchronized (tests only: no overlap wanted here).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "conveyor/runtime/cuda/memory.hpp"
#include "conveyor/runtime/cuda/stream.hpp"

namespace conveyor::test::gpu {

template <class T>
cuda::device_buffer<T> upload(const std::vector<T>& host, cuda::stream_ref s) {
  cuda::pinned_buffer<T> staging{host.size()};
  std::copy(host.begin(), host.end(), staging.span().begin());
  cuda::device_buffer<T> dev{host.size()};
  copy_async(dev.span(), staging.span(), s);
  s.synchronize();
  return dev;
}

template <class T>
std::vector<T> download(const cuda::device_buffer<T>& dev, std::size_t n, cuda::stream_ref s) {
  cuda::pinned_buffer<T> staging{n};
  copy_async(staging.span(), cuda::device_span<const T>(dev.span().subspan(0, n)), s);
  s.synchronize();
  return std::vector<T>(staging.span().begin(), staging.span().end());
}

}  // namespace conveyor::test::gpu
