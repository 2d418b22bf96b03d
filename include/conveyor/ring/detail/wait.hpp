// conveyor/ring/detail/wait.hpp: the blocking half of the rings: spin briefly, then sleep.
//
//   detail::wait_point not_empty_;                       // one per direction of a ring
//   consumer:  not_empty_.wait([&] { return has_item() || closed(); });
//   producer:  publish(item); not_empty_.notify();       // cheap when nobody sleeps
//   measured:  detail::wait_timing t;  not_empty_.wait(ready, &t);   // what it cost
//
// A wait_point is an event count (Dekker handshake): a waiter sets waiting_, then
// re-checks its condition, then sleeps on epoch_ with C++20 atomic::wait (a futex on
// Linux), so a blocked thread burns no core. A notifier that has published its state
// change looks at waiting_ and pays for a wake-up only when somebody sleeps.
//
// The handshake needs a StoreLoad barrier on both sides. The notifier sits on every
// push and pop, so it uses an *asymmetric* barrier where Linux offers one:
// membarrier(PRIVATE_EXPEDITED) on the rare sleep path forces a full barrier on every
// running thread of the process, and the notifier's side shrinks to a compiler fence.
// Where membarrier is missing the notifier falls back to a seq_cst read-modify-write of
// waiting_ (a full barrier, valid in the C++ memory model without any fence).
//
// Under load from other processes (yield_policy: yields that hand whole time slices
// away), waiters spin the least and sleep in batches: the sleeper on a pipeline's ring
// lets a notifier inside a wake_batching scope (a stage thread) put its wake-up off
// until half a ring has come, until the notifier waits itself, or for 1 ms at most. Each
// wake-up then costs a core another process holds once per batch, not once per few
// items, and a batched sleeper skips the membarrier (the trivial pipeline beside two
// busy loops: 2.4 -> 5.2 M items/s, medians of 5 alternating rounds; benchmarks/
// RESULTS.md, "wake-ups in batches").
//
// Thread-safety: any number of waiters and notifiers.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>       // timed sleeps: atomic::wait has no deadline
#include <linux/membarrier.h>  // asymmetric barrier: heavy side on sleepers only
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "conveyor/base/config.hpp"
#include "conveyor/base/cpu_relax.hpp"
#include "conveyor/base/clock.hpp"  // a leaf: the process's CPU time

namespace conveyor::detail {

// True when membarrier(PRIVATE_EXPEDITED) is registered for this process. Decided once.
inline bool asymmetric_barrier_enabled() noexcept {
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
inline std::atomic<bool>& force_symmetric_barrier() noexcept {
  static std::atomic<bool> forced{false};
  return forced;
}

inline bool use_asymmetric_barrier() noexcept {
  // relaxed: a configuration switch read on every notify; tests change it only while
  // no thread waits or notifies, and thread creation orders the change for them.
  return asymmetric_barrier_enabled() && !force_symmetric_barrier().load(std::memory_order_relaxed);
}

// Heavy side: a full barrier on every running thread of this process.
inline void heavy_barrier() noexcept {
#if defined(__linux__) && defined(SYS_membarrier)
  ::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
}

using wait_clock = std::chrono::steady_clock;

// Sleeps while word == expected, until woken or (if given) the deadline passes. Spurious
// returns are allowed; callers re-check. Linux: a private futex on the word, for both the
// timed and untimed case, so every sleeper is reached by futex_wake_all(). Elsewhere:
// C++20 atomic::wait, and short sleeps for the timed case.
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
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

inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
#if defined(__linux__) && defined(SYS_futex)
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX,
            nullptr, nullptr, 0);
#else
  word.notify_all();
#endif
}

