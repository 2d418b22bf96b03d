// conveyor/metrics/clock.hpp: the one clock every conveyor measurement uses.
//
//   const std::int64_t t0 = conveyor::metrics::now_ns();
//   work();
//   stats.worker(i).add_busy(conveyor::metrics::now_ns() - t0);
//
// steady_clock (monotonic, CLOCK_MONOTONIC on Linux, a vDSO call of ~20 ns) in signed
// 64-bit nanoseconds: differences are plain subtractions and stay exact for 292 years.
// Every timestamp handed to the metrics (stage phases, lane phases, trace events, item
// submit times) must be in this clock; device timestamps are converted to it by the
// runtime (host runtime: the stream thread reads this clock; CUDA: a reference event
// recorded next to a now_ns() reading plus cudaEventElapsedTime).
//
// Thread-safety: any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace conveyor::metrics {

// Nanoseconds on the steady clock since an unspecified epoch (typically boot).
inline std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A half-open time interval [start_ns, end_ns) in now_ns() time.
struct interval {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  constexpr std::int64_t length_ns() const noexcept { return end_ns > start_ns ? end_ns - start_ns : 0; }
};

inline constexpr double ns_to_s(std::int64_t ns) noexcept { return static_cast<double>(ns) * 1e-9; }

}  // namespace conveyor::metrics
