// src/conveyor/wait.cpp: the slow path of the rings' blocking calls
// (conveyor/ring/detail/wait.hpp): spin, yield, sleep, and what each wait learns.
#include "conveyor/ring/detail/wait.hpp"

#include <algorithm>
#include <ctime>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>       // timed sleeps: atomic::wait has no deadline
#include <linux/membarrier.h>  // asymmetric barrier: heavy side on sleepers only
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "conveyor/base/clock.hpp"
#include "conveyor/base/cpu_relax.hpp"

namespace conveyor::detail {
namespace {

// Heavy side: a full barrier on every running thread of this process.
void heavy_barrier() noexcept {
#if defined(__linux__) && defined(SYS_membarrier)
  ::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
}

// Sleeps while word == expected, until woken or (if given) the deadline passes. Spurious
// returns are allowed; callers re-check. Linux: a private futex on the word, for both the
// timed and untimed case, so every sleeper is reached by futex_wake_all(). Elsewhere:
// C++20 atomic::wait, and short sleeps for the timed case.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                const wait_clock::time_point* deadline) noexcept {
#if defined(__linux__) && defined(SYS_futex)
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  timespec rel{};
  if (deadline) {
    const auto left = *deadline - wait_clock::now();
    if (left <= wait_clock::duration::zero()) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    rel.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    rel.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  }
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
            deadline ? &rel : nullptr, nullptr, 0);
#else
  if (!deadline) {
    word.wait(expected, std::memory_order_acquire);
  } else if (word.load(std::memory_order_acquire) == expected && wait_clock::now() < *deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
#endif
}

void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
#if defined(__linux__) && defined(SYS_futex)
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX,
            nullptr, nullptr, 0);
#else
  word.notify_all();
#endif
}

// Where the process's CPU time can be read (conveyor::process_cpu_ns() is 0 elsewhere).
#if defined(__linux__)
constexpr bool process_cpu_clock = true;
#else
constexpr bool process_cpu_clock = false;
#endif

}  // namespace

// True when membarrier(PRIVATE_EXPEDITED) is registered for this process. Decided once.
bool asymmetric_barrier_enabled() noexcept {
#if defined(__linux__) && defined(SYS_membarrier)
  static const bool enabled = [] {
    const long cmds = ::syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
    return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  }();
  return enabled;
#else
  return false;
#endif
}

// Tests flip this to exercise the portable path on Linux too. A wait_point decides once,
// when it is constructed: set it before making the rings it should apply to.
std::atomic<load_judgement>& judged_load() noexcept {
  // relaxed loads (in wait_slow()): a test switch, set while no thread waits; thread
  // creation orders it for the threads that wait later.
  static std::atomic<load_judgement> judged{load_judgement::measured};
  return judged;
}

std::atomic<bool>& force_symmetric_barrier() noexcept {
  static std::atomic<bool> forced{false};
  return forced;
}

void yield_policy::yielded(wait_clock::time_point from, wait_clock::time_point to,
                           std::int64_t cpu_ns) noexcept {
  const std::int64_t took = ns(to - from);
  // Every long yield has the next watched_yields yields watched: under load short
  // yields come between the long ones (nothing else was runnable on the core then).
  const std::int32_t watch = watch_.load(std::memory_order_relaxed);
  if (took >= ns(long_yield)) {
    watch_.store(watched_yields, std::memory_order_relaxed);
  } else {
    if (cpu_ns >= 0 && watch > 0) watch_.store(watch - 1, std::memory_order_relaxed);
    return;
  }
  if (cpu_ns < 0) return;      // not watched: the next ones are
  if (cpu_ns >= took) return;  // this process had the core: the yield was progress
  const std::int64_t end = ns(to);
  const std::int64_t quiet = quiet_ns_.load(std::memory_order_relaxed);
  const std::int64_t last = last_lost_.load(std::memory_order_relaxed);
  const std::int64_t next =
      end - last > forget_after_quiets * quiet ? ns(min_quiet) : std::min(2 * quiet, ns(max_quiet));
  quiet_ns_.store(next, std::memory_order_relaxed);
  last_lost_.store(end, std::memory_order_relaxed);
  quiet_until_.store(end + next, std::memory_order_relaxed);
  paused_.store(true, std::memory_order_relaxed);
}

bool deferred_wakes::put_off(wait_point* w, std::uint32_t batch) noexcept {
  for (int i = 0; i < size; ++i) {
    if (pending[i].point != w) continue;
    if (++pending[i].notifies < batch) return true;
    pending[i] = pending[--size];  // the batch is complete: the caller wakes it
    return false;
  }
  if (size == capacity || batch <= 1) return false;
  pending[size++] = {w, 1};
  return true;
}

void deferred_wakes::flush() noexcept {
  for (int i = 0; i < size; ++i) pending[i].point->wake();
  size = 0;
}

// As notify(), never put off: for a change every waiter must see now (a close).
void wait_point::notify_now() noexcept {
  std::atomic_signal_fence(std::memory_order_seq_cst);  // as in notify()
  if (waiting_.load(std::memory_order_relaxed) == 0) return;
  wake();
}