// What blocking waits cost, for a caller that measures its waits (a pipeline stage's
// probe) without reading the clock around each one, and without waiting any other way
// than an unmeasured caller would. The spin is counted in rounds (the caller knows what
// a round costs, from the waits it times itself); the slow path reads the clock anyway,
// to tune the spin, and hands those readings out. Accumulates over several waits.
struct wait_timing {
  std::uint32_t rounds = 0;  // spin rounds (a re-check and a pause each), every wait
  std::int64_t slow_ns = 0;  // time past the spins: in yields and sleeps
  std::int64_t end_ns = 0;   // steady clock at the end of the last slow path; 0: none
};

// Where the process's CPU time can be read (conveyor::process_cpu_ns() is 0 elsewhere).
#if defined(__linux__)
inline constexpr bool process_cpu_clock = true;
#else
inline constexpr bool process_cpu_clock = false;
#endif

// Whether a waiter's yields pay on the cores it runs on, learned from what they took.
// A yield hands the core to another runnable thread until that thread waits or its time
// slice ends. Given to a thread of this process, that is progress: the trivial
// pipeline's stages run for tens of microseconds until they wait; a CPU-bound stage for
// a slice (1-3 ms here), and it is often the very thread waited for. Given to another
// process's busy thread, it is a whole time slice lost (3-5 ms here beside two busy
// loops: HZ=250 ticks), while a sleeper that is woken preempts that thread: one such
// yield per wait cut the trivial pipeline from 23 to 0.44 M items/s.
// So a long yield makes the wait point look closer at the next ones: it reads the
// process's CPU time around them (a syscall, too dear for every yield: the trivial
// pipeline yields ~100 000 times a second). A long yield during which this process got
// less CPU time than the yield lasted had not even the yielder's own core: another
// process ran there. It stops the wait point's yields for a while (its waiters spin,
// then sleep). The pause doubles with every such yield soon after the last (from
// min_quiet to max_quiet; the first yields after a pause probe whether the load is
// gone), and starts again from min_quiet after a long stretch without one. (Measured:
// the CPU time over the length of a long yield was below 0.25 for all of 2049 long
// yields beside two busy loops, and 1.75-2.25 for over 97% of them when the pipeline's
// own CPU-bound stages shared the cores.) A limit: on many cores the process's other
// threads can make up for the one core lost, and the yield is then taken for progress.
// Thread-safety: any number of threads; the words are relaxed hints (a stale value costs
// a yield, a syscall or a sleep, never correctness).
class yield_policy {
 public:
  static constexpr auto long_yield = std::chrono::microseconds(1000);
  static constexpr auto min_quiet = std::chrono::milliseconds(8);
  static constexpr auto max_quiet = std::chrono::milliseconds(256);
  // A lost yield this long after the last one starts the pause again from min_quiet.
  static constexpr int forget_after_quiets = 4;

  // True when a waiter may yield at `now`.
  bool may_yield(wait_clock::time_point now) const noexcept {
    return ns(now) >= quiet_until_.load(std::memory_order_relaxed);
  }
  // True when the next yield should be watched: the process's CPU time read around it.
  bool watch() const noexcept { return watch_.load(std::memory_order_relaxed) > 0; }
  // True from a lost yield until a waiter finds the pause over (see ended()): other
  // processes hold the cores, and a waiter's partner is often not running at all, so a
  // spin waits for nothing. A flag, not a clock reading: the spin starts without one.
  bool paused() const noexcept { return paused_.load(std::memory_order_relaxed); }
  // A waiter found may_yield() true: the pause, if any, is over.
  void ended() noexcept {
    if (paused_.load(std::memory_order_relaxed)) paused_.store(false, std::memory_order_relaxed);
  }

  // A yield that began at `from` and returned at `to`; cpu_ns: the process's CPU time
  // during it when watched, else negative.
  void yielded(wait_clock::time_point from, wait_clock::time_point to,
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
    if (cpu_ns < 0) return;  // not watched: the next ones are
    if (cpu_ns >= took) return;  // this process had the core: the yield was progress
    const std::int64_t end = ns(to);
    const std::int64_t quiet = quiet_ns_.load(std::memory_order_relaxed);
    const std::int64_t last = last_lost_.load(std::memory_order_relaxed);
    const std::int64_t next = end - last > forget_after_quiets * quiet
                                  ? ns(min_quiet)
                                  : std::min(2 * quiet, ns(max_quiet));
    quiet_ns_.store(next, std::memory_order_relaxed);
    last_lost_.store(end, std::memory_order_relaxed);
    quiet_until_.store(end + next, std::memory_order_relaxed);
    paused_.store(true, std::memory_order_relaxed);
  }

