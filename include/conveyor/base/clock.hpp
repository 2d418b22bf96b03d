// conveyor/base/clock.hpp: the one clock every conveyor measurement uses.
//
//   const std::int64_t t0 = conveyor::now_ns();
//   work();
//   stats.worker(i).add_busy(conveyor::now_ns() - t0);
//
// steady_clock (monotonic, CLOCK_MONOTONIC on Linux, a vDSO call of ~20 ns) in signed
// 64-bit nanoseconds: differences are plain subtractions and stay exact for 292 years.
// Every timestamp handed to the metrics (stage phases, lane phases, trace events, item
// submit times) must be in this clock; device timestamps are converted to it by the
// runtime (host runtime: the stream thread reads this clock; CUDA: a reference event
// recorded next to a now_ns() reading plus cudaEventElapsedTime).
//
// Beside it, for the report's CPU line and for placement: CPU-time clocks (of the whole
// process, of the calling thread, of any thread by its clock id) and the CPUs the
// process may run on (allowed_cpus, usable_cpus).
//
// now_ns() is inline (it is read on hot paths); the CPU clocks and CPU sets are system
// calls, compiled once in the library (src/conveyor/clock.cpp).
// Thread-safety: any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <time.h>  // clockid_t
#endif

namespace conveyor {

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
  constexpr std::int64_t length_ns() const noexcept {
    return end_ns > start_ns ? end_ns - start_ns : 0;
  }
};

inline constexpr double ns_to_s(std::int64_t ns) noexcept { return static_cast<double>(ns) * 1e-9; }

// Milliseconds (what an event timer such as cudaEventElapsedTime gives) to nanoseconds,
// rounded to the nearest.
std::int64_t ms_to_ns(double ms) noexcept;

#if defined(__linux__)
// CPU time on a CPU-time clock (CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID, or
// another thread's from pthread_getcpuclockid), in nanoseconds; 0 if it cannot be read.
// A system call (~0.2-1 us): read it per run, per report or per plan, not per item.
std::int64_t cpu_clock_ns(clockid_t clock) noexcept;
#endif

// CPU time used by every thread of this process so far; 0 where there is no such clock.
std::int64_t process_cpu_ns() noexcept;

// CPU time used by the calling thread so far; 0 where there is no such clock.
std::int64_t thread_cpu_ns() noexcept;

// The CPUs the calling thread may run on (its affinity mask: a container's cpuset or
// taskset; threads it starts inherit it), in ascending order. Empty where unknown.
std::vector<int> allowed_cpus();

// How many: allowed_cpus(), else the hardware's thread count; at least 1.
std::size_t usable_cpus();

}  // namespace conveyor
