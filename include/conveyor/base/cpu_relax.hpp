// conveyor/base/cpu_relax.hpp: the pause of a spin-wait loop.
//
//   while (!ready.load(std::memory_order_acquire)) conveyor::detail::cpu_relax();
//
// Tells the core that the thread spins: on x86 `pause` (lets a sibling hyperthread run and
// avoids the memory-order mis-speculation when the loop exits), on AArch64 `yield`.
// Thread-safety: any thread.
#pragma once

namespace conveyor::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace conveyor::detail