 private:
  static std::int64_t ns(wait_clock::duration d) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }
  static std::int64_t ns(wait_clock::time_point t) noexcept { return ns(t.time_since_epoch()); }

  static constexpr std::int32_t watched_yields = 8;
  std::atomic<std::int32_t> watch_{0};        // yields still to watch
  std::atomic<std::int64_t> quiet_ns_{0};     // the last pause
  std::atomic<std::int64_t> last_lost_{0};    // steady-clock time of the last lost yield
  std::atomic<std::int64_t> quiet_until_{0};  // no yields before this steady-clock time
  std::atomic<bool> paused_{false};           // a pause began and no waiter saw it end
};

class wait_point;

// The wake-ups a thread has put off (see wait_point's batched wakes), woken at the
// latest when the thread next waits anywhere or its wake_batching scope ends. Only a
// thread inside a wake_batching scope puts wake-ups off: a pipeline's stage threads,
// which end before the rings they use are destroyed. Thread-safety: one thread.
struct deferred_wakes {
  static constexpr int capacity = 8;
  struct entry {
    wait_point* point;
    std::uint32_t notifies;  // put off by this thread since it last woke the point
  };
  entry pending[capacity];
  int size = 0;
  // Counts a notify put off; true when it may be (else the caller wakes now: batch
  // notifies have come, or the list is full).
  bool put_off(wait_point* w, std::uint32_t batch) noexcept;
  void flush() noexcept;
};

inline thread_local deferred_wakes* this_thread_wakes = nullptr;

// While it lives, the calling thread may put wake-ups off (one per scope and thread).
class wake_batching {
 public:
  wake_batching() noexcept { this_thread_wakes = &wakes_; }
  ~wake_batching() {
    wakes_.flush();
    this_thread_wakes = nullptr;
  }
  wake_batching(const wake_batching&) = delete;
  wake_batching& operator=(const wake_batching&) = delete;

 private:
  deferred_wakes wakes_;
};

class wait_point {
 public:
  // batch > 1: while other processes take the cores (see yield_policy), a waiter may let
  // notifiers put off its wake-up until batch notifies (a pipeline's ring: half its
  // capacity) have come, the notifier waits itself, or backstop has passed. Each
  // hand-off across threads then costs one sleep and wake per batch instead of per few
  // items, where each wake-up means waiting for a core another process holds. Call
  // before any thread waits or notifies here (see ring_access::batch_wakes).
  void batch_wakes(std::uint32_t batch) noexcept { batch_ = batch; }

  // Blocks until pred() holds. pred reads only atomics the notifier publishes before
  // calling notify(), and may say false only when every change that could make it true
  // is followed by a notify(): a change nobody notifies about (in mpmc_ring, another
  // consumer's claim) must make pred true, or a sleeper can miss its last wake-up.
  // With timing: adds what this wait cost to *timing (see wait_timing).
  template <class Pred>
  void wait(Pred&& pred, wait_timing* timing = nullptr) noexcept {
    wait_impl(pred, nullptr, timing);
  }

  // As wait(), but gives up at the deadline. Returns pred()'s last value.
  template <class Pred>
  bool wait_until(Pred&& pred, wait_clock::time_point deadline,
                  wait_timing* timing = nullptr) noexcept {
    return wait_impl(pred, &deadline, timing);
  }

