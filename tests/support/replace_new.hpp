// Replaces every form of the global operator new and delete with malloc / free, counting
// each allocation and failing one on request:
//
//   #include "replace_new.hpp"     // in exactly ONE source file of a test binary
//   const auto before = conveyor::test::allocations.load();  ...work...  allocations.load() - before
//   conveyor::test::fail_next_allocation.store(true);           // the next new throws bad_alloc
//
// Every form, so that none falls through to a sanitizer's own: ASan would pair its
// operator new (nothrow, array, aligned) with this free and report a mismatch.
// Thread-safety: the counters are atomics; any thread may allocate.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

// g++ warns that free() releases what operator new returned: here that is what operator
// new does (malloc), which g++ cannot see once the replacement is inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace conveyor::test {
// relaxed: a tally read after the threads that allocate have been joined or synchronized.
inline std::atomic<std::uint64_t> allocations{0};
// Set: the next allocation, on any thread, throws std::bad_alloc (and clears it).
inline std::atomic<bool> fail_next_allocation{false};

inline void* counted_alloc(std::size_t n, std::size_t align) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (fail_next_allocation.exchange(false, std::memory_order_relaxed)) throw std::bad_alloc();
  if (n == 0) n = 1;
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n)
                : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace conveyor::test

void* operator new(std::size_t n) {
  return conveyor::test::counted_alloc(n, alignof(std::max_align_t));
}
void* operator new[](std::size_t n) {
  return conveyor::test::counted_alloc(n, alignof(std::max_align_t));
}
void* operator new(std::size_t n, std::align_val_t a) {
  return conveyor::test::counted_alloc(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return conveyor::test::counted_alloc(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return conveyor::test::counted_alloc(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return conveyor::test::counted_alloc(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return conveyor::test::counted_alloc(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return conveyor::test::counted_alloc(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
