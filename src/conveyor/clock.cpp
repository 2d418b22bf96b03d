// src/conveyor/clock.cpp: CPU-time clocks, CPU sets and the ms-to-ns rounding
// (conveyor/base/clock.hpp).
#include "conveyor/base/clock.hpp"

#include <cmath>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace conveyor {

std::int64_t ms_to_ns(double ms) noexcept { return std::llround(ms * 1e6); }

#if defined(__linux__)
// CPU time on a CPU-time clock (CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID, or
// another thread's from pthread_getcpuclockid), in nanoseconds; 0 if it cannot be read.
// A system call (~0.2-1 us): read it per run, per report or per plan, not per item.
std::int64_t cpu_clock_ns(clockid_t clock) noexcept {
  timespec ts{};
  if (::clock_gettime(clock, &ts) != 0) return 0;
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}
#endif

// CPU time used by every thread of this process so far; 0 where there is no such clock.
std::int64_t process_cpu_ns() noexcept {
#if defined(__linux__)
  return cpu_clock_ns(CLOCK_PROCESS_CPUTIME_ID);
#else
  return 0;
#endif
}

// CPU time used by the calling thread so far; 0 where there is no such clock.
std::int64_t thread_cpu_ns() noexcept {
#if defined(__linux__)
  return cpu_clock_ns(CLOCK_THREAD_CPUTIME_ID);
#else
  return 0;
#endif
}

// The CPUs the calling thread may run on (its affinity mask: a container's cpuset or
// taskset; threads it starts inherit it), in ascending order. Empty where unknown.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
#endif
  return cpus;
}

// How many: allowed_cpus(), else the hardware's thread count; at least 1.
std::size_t usable_cpus() {
  if (const std::size_t n = allowed_cpus().size(); n != 0) return n;
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

}  // namespace conveyor