  // Call after publishing the state change that may satisfy a waiter's pred. Wakes every
  // thread asleep here; a no-op (no syscall, no shared write) when none is. Inlined: a
  // stage's burst (spsc_ring::drain) notifies per element, with the ring's fields in
  // registers across the fence.
  CONVEYOR_HOT_INLINE void notify() noexcept {
    // Dekker: we stored the publication, then load waiting_; a waiter stored waiting_,
    // then loads the publication (in pred). One of the two must see the other's store,
    // which needs StoreLoad order on both sides.
    if (asymmetric_) {
      // The waiter's membarrier() forces a full barrier on this thread between its
      // registration and its re-check, so a compiler fence suffices here.
      std::atomic_signal_fence(std::memory_order_seq_cst);
      const std::uint32_t waiting = waiting_.load(std::memory_order_relaxed);
      if (waiting == 0) return;
      // Only sleepers that accept a batched wake-up (they sleep with a backstop):
      // this notifier may put it off.
      if (waiting == batch_waiter) return notify_batched();
    }
    wake();
  }

  // As notify(), never put off: for a change every waiter must see now (a close).
  void notify_now() noexcept {
    if (asymmetric_) {
      std::atomic_signal_fence(std::memory_order_seq_cst);  // as in notify()
      if (waiting_.load(std::memory_order_relaxed) == 0) return;
    }
    wake();
  }

  // waiting_'s flags: a sleeper to wake at once, one that accepts a batched wake-up.
  static constexpr std::uint32_t plain_waiter = 1, batch_waiter = 2;
  // How long a sleeper that accepts a batched wake-up sleeps at most: what a notifier
  // that puts it off and then runs on (a slow stage function, a source that blocks)
  // adds to an item's latency, where a time slice lost to another process is 3-5 ms.
  static constexpr auto backstop = std::chrono::milliseconds(1);

  // For tests: the policy that tells load, how many wake-ups there were, who sleeps.
  yield_policy& yields() noexcept { return yields_; }
  std::uint32_t wakes() const noexcept { return epoch_.load(std::memory_order_relaxed); }
  std::uint32_t sleepers() const noexcept { return waiting_.load(std::memory_order_relaxed); }

  // A put-off wake-up's time has come (deferred_wakes::flush).
  void wake() noexcept {
    // seq_cst RMW: in waiting_'s modification order it is either after a waiter's
    // registration (and reads it) or before it (and the waiter's RMW synchronizes with
    // this one, so its pred() sees our publication). Clearing the flags makes
    // the wake-up once per sleep, not once per item pushed while the sleeper wakes up.
    if (waiting_.exchange(0, std::memory_order_seq_cst) == 0) return;
    // release: pairs with the acquire load of epoch_ in wait_impl().
    epoch_.fetch_add(1, std::memory_order_release);
    futex_wake_all(epoch_);
  }