void wait_point::notify_slow(std::uint32_t sleeping) noexcept {
  if (sleeping == batch_waiter) return notify_batched();  // never with symmetric_flag
  wake();
}

// A put-off wake-up's time has come (deferred_wakes::flush).
void wait_point::wake() noexcept {
  // seq_cst RMW: in waiting_'s modification order it is either after a waiter's
  // registration (and reads it) or before it (and the waiter's RMW synchronizes with
  // this one, so its pred() sees our publication). Clearing the flags makes
  // the wake-up once per sleep, not once per item pushed while the sleeper wakes up.
  // symmetric_flag stays set (see notify()).
  const std::uint32_t keep = asymmetric_ ? 0 : symmetric_flag;
  if ((waiting_.exchange(keep, std::memory_order_seq_cst) & ~symmetric_flag) == 0) return;
  // release: pairs with the acquire load of epoch_ in wait_impl().
  epoch_.fetch_add(1, std::memory_order_release);
  futex_wake_all(epoch_);
}

bool wait_point::wait_slow(pred_fn pred_fn_, void* ctx, pred_fn run, void* run_ctx,
                           const wait_clock::time_point* deadline, wait_timing* timing) noexcept {
  const auto pred = [&] { return pred_fn_(ctx); };
  // Spin, then yield, then sleep: competitive spinning, tuned by what the last waits
  // needed. A spin that succeeds at its look i (from 0) moves the limit toward 2i + 16.
  // A wait that outlasts the spin but ends soon after (within short_wait: in a yield
  // that ran nothing else, or woken about as fast as a futex round trip) says a longer
  // spin would have paid, so the limit grows. One that ends in a yield that ran another
  // thread, or sleeps long, says spinning cannot pay (the other side shares this core,
  // or is slow), so the limit decays and waiters yield or sleep sooner instead of
  // stealing the core the worker needs. Deciding on the tail, not on the
  // typical wait, keeps both sides of a busy ring out of the sleep path (each trip
  // through it costs a membarrier here and a futex wake at the notifier). The yields
  // stop for a while where they hand time slices to other processes (yield_policy).
  // The caller (wait(), wait_until()) has looked once: pred() was false.
  // relaxed: spin_limit_ and first_look_ are heuristic hints; a stale value costs time,
  // never correctness.
  const std::uint32_t limit = spin_limit_.load(std::memory_order_relaxed);
  // While other processes take the cores (yields_ paused) the spin is the shortest:
  // the other side is often not running at all. The learned limit is kept for after.
  const load_judgement judged = judged_load().load(std::memory_order_relaxed);
  const bool measured = judged == load_judgement::measured;
  const bool loaded = measured ? yields_.paused() : judged == load_judgement::loaded;
  const std::uint32_t spin = loaded ? std::min(limit, min_spin) : limit;
  // Its first look at pred() comes after `first` pauses (see first_look_; a timed wait
  // looks at the clock only after them), then `spin` looks a pause apart. Under load it
  // looks at once (and the learned delay is kept). The delay is learned only where it
  // may change: a spin that looked at once and found the wait over later leaves it at 0.
  const std::uint32_t first = loaded ? 0 : first_look_.load(std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < first; ++i) cpu_relax();
  for (std::uint32_t i = 0; i < spin; ++i) {
    if (pred()) {
      if (!loaded) {
        adapt(limit, 2 * i + 16, 2 * i + 16 > limit ? 1 : 6);
        if (i == 0)
          learn_first_look(first, run && run(run_ctx) ? first_found::run : first_found::one);
        else if (first != 0)
          learn_first_look(first, first_found::nothing);
      }
      if (timing) timing->rounds += first + i + 1;
      return true;
    }
    // A timed wait looks at the clock now and then: under load a spin can be
    // preempted for far longer than it would take.
    if (deadline && i % 64 == 63 && wait_clock::now() >= *deadline) {
      if (!loaded && first != 0) learn_first_look(first, first_found::nothing);
      if (timing) timing->rounds += first + i + 1;
      return false;
    }
    cpu_relax();
  }
  if (timing) timing->rounds += first + spin;
  if (!loaded && first != 0) learn_first_look(first, first_found::nothing);
  const wait_clock::time_point spun = wait_clock::now();
  // The slow path's end, for a measuring caller: the clock reading it took last.
  const auto slow_ended = [&](wait_clock::time_point end) noexcept {
    if (!timing) return;
    timing->slow_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - spun).count();
    timing->end_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(end.time_since_epoch()).count();
  };
  // This thread is about to give up its core: the wake-ups it put off are due.
  if (deferred_wakes* const mine = this_thread_wakes; mine != nullptr && mine->size != 0)
    mine->flush();
  wait_clock::time_point before_yield = spun;
  // Let a thread sharing this core make progress first, unless yields have been
  // giving whole time slices away (see yield_policy).
  const bool may_yield = measured && yields_.may_yield(spun);
  if (may_yield) yields_.ended();
  const int yields = may_yield ? 4 : 0;
  for (int i = 0; i < yields; ++i) {
    if (deadline && before_yield >= *deadline) {
      slow_ended(before_yield);
      return pred();
    }
    const std::int64_t cpu_before =
        process_cpu_clock && yields_.watch() ? conveyor::process_cpu_ns() : -1;
    std::this_thread::yield();
    const wait_clock::time_point after_yield = wait_clock::now();
    yields_.yielded(before_yield, after_yield,
                    cpu_before < 0 ? -1 : conveyor::process_cpu_ns() - cpu_before);
    if (pred()) {
      // A yield that returned at once (nothing else wanted this core) means the other
      // side ran elsewhere and was about to deliver: a longer spin would have paid. One
      // that ran another thread for a while means the wait ended because this core was
      // given away, likely to the very thread waited for: spinning on it only delays
      // that thread, so the limit shrinks.
      if (after_yield - before_yield < yield_switched)
        adapt(limit, 2 * limit, 1);
      else
        adapt(limit, 0, 1);
      slow_ended(after_yield);
      return true;
    }
    if (!yields_.may_yield(after_yield)) break;  // that one was lost: sleep now
    before_yield = after_yield;
  }
  // Under load (see batch_), sleep in batches: let the notifier put the wake-up off.
  const bool batched =
      batch_ > 1 && asymmetric_ && (measured ? yields_.paused() : judged == load_judgement::loaded);
  for (;;) {
    // acquire: pairs with the release increment in wake(); if a notifier runs after
    // this read, epoch_ differs and the wait() below returns at once.
    const std::uint32_t epoch = epoch_.load(std::memory_order_acquire);
    // seq_cst RMW: the registration precedes the re-check of pred() (Dekker). Being an
    // RMW, it reads from any notifier's exchange() earlier in waiting_'s modification
    // order (or a later RMW in that release sequence), so it synchronizes with it and
    // pred() sees that notifier's publication. An OR: a plain waiter beside a batched
    // one (mpmc_ring) is never put off.
    waiting_.fetch_or(batched ? batch_waiter : plain_waiter, std::memory_order_seq_cst);
    // partner: the signal fence in notify. A batched sleeper goes without it: a
    // notifier's fast path may then miss a registration made at the same moment (and
    // count nothing), which costs the sleeper at most the backstop, never a hang; a
    // wake() (an RMW on waiting_) still sees it. Under load the barrier's IPIs were a
    // tenth of the trivial pipeline's samples, and it ran 15-30% faster without them.
    if (asymmetric_ && !batched) heavy_barrier();
#if !CONVEYOR_TSAN
    // The partner of notify_if()'s fence where there is no heavy barrier: the waiter's
    // publication before this point against the notifier's look after its own. (Under
    // TSan notify_if() takes no fence either.)
    if (!asymmetric_) std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
    if (pred()) {  // the flag may stay set: costs one spurious wake, no more
      slow_ended(learn_from_sleep(limit, spun));
      return true;
    }
    if (deadline) {
      if (const wait_clock::time_point now = wait_clock::now(); now >= *deadline) {
        adapt(limit, 0, 2);
        slow_ended(now);
        return false;
      }
    }
    if (batched) {
      const wait_clock::time_point until = wait_clock::now() + backstop;
      futex_wait(epoch_, epoch, deadline && *deadline < until ? deadline : &until);
    } else {
      futex_wait(epoch_, epoch, deadline);
    }
    if (pred()) {
      slow_ended(learn_from_sleep(limit, spun));
      return true;
    }
  }
}

