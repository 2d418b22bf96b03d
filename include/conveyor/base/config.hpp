// conveyor/base/config.hpp: build-wide constants and the CONVEYOR_EXPECTS configuration check.
//
//   CONVEYOR_EXPECTS(workers > 0, "map stage: workers must be >= 1; pass .workers(1) or more");
//   alignas(conveyor::cache_line_size) std::atomic<std::size_t> index;
//
// CONVEYOR_HAS_CUDA is 1 when the code is built against conveyor::cuda (the CMake target
// defines it), 0 otherwise. Thread-safety: constants only.
#pragma once

#include <cstddef>

#include "conveyor/base/error.hpp"

#ifndef CONVEYOR_HAS_CUDA
#define CONVEYOR_HAS_CUDA 0
#endif

namespace conveyor {

// The distance that keeps two independently written variables from sharing a line.
// 128, not 64: x86 cores prefetch the adjacent 64-byte line in pairs, so two indices 64
// bytes apart may still ping-pong (bench_rings compares the layouts). Deliberately
// not std::hardware_destructive_interference_size: g++ 12 warns (-Winterference-size)
// that its value depends on -mtune, which would make the ring layout an ABI hazard.
inline constexpr std::size_t cache_line_size = 128;

}  // namespace conveyor

// On the per-item path between stages: inline this call into its caller. Left out of
// line (g++ did so with the link's calls, both ring kinds inside), the element crosses
// each call boundary through memory, and a load behind stores of another width waits
// for the store buffer to drain, behind the store into a ring slot whose line the other
// core holds: a chain over the link then moved half the items of one over the ring.
// Every function on that path carries it, down to the rings' one-line helpers and the
// metas' destructor: in a TU with many pipelines (a benchmark, a test) g++'s inlining
// budget runs out, and it called them on every item.
#if defined(__GNUC__)
#define CONVEYOR_HOT_INLINE [[gnu::always_inline]] inline
#else
#define CONVEYOR_HOT_INLINE inline
#endif

// The same for a lambda a stage's loop calls per item (a burst's drain() calls it once
// per element): `[&](envelope<T>&& e) noexcept CONVEYOR_HOT_LAMBDA {...}`. Out of line,
// every item paid the call and the loads of its captures through the closure. Not for
// clang, which takes a lambda's attribute before the noexcept, where g++ refuses it.
#if defined(__GNUC__) && !defined(__clang__)
#define CONVEYOR_HOT_LAMBDA __attribute__((always_inline))
#else
#define CONVEYOR_HOT_LAMBDA
#endif

// 1 in a ThreadSanitizer build. TSan models no standalone fences (g++ refuses them under
// -Werror=tsan): code that orders with one takes a read-modify-write path instead.
#if defined(__SANITIZE_THREAD__)
#define CONVEYOR_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CONVEYOR_TSAN 1
#endif
#endif
#ifndef CONVEYOR_TSAN
#define CONVEYOR_TSAN 0
#endif

// Fails construction with a config_error whose message says what to change.
#define CONVEYOR_EXPECTS(cond, msg)                                                        \
  do {                                                                                     \
    if (!(cond)) ::conveyor::detail::throw_config_error((msg), #cond, __FILE__, __LINE__); \
  } while (false)