 private:
  template <class Pred>
  bool wait_impl(Pred& pred, const wait_clock::time_point* deadline,
                 wait_timing* timing) noexcept {
    // Spin, then yield, then sleep: competitive spinning, tuned by what the last waits
    // needed. A spin that succeeds at round i moves the limit toward 2i + 16. A wait
    // that outlasts the spin but ends soon after (within short_wait: in a yield that ran
    // nothing else, or woken about as fast as a futex round trip) says a longer spin
    // would have paid, so the limit grows. One that ends in a yield that ran another
    // thread, or sleeps long, says spinning cannot pay (the other side shares this core,
    // or is slow), so the limit decays and waiters yield or sleep sooner instead of
    // stealing the core the worker needs. Deciding on the tail, not on the
    // typical wait, keeps both sides of a busy ring out of the sleep path (each trip
    // through it costs a membarrier here and a futex wake at the notifier). The yields
    // stop for a while where they hand time slices to other processes (yield_policy).
    // relaxed: spin_limit_ is a heuristic hint; a stale value costs time, never correctness.
    if (pred()) return true;
    const std::uint32_t limit = spin_limit_.load(std::memory_order_relaxed);
    // While other processes take the cores (yields_ paused) the spin is the shortest:
    // the other side is often not running at all. The learned limit is kept for after.
    const bool loaded = yields_.paused();
    const std::uint32_t spin = loaded ? std::min(limit, min_spin) : limit;
    for (std::uint32_t i = 0; i < spin; ++i) {
      if (pred()) {
        if (!loaded) adapt(limit, 2 * i + 16, 2 * i + 16 > limit ? 1 : 6);
        if (timing) timing->rounds += i + 1;
        return true;
      }
      // A timed wait looks at the clock now and then: under load a spin can be
      // preempted for far longer than it would take.
      if (deadline && i % 64 == 63 && wait_clock::now() >= *deadline) {
        if (timing) timing->rounds += i + 1;
        return false;
      }
      cpu_relax();
    }
    if (timing) timing->rounds += spin;
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
    const bool may_yield = yields_.may_yield(spun);
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
    const bool batched = batch_ > 1 && asymmetric_ && yields_.paused();
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

  static constexpr std::uint32_t max_spin = 1024, min_spin = 16;  // pause rounds (see adapt)

  // Puts this notify's wake-up off where the thread collects its put-off wake-ups and
  // it has put off fewer than batch_ notifies here since it last woke this point; else
  // wakes now. The count is the thread's own (several notifiers count apart: the
  // sleeper is woken sooner, never later). Out of line: notify() sits on every push and
  // pop, and this runs only under load.
  [[gnu::noinline]] void notify_batched() noexcept {
    deferred_wakes* const mine = this_thread_wakes;
    if (mine != nullptr && mine->put_off(this, batch_)) return;
    wake();
  }

  // A yield that took longer than this ran another thread (a yield with nothing else to
  // run is a syscall: ~1-2 us here, a context switch and back is several).
  static constexpr auto yield_switched = std::chrono::microseconds(5);

  // Returns its clock reading: the end of the wait.
  wait_clock::time_point learn_from_sleep(std::uint32_t limit, wait_clock::time_point spun) noexcept {
    constexpr auto short_wait = std::chrono::microseconds(50);
    const wait_clock::time_point now = wait_clock::now();
    if (now - spun < short_wait)
      adapt(limit, 2 * limit, 1);
    else
      adapt(limit, 0, 2);
    return now;
  }

  // Moves the limit toward target: quickly up (a longer spin would have paid), slowly
  // down after short waits (one lucky wait should not undo what the tail needs), and
  // quickly down after long sleeps (spinning cannot pay). max_spin bounds one spin to
  // about the cost of the sleep path it avoids (1024 pauses: ~40 us on a 39 ns pause),
  // the competitive bound: a wait never burns more than twice what sleeping would cost.
  void adapt(std::uint32_t limit, std::uint32_t target, int shift) noexcept {
    const std::int64_t t = std::min<std::int64_t>(target, max_spin);
    std::int64_t next = std::int64_t{limit} + (t - std::int64_t{limit}) / (std::int64_t{1} << shift);
    next = std::clamp<std::int64_t>(next, min_spin, max_spin);
    if (static_cast<std::uint32_t>(next) != limit)
      spin_limit_.store(static_cast<std::uint32_t>(next), std::memory_order_relaxed);
  }

  std::atomic<std::uint32_t> waiting_{0};  // plain_waiter | batch_waiter: who sleeps
  // Which barrier this wait point's two sides use, decided once: both sides must agree,
  // and notify(), on every push and pop, then reads one flag beside waiting_ instead of
  // a function-local static's guard, the static and the test switch (bench_rings: the
  // SPSC try path 5-15% faster for it).
  const bool asymmetric_ = use_asymmetric_barrier();
  std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::uint32_t> spin_limit_{256};
  std::uint32_t batch_ = 0;  // 0 or 1: every wake-up at once
  yield_policy yields_;
};

inline bool deferred_wakes::put_off(wait_point* w, std::uint32_t batch) noexcept {
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

inline void deferred_wakes::flush() noexcept {
  for (int i = 0; i < size; ++i) pending[i].point->wake();
  size = 0;
}

}  // namespace conveyor::detail
