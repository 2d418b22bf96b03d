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
// A spin looks at its condition at once, or, behind a partner that streams, after a
// learned delay: then it finds a run of elements (or of room) instead of taking each as
// it comes (first_look_).
//
// Under load from other processes (yield_policy: yields that hand whole time slices
// away), waiters spin the least and sleep in batches: the sleeper on a pipeline's ring
// lets a notifier inside a wake_batching scope (a stage thread) put its wake-up off
// until half a ring has come, until the notifier waits itself, or for 1 ms at most. Each
// wake-up then costs a core another process holds once per batch, not once per few
// items, and a batched sleeper skips the membarrier.
//
// The slow path (spin, yield, sleep, and what they learn) is compiled once, in the library
// (src/conveyor/wait.cpp); what sits on every push and pop (notify()'s check for a
// sleeper, a wait's first look at its condition) stays inline.
// Thread-safety: any number of waiters and notifiers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <type_traits>

#include "conveyor/base/config.hpp"
#include "conveyor/ring/wait_timing.hpp"

namespace conveyor::detail {

// True when membarrier(PRIVATE_EXPEDITED) is registered for this process. Decided once.
bool asymmetric_barrier_enabled() noexcept;

// Tests flip this to exercise the portable path on Linux too. A wait_point decides once,
// when it is constructed: set it before making the rings it should apply to.
std::atomic<bool>& force_symmetric_barrier() noexcept;

// How wait points judge the machine's load, for tests that need one behaviour whatever the
// machine does. measured (the default): by what their yields took (yield_policy).
// loaded: as if other processes held the cores (no yields, the shortest spins, sleepers
// accept batched wake-ups). unloaded: as if nothing else ran, and without yields (none can
// then be found lost). Set it while no thread waits.
enum class load_judgement : int { measured, loaded, unloaded };
std::atomic<load_judgement>& judged_load() noexcept;

inline bool use_asymmetric_barrier() noexcept {
  // relaxed: a configuration switch read on every notify; tests change it only while
  // no thread waits or notifies, and thread creation orders the change for them.
  return asymmetric_barrier_enabled() && !force_symmetric_barrier().load(std::memory_order_relaxed);
}

using wait_clock = std::chrono::steady_clock;

// What blocking waits cost (conveyor::wait_timing, public: the rings' blocking calls take
// one).
using conveyor::wait_timing;

// Whether a waiter's yields pay on the cores it runs on, learned from what they took.
// A yield hands the core to another runnable thread until that thread waits or its time
// slice ends. Given to a thread of this process, that is progress: the trivial
// pipeline's stages run for tens of microseconds until they wait; a CPU-bound stage for
// a slice (1-3 ms here), and it is often the very thread waited for. Given to another
// process's busy thread, it is a whole time slice lost (3-5 ms here beside two busy
// loops: HZ=250 ticks), while a sleeper that is woken preempts that thread.
// So a long yield makes the wait point look closer at the next ones: it reads the
// process's CPU time around them (a syscall, too dear for every yield). A long yield during which this process got
// less CPU time than the yield lasted had not even the yielder's own core: another
// process ran there. It stops the wait point's yields for a while (its waiters spin,
// then sleep). The pause doubles with every such yield soon after the last (from
// min_quiet to max_quiet; the first yields after a pause probe whether the load is
// gone), and starts again from min_quiet after a long stretch without one. A limit: on many cores the process's other
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
               std::int64_t cpu_ns) noexcept;

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
  // Sleepers register in a word of the wait point's own.
  wait_point() noexcept : wait_point(own_waiting_) {}
  // Sleepers register in `waiting`, a word the caller places where notifiers read it
  // cheaply: a ring puts it on the notifier's own index line, written by nobody else
  // until somebody sleeps, so notify(waiting) on every push and pop is a load from a line
  // the notifier holds anyway, and nothing of the wait point's own (whose line the
  // waiter writes as it learns).
  explicit wait_point(std::atomic<std::uint32_t>& waiting) noexcept : waiting_(waiting) {
    // Before the word is shared (the owner publishes it with the wait point).
    if (!asymmetric_) waiting_.store(symmetric_flag, std::memory_order_relaxed);
  }
  wait_point(const wait_point&) = delete;
  wait_point& operator=(const wait_point&) = delete;

  // batch > 1: while other processes take the cores (see yield_policy), a waiter may let
  // notifiers put off its wake-up until batch notifies (a pipeline's ring: half its
  // capacity) have come, the notifier waits itself, or backstop has passed. Each
  // hand-off across threads then costs one sleep and wake per batch instead of per few
  // items, where each wake-up means waiting for a core another process holds. Call
  // before any thread waits or notifies here (see spsc_ring::batch_wakeups()).
  void batch_wakes(std::uint32_t batch) noexcept { batch_ = batch; }

  // Blocks until pred() holds. pred reads only atomics the notifier publishes before
  // calling notify(), and may say false only when every change that could make it true
  // is followed by a notify(): a change nobody notifies about (in mpmc_ring, another
  // consumer's claim) must make pred true, or a sleeper can miss its last wake-up.
  // With timing: adds what this wait cost to *timing (see wait_timing).
  template <class Pred>
  void wait(Pred&& pred, wait_timing* timing = nullptr) noexcept {
    if (pred()) return;
    wait_slow(&call<std::remove_reference_t<Pred>>, erase(pred), nullptr, nullptr, nullptr, timing);
  }
  // As wait(), for a waiter that can tell whether more than the one step it waits for
  // is ready (run(): a second element, room for a second; it reads what pred() reads).
  // A spin whose first look finds a run makes the next spins look later (first_look_).
  template <class Pred, class Run>
  void wait(Pred&& pred, Run&& run, wait_timing* timing = nullptr) noexcept {
    if (pred()) return;
    wait_slow(&call<std::remove_reference_t<Pred>>, erase(pred),
              &call<std::remove_reference_t<Run>>, erase(run), nullptr, timing);
  }

  // As wait(), but gives up at the deadline. Returns pred()'s last value.
  template <class Pred>
  bool wait_until(Pred&& pred, wait_clock::time_point deadline,
                  wait_timing* timing = nullptr) noexcept {
    if (pred()) return true;
    return wait_slow(&call<std::remove_reference_t<Pred>>, erase(pred), nullptr, nullptr, &deadline,
                     timing);
  }

  // Call after publishing the state change that may satisfy a waiter's pred. Wakes every
  // thread asleep here; a no-op (no syscall, no shared write) when none is. Inlined: a
  // stage's burst (spsc_ring::drain) notifies per element, with the ring's fields in
  // registers across the fence.
  CONVEYOR_HOT_INLINE void notify() noexcept { notify(waiting_); }
  // notify() for the owner of the word sleepers register in (`waiting`: the word given
  // at construction), who reads it where it lies: the fast path reads that word alone.
  CONVEYOR_HOT_INLINE void notify(const std::atomic<std::uint32_t>& waiting) noexcept {
    // Dekker: we stored the publication, then load waiting_; a waiter stored waiting_,
    // then loads the publication (in pred). One of the two must see the other's store,
    // which needs StoreLoad order on both sides. With the asymmetric barrier the
    // waiter's membarrier() forces a full barrier on this thread between its
    // registration and its re-check, so a compiler fence suffices here. Without it the
    // word holds symmetric_flag for good: never 0, so every notify goes on to wake()'s
    // seq_cst RMW, a full barrier of its own.
    std::atomic_signal_fence(std::memory_order_seq_cst);
    const std::uint32_t sleeping = waiting.load(std::memory_order_relaxed);
    if (sleeping == 0) [[likely]]
      return;
    notify_slow(sleeping);
  }

  // As notify(), for a notifier that can tell from what it already holds whether a
  // waiter may be asleep: may_sleep() reads only what the waiter published before it
  // registered (a full ring: the producer's last element), and runs after the barrier
  // that orders the notifier's publication before it, so a waiter it says false for
  // re-checks its pred() after that publication and does not sleep. Saves the look at
  // waiting_ on every call where the answer is no. A waiter that sleeps without the heavy
  // barrier (batched) may be missed here, as by notify(): it has the backstop. A batched
  // waiter's wake-up, put off until batch notifies, sees one notify per opening of the
  // gate (a ring that was full): it comes when the notifier waits itself (which flushes
  // what it put off) or at the backstop.
  template <class MaySleep>
  CONVEYOR_HOT_INLINE void notify_if(MaySleep&& may_sleep) noexcept {
    // Dekker between our publication and may_sleep()'s load, against the waiter's
    // publication (before its registration) and its pred(): StoreLoad on both sides, a
    // compiler fence here where the waiter pays with membarrier, else a full fence (the
    // waiter's side: the seq_cst fence after its registration in wait_slow()).
    if (asymmetric_) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
#if CONVEYOR_TSAN
      return wake();  // no fence under TSan: wake()'s RMW orders both sides, every time
#else
      std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
    }
    if (!may_sleep()) return;
    notify();
  }

  // As notify(), never put off: for a change every waiter must see now (a close).
  void notify_now() noexcept;

  // waiting_'s flags: a sleeper to wake at once, one that accepts a batched wake-up;
  // set for good where the barrier is symmetric (see notify()).
  static constexpr std::uint32_t plain_waiter = 1, batch_waiter = 2, symmetric_flag = 4;
  // How long a sleeper that accepts a batched wake-up sleeps at most: what a notifier
  // that puts it off and then runs on (a slow stage function, a source that blocks)
  // adds to an item's latency, where a time slice lost to another process is 3-5 ms.
  static constexpr auto backstop = std::chrono::milliseconds(1);

  // The latest a spin looks at its condition first, in pauses (~10 us; see first_look_).
  static constexpr std::uint32_t max_first_look = 255;

  // For tests: the policy that tells load, how many wake-ups there were, who sleeps,
  // when the next spin looks first.
  yield_policy& yields() noexcept { return yields_; }
  std::uint32_t wakes() const noexcept { return epoch_.load(std::memory_order_relaxed); }
  std::uint32_t sleepers() const noexcept {
    return waiting_.load(std::memory_order_relaxed) & ~symmetric_flag;
  }
  std::uint32_t first_look() const noexcept { return first_look_.load(std::memory_order_relaxed); }

  // A put-off wake-up's time has come (deferred_wakes::flush).
  void wake() noexcept;

 private:
  // The slow path of wait() and wait_until(): pred(ctx) is the waiter's condition,
  // run(run_ctx), where given, whether a run is ready once it holds.
  using pred_fn = bool (*)(void*) noexcept;
  bool wait_slow(pred_fn pred, void* ctx, pred_fn run, void* run_ctx,
                 const wait_clock::time_point* deadline, wait_timing* timing) noexcept;
  template <class Pred>
  static bool call(void* pred) noexcept {
    return (*static_cast<Pred*>(pred))();
  }
  template <class Pred>
  static void* erase(Pred& pred) noexcept {
    return const_cast<void*>(static_cast<const void*>(&pred));
  }

  static constexpr std::uint32_t max_spin = 1024, min_spin = 16;  // pause rounds (see adapt)

  // Puts this notify's wake-up off where the thread collects its put-off wake-ups and
  // it has put off fewer than batch_ notifies here since it last woke this point; else
  // wakes now. The count is the thread's own (several notifiers count apart: the
  // sleeper is woken sooner, never later). Out of line: notify() sits on every push and
  // pop, and this runs only under load.
  [[gnu::noinline]] void notify_batched() noexcept;
  // notify() once the word said somebody may sleep (or the barrier is symmetric): only
  // sleepers that accept a batched wake-up (they sleep with a backstop) may have it put
  // off; others are woken now.
  [[gnu::noinline]] void notify_slow(std::uint32_t sleeping) noexcept;

  // A yield that took longer than this ran another thread (a yield with nothing else to
  // run is a syscall: ~1-2 us here, a context switch and back is several).
  static constexpr auto yield_switched = std::chrono::microseconds(5);

  // Returns its clock reading: the end of the wait.
  wait_clock::time_point learn_from_sleep(std::uint32_t limit,
                                          wait_clock::time_point spun) noexcept;

  // Moves the limit toward target: quickly up (a longer spin would have paid), slowly
  // down after short waits (one lucky wait should not undo what the tail needs), and
  // quickly down after long sleeps (spinning cannot pay). max_spin bounds one spin to
  // about the cost of the sleep path it avoids (1024 pauses: ~40 us on a 39 ns pause),
  // the competitive bound: a wait never burns more than twice what sleeping would cost.
  void adapt(std::uint32_t limit, std::uint32_t target, int shift) noexcept;
  // What a spin's first look found: a run ready, the one step waited for, nothing.
  enum class first_found { run, one, nothing };
  // The first look of the next spins: later after a run, sooner after nothing.
  void learn_first_look(std::uint32_t first, first_found found) noexcept;

  // What notifiers read: written by waiters only when they register to sleep.
  std::atomic<std::uint32_t> own_waiting_{0};
  std::atomic<std::uint32_t>& waiting_;  // plain_waiter | batch_waiter: who sleeps
  // Which barrier this wait point's two sides use, decided once: both sides must agree,
  // and notify_if() then reads one flag beside waiting_ instead of a function-local
  // static's guard, the static and the test switch (notify() needs the word alone).
  const bool asymmetric_ = use_asymmetric_barrier();
  std::uint32_t batch_ = 0;  // 0 or 1: every wake-up at once
  // What waiters write as they wait and learn, on a line of its own, so that a wait that
  // adapts its spin does not take the line above from a notifier that reads it.
  alignas(cache_line_size) std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::uint32_t> spin_limit_{256};
  // How many pauses a spin lets pass before its first look at pred(). A waiter right
  // behind a partner that streams takes each element (or slot) as it comes, and the
  // two cores pass the line they share back and forth for each one, which slows both
  // (see benchmarks/RESULTS.md, "Rings"). Looking later, it finds a run and takes it in
  // one go. So a first look that finds a run (wait(pred, run)) doubles the next spins'
  // delay (2f + 1, up to max_first_look); one that finds the one step waited for keeps
  // it; one that finds nothing (the partner is slow), or a wait that ends later, halves
  // it. A ping-pong partner never leaves a run, and a wait without run() never makes
  // the delay grow (it does wait out a delay other waits here learned): a wait point
  // none of whose waits pass run() (mpmc_ring's, the reorder buffer's) looks at once.
  // The delay comes before the spin's spin_limit_ looks and is learned apart from them;
  // under load (yield_policy) a spin looks at once.
  std::atomic<std::uint32_t> first_look_{0};
  yield_policy yields_;
};

}  // namespace conveyor::detail
