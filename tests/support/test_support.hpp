// Test helpers shared by the host tests: a lifetime-counting element, a move-only
// element, a gate opened on scope exit, a stage cost that burns thread CPU time, and the stress scale (CONVEYOR_TEST_SCALE=percent shrinks stress loops for
// sanitizer builds, which run 5-20x slower).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "conveyor/base/clock.hpp"

// CONVEYOR_TEST_TSAN: built with ThreadSanitizer, which instruments every atomic access
// (a ring's pop or push then costs microseconds) and intercepts allocation.
#if defined(__SANITIZE_THREAD__)
#define CONVEYOR_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CONVEYOR_TEST_TSAN 1
#endif
#endif

// CONVEYOR_TEST_SANITIZED: built with any sanitizer that slows every memory access
// (ThreadSanitizer or AddressSanitizer): per-item costs then grow several-fold, so tests
// that check where time went (not what happened) check less.
#if defined(CONVEYOR_TEST_TSAN) || defined(__SANITIZE_ADDRESS__)
#define CONVEYOR_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CONVEYOR_TEST_SANITIZED 1
#endif
#endif

namespace conveyor::test {

// Counts live instances so a test can assert constructions balance destructions.
struct counted {
  static inline std::atomic<long> live{0};
  std::uint64_t value = 0;

  counted() noexcept { live.fetch_add(1, std::memory_order_relaxed); }
  explicit counted(std::uint64_t v) noexcept : value(v) {
    live.fetch_add(1, std::memory_order_relaxed);
  }
  counted(const counted& o) noexcept : value(o.value) {
    live.fetch_add(1, std::memory_order_relaxed);
  }
  counted(counted&& o) noexcept : value(o.value) { live.fetch_add(1, std::memory_order_relaxed); }
  counted& operator=(const counted&) noexcept = default;
  counted& operator=(counted&&) noexcept = default;
  ~counted() { live.fetch_sub(1, std::memory_order_relaxed); }
};

// Move-only, and its move may throw: the rings' noexcept must follow it.
struct throwing_move_only {
  std::unique_ptr<int> p;
  explicit throwing_move_only(int v) : p(std::make_unique<int>(v)) {}
  throwing_move_only(throwing_move_only&&) noexcept(false) = default;
  throwing_move_only& operator=(throwing_move_only&&) noexcept(false) = default;
};

// Burns d of this thread's CPU time: a preempted stage does not progress (real work,
// unlike a wall-clock spin, which finishes early in CPU terms when the core is shared).
inline void burn_thread_cpu(std::chrono::microseconds d) noexcept {
  const std::int64_t end =
      conveyor::thread_cpu_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  while (conveyor::thread_cpu_ns() < end) {
  }
}

// Sets a gate flag when it goes out of scope. Declared after the pipeline whose stage
// waits on the gate, it opens the gate before the pipeline's destructor joins that stage,
// so a failed REQUIRE in between ends the test instead of hanging it.
struct release_on_exit {
  std::atomic<bool>& gate;
  ~release_on_exit() { gate.store(true); }
};

inline std::size_t scaled(std::size_t n) {
  const char* s = std::getenv("CONVEYOR_TEST_SCALE");
  const long percent = s ? std::strtol(s, nullptr, 10) : 100;
  const std::size_t m = n * static_cast<std::size_t>(percent > 0 ? percent : 100) / 100;
  return m > 0 ? m : 1;
}

}  // namespace conveyor::test