void wait_point::notify_batched() noexcept {
  deferred_wakes* const mine = this_thread_wakes;
  if (mine != nullptr && mine->put_off(this, batch_)) return;
  wake();
}

wait_clock::time_point wait_point::learn_from_sleep(std::uint32_t limit,
                                                    wait_clock::time_point spun) noexcept {
  constexpr auto short_wait = std::chrono::microseconds(50);
  const wait_clock::time_point now = wait_clock::now();
  if (now - spun < short_wait)
    adapt(limit, 2 * limit, 1);
  else
    adapt(limit, 0, 2);
  return now;
}

void wait_point::learn_first_look(std::uint32_t first, first_found found) noexcept {
  const std::uint32_t next = found == first_found::run   ? std::min(2 * first + 1, max_first_look)
                             : found == first_found::one ? first
                                                         : first / 2;
  if (next != first) first_look_.store(next, std::memory_order_relaxed);
}

void wait_point::adapt(std::uint32_t limit, std::uint32_t target, int shift) noexcept {
  const std::int64_t t = std::min<std::int64_t>(target, max_spin);
  std::int64_t next = std::int64_t{limit} + (t - std::int64_t{limit}) / (std::int64_t{1} << shift);
  next = std::clamp<std::int64_t>(next, min_spin, max_spin);
  if (static_cast<std::uint32_t>(next) != limit)
    spin_limit_.store(static_cast<std::uint32_t>(next), std::memory_order_relaxed);
}

}  // namespace conveyor::detail
