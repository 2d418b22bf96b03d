// benchmarks/bench_rings.cpp: conveyor's rings against peer queues, same workload, one binary.
//
//   ./bench_rings                                          # every benchmark, ~3 min on 2 cores
//   ./bench_rings --benchmark_filter='spsc/.*/1024'        # one family
//   ./bench_rings --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Names read <workload>/<queue>/<path>[/<capacity>]:
//   spsc/Q/{try,block}/{1024,65536}  one producer (core 0) -> one consumer (core 1), 1<<20
//                                    items per iteration, the consumer checks FIFO order
//   rtt/Q/{try,block}                ping-pong through two rings (core 0 <-> core 1), 1<<14
//                                    round trips per iteration; ns_per_rtt is the latency
//   mpmc2x2/Q/{try,block}[/64B]      2 producers and 2 consumers on 2 cores, capacity 1024,
//                                    1<<20 items per iteration, the consumers check the sum;
//                                    64B: 64-byte elements (8 bytes otherwise)
//   idle/Q                           a consumer blocked in pop() on an empty ring for 1 s:
//                                    its own thread CPU time, as cpu_us_per_s
// "conveyor" is spsc_ring's default layout (line_turns for 8-byte items, cached_head for
// 64-byte ones), which a pipeline's links use too; "conveyor-turns" its slot_turns layout.
// "try" spins on try_push/try_pop (pause, and a yield every 64 failures so a waiting thread
// hands back a shared core); "block" uses the queue's blocking calls. Peers: a std::mutex +
// two std::condition_variable bounded queue ("mutex"), boost::lockfree ("boost", no blocking
// path: try only), moodycamel ("moodycamel": ReaderWriterQueue / ConcurrentQueue with tokens
// for try, their Blocking* variants for block, whose producer side has no blocking call and
// spins on try_enqueue like the try path; "moodycamel-circ": BlockingReaderWriterCircularBuffer,
// moodycamel's bounded SPSC with wait_enqueue; "moodycamel-fit": the ReaderWriterQueue
// sized to hold at most the capacity, see moodycamel_spsc_fit). "lamport-{packed,pad64,
// pad128}" is a Lamport ring with index caches (conveyor's spsc_ring until it moved to
// per-slot sequence numbers) with both indices (and their caches) on one line, or each
// side on its own 64- or 128-byte line: the false-sharing measurement behind
// conveyor::cache_line_size. Every queue is constructed with the benchmark's capacity and
// used bounded (moodycamel's never allocate on the try_enqueue path); the SPSC rows'
// "holds" counter says how many items each one so constructed accepts.
// Timing is manual: from releasing the pinned threads to the last one finishing.
//
// Thread-safety: a benchmark binary; each benchmark owns its queues and threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>  // pthread_setaffinity_np: pin each thread to one core
#include <sched.h>
#include <time.h>  // clock_gettime(CLOCK_THREAD_CPUTIME_ID)

#include <concurrentqueue/blockingconcurrentqueue.h>
#include <readerwriterqueue/readerwritercircularbuffer.h>
#include <readerwriterqueue/readerwriterqueue.h>
#include <boost/lockfree/queue.hpp>
#include <boost/lockfree/spsc_queue.hpp>

#include "conveyor/base/config.hpp"
#include "conveyor/base/cpu_relax.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/ring/mpmc_ring.hpp"
#include "conveyor/ring/spsc_ring.hpp"
#include "lamport_ring.hpp"

namespace {

using item = std::uint64_t;
using clock_type = std::chrono::steady_clock;

// A 64-byte element: one cache line's worth per item. The producer fills every word from
// the sequence number; the consumer checks the first and the last.
struct item64 {
  std::uint64_t w[8];
};
inline void fill(item& v, item i) { v = i; }
inline void fill(item64& v, item i) {
  for (std::uint64_t k = 0; k < 8; ++k) v.w[k] = i + k;
}
inline bool is(const item& v, item i) { return v == i; }
inline bool is(const item64& v, item i) { return v.w[0] == i && v.w[7] == i + 7; }
// The sequence number an element carries, for sums; a torn item64 reads as ~0.
inline item value_of(const item& v) { return v; }
inline item value_of(const item64& v) { return v.w[7] == v.w[0] + 7 ? v.w[0] : ~item{0}; }

// Work on one side of a ring, per item: a chain of dependent multiply-adds (~5 ns here),
// which makes that side the slower one. The other side then catches up with it: the ring
// runs full (producer faster) or empty (consumer faster).
enum class regime { balanced, producer_faster, consumer_faster };
constexpr int work_rounds = 4;
inline void work(item& state) noexcept {
  for (int i = 0; i < work_rounds; ++i)
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
  benchmark::DoNotOptimize(state);
}
constexpr const char* regime_name(regime r) {
  return r == regime::balanced          ? "balanced"
         : r == regime::producer_faster ? "producer-faster"
                                        : "consumer-faster";
}

constexpr item spsc_items = item{1} << 20;
constexpr item mpmc_items = item{1} << 20;
constexpr item rtt_round_trips = item{1} << 14;
constexpr std::size_t rtt_capacity = 1024;
constexpr std::size_t mpmc_capacity = 1024;
constexpr double min_time_s = 0.1;

// ---------------------------------------------------------------------------------------
// Threads: pinned, released together, timed from the release to the last finish.

int core(int i) {
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(static_cast<unsigned>(i) % std::min(n, 2u));  // cores 0 and 1
}

void pin_to_core(int c) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(c, &set);
  // A failure (a cpuset without core c) leaves the thread unpinned: still correct.
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

struct job {
  int core;
  std::function<void()> body;
};

// Runs every job on its own thread pinned to its core, all released at once; returns the
// seconds from the release to the end of the last job (thread start-up is not timed).
double run_pinned(std::vector<job> jobs) {
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<clock_type::time_point> finished(jobs.size());
  std::vector<std::thread> threads;
  threads.reserve(jobs.size());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    threads.emplace_back([&, i] {
      pin_to_core(jobs[i].core);
      ready.fetch_add(1, std::memory_order_relaxed);  // relaxed: only counts arrivals
      go.wait(false, std::memory_order_acquire);      // acquire: pairs with the release below
      jobs[i].body();
      finished[i] = clock_type::now();  // read by the main thread after join()
    });
  }
  while (ready.load(std::memory_order_relaxed) < jobs.size()) std::this_thread::yield();
  const auto start = clock_type::now();
  go.store(true, std::memory_order_release);  // release: pairs with the workers' acquire wait
  go.notify_all();
  for (auto& t : threads) t.join();
  const auto end = *std::max_element(finished.begin(), finished.end());
  return std::chrono::duration<double>(end - start).count();
}

using bench::backoff;
enum class path { try_, block };

// Per-thread state of a queue; most queues need none. moodycamel::ConcurrentQueue's
// producer and consumer tokens live here.
struct no_state {};

// ---------------------------------------------------------------------------------------
// Adapters: one shape for every queue. try_push/try_pop never block; push/pop block.

template <class E = item, conveyor::spsc_layout L = conveyor::default_spsc_layout<E>>
struct conveyor_spsc_of {
  static constexpr bool has_block = true;
  using value_type = E;
  using producer = no_state;
  using consumer = no_state;
  explicit conveyor_spsc_of(std::size_t cap) : q(cap) {}
  producer make_producer() { return {}; }
  consumer make_consumer() { return {}; }
  bool try_push(producer&, const E& v) { return q.try_push(v); }
  bool try_pop(consumer&, E& v) { return q.try_pop(v); }
  void push(producer&, const E& v) { q.push(v); }
  void pop(consumer&, E& v) { v = *q.pop(); }
  conveyor::spsc_ring<E, L> q;
};
using conveyor_spsc = conveyor_spsc_of<>;
// The layout a pipeline's links use (stage/detail/link.hpp).
using conveyor_spsc_turns = conveyor_spsc_of<item, conveyor::spsc_layout::slot_turns>;

template <class E = item>
struct conveyor_mpmc_of {
  static constexpr bool has_block = true;
  using value_type = E;
  using producer = no_state;
  using consumer = no_state;
  explicit conveyor_mpmc_of(std::size_t cap) : q(cap) {}
  producer make_producer() { return {}; }
  consumer make_consumer() { return {}; }
  bool try_push(producer&, const E& v) { return q.try_push(v); }
  bool try_pop(consumer&, E& v) {
    auto o = q.try_pop();
    if (!o) return false;
    v = *o;
    return true;
  }
  void push(producer&, const E& v) { q.push(v); }
  void pop(consumer&, E& v) { v = *q.pop(); }
  conveyor::mpmc_ring<E> q;
};
using conveyor_mpmc = conveyor_mpmc_of<>;

// Bounded ring under one std::mutex, with a condition variable per direction.
class mutex_queue {
 public:
  static constexpr bool has_block = true;
  using value_type = item;
  using producer = no_state;
  using consumer = no_state;
  explicit mutex_queue(std::size_t cap) : buf_(cap), mask_(cap - 1) {}
  producer make_producer() { return {}; }
  consumer make_consumer() { return {}; }

  bool try_push(producer&, item v) {
    {
      std::lock_guard lock(m_);
      if (count_ == buf_.size()) return false;
      buf_[(head_ + count_) & mask_] = v;
      ++count_;
    }
    not_empty_.notify_one();
    return true;
  }
  bool try_pop(consumer&, item& v) {
    {
      std::lock_guard lock(m_);
      if (count_ == 0) return false;
      v = take();
    }
    not_full_.notify_one();
    return true;
  }
  void push(producer&, item v) {
    {
      std::unique_lock lock(m_);
      not_full_.wait(lock, [&] { return count_ < buf_.size(); });
      buf_[(head_ + count_) & mask_] = v;
      ++count_;
    }
    not_empty_.notify_one();
  }
  void pop(consumer&, item& v) {
    {
      std::unique_lock lock(m_);
      not_empty_.wait(lock, [&] { return count_ > 0; });
      v = take();
    }
    not_full_.notify_one();
  }

 private:
  item take() {
    const item v = buf_[head_];
    head_ = (head_ + 1) & mask_;
    --count_;
    return v;
  }

  std::mutex m_;
  std::condition_variable not_empty_;
  std::condition_variable not_full_;
  std::vector<item> buf_;
  std::size_t mask_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

// boost::lockfree::spsc_queue with a compile-time capacity (its fastest form).
template <std::size_t Cap, class E = item>
struct boost_spsc {
  static constexpr bool has_block = false;
  using value_type = E;
  using producer = no_state;
  using consumer = no_state;
  explicit boost_spsc(std::size_t) {}
  producer make_producer() { return {}; }
  consumer make_consumer() { return {}; }
  bool try_push(producer&, const E& v) { return q.push(v); }
  bool try_pop(consumer&, E& v) { return q.pop(v); }
  boost::lockfree::spsc_queue<E, boost::lockfree::capacity<Cap>> q;
};

// boost::lockfree::queue, fixed-size node pool: push fails instead of allocating.
template <std::size_t Cap, class E = item>
struct boost_mpmc {
  static constexpr bool has_block = false;
  using value_type = E;
  using producer = no_state;
  using consumer = no_state;
  explicit boost_mpmc(std::size_t) {}
  producer make_producer() { return {}; }
  consumer make_consumer() { return {}; }
  bool try_push(producer&, const E& v) { return q.bounded_push(v); }
  bool try_pop(consumer&, E& v) { return q.pop(v); }
  boost::lockfree::queue<E, boost::lockfree::capacity<Cap>> q;
};

// moodycamel SPSC: ReaderWriterQueue (try) / BlockingReaderWriterQueue (wait_dequeue).
// Constructed with the capacity and fed through try_enqueue only, so it never grows.
template <class Q>
struct moodycamel_rwq {
  static constexpr bool has_block = requires(Q& q, item& v) { q.wait_dequeue(v); };
  using value_type = item;
  using producer = no_state;
  using consumer = no_state;
  explicit moodycamel_rwq(std::size_t cap) : q(cap) {}
  producer make_producer() { return {}; }
  consumer make_consumer() { return {}; }
  bool try_push(producer&, item v) { return q.try_enqueue(v); }
  bool try_pop(consumer&, item& v) { return q.try_dequeue(v); }
  void push(producer& p, item v) {  // no blocking enqueue that stays bounded
    backoff wait;
    while (!try_push(p, v)) wait();
  }
  void pop(consumer&, item& v) {
    if constexpr (has_block) q.wait_dequeue(v);
  }
  Q q;
};
using moodycamel_spsc = moodycamel_rwq<moodycamel::ReaderWriterQueue<item>>;
// The same queue sized to hold no more than the capacity where it can: asked for 1024 it
// makes four 512-slot blocks and holds 2044 items (the "holds" counter), twice as many as
// the bounded queues beside it, and hands room to its producer a block at a time. Asked
// for 1023 it makes one block of 1024 and holds 1023. From 65536 up its blocks hold ~1.4%
// more than asked whatever the size, which is left as it is.
struct moodycamel_spsc_fit : moodycamel_spsc {
  explicit moodycamel_spsc_fit(std::size_t cap) : moodycamel_spsc(cap <= 1024 ? cap - 1 : cap) {}
};
using moodycamel_spsc_blocking = moodycamel_rwq<moodycamel::BlockingReaderWriterQueue<item>>;

// moodycamel::BlockingReaderWriterCircularBuffer: bounded SPSC with blocking on both sides.
struct moodycamel_circ {
  static constexpr bool has_block = true;
  using value_type = item;
  using producer = no_state;
  using consumer = no_state;
  explicit moodycamel_circ(std::size_t cap) : q(cap) {}
  producer make_producer() { return {}; }
  consumer make_consumer() { return {}; }
  bool try_push(producer&, item v) { return q.try_enqueue(v); }
  bool try_pop(consumer&, item& v) { return q.try_dequeue(v); }
  void push(producer&, item v) { q.wait_enqueue(v); }
  void pop(consumer&, item& v) { q.wait_dequeue(v); }
  moodycamel::BlockingReaderWriterCircularBuffer<item> q;
};

// moodycamel MPMC with explicit producer/consumer tokens (its fastest use), bounded:
// sized for the capacity and two explicit producers, no implicit producers, fed through
// try_enqueue (never allocates).
template <class Q>
struct moodycamel_cq {
  static constexpr bool has_block =
      requires(Q& q, moodycamel::ConsumerToken& c, item& v) { q.wait_dequeue(c, v); };
  using value_type = item;
  using producer = moodycamel::ProducerToken;
  using consumer = moodycamel::ConsumerToken;
  explicit moodycamel_cq(std::size_t cap) : q(cap, 2, 0) {}
  producer make_producer() { return producer(q); }
  consumer make_consumer() { return consumer(q); }
  bool try_push(producer& p, item v) { return q.try_enqueue(p, v); }
  bool try_pop(consumer& c, item& v) { return q.try_dequeue(c, v); }
  // Bounded try_enqueue can refuse forever here: with 2 producers x 2 consumers on 2
  // cores, one producer was seen spinning on a refused try_enqueue for minutes while
  // both consumers slept on an empty queue (its blocks stay with the producer that
  // filled them). After stuck_after refusals in a row the item goes in through the
  // allocating enqueue(), counted in fallbacks (reported as a counter), so the run ends.
  static constexpr unsigned stuck_after = 1u << 20;
  void push(producer& p, item v) {
    backoff wait;
    for (unsigned refused = 0; !try_push(p, v); ++refused) {
      if (refused == stuck_after) {
        (void)q.enqueue(p, v);
        fallbacks.fetch_add(1, std::memory_order_relaxed);  // relaxed: read after join
        return;
      }
      wait();
    }
  }
  void pop(consumer& c, item& v) {
    if constexpr (has_block) q.wait_dequeue(c, v);
  }
  Q q;
  std::atomic<std::uint64_t> fallbacks{0};
};
using moodycamel_mpmc = moodycamel_cq<moodycamel::ConcurrentQueue<item>>;
using moodycamel_mpmc_blocking = moodycamel_cq<moodycamel::BlockingConcurrentQueue<item>>;

// The in-bench Lamport rings (benchmarks/lamport_ring.hpp) in the harness's shape.
template <std::size_t Align, class E = item>
class lamport_spsc : public bench::lamport_ring<E, Align> {
 public:
  static constexpr bool has_block = false;
  using value_type = E;
  using producer = no_state;
  using consumer = no_state;
  using bench::lamport_ring<E, Align>::lamport_ring;
  producer make_producer() { return {}; }
  consumer make_consumer() { return {}; }
  bool try_push(producer&, const E& v) { return bench::lamport_ring<E, Align>::try_push(v); }
  bool try_pop(consumer&, E& v) { return bench::lamport_ring<E, Align>::try_pop(v); }
};

// ---------------------------------------------------------------------------------------
// The same calls on every queue.

// Always inlined into every queue's loop alike: the harness's calls are not part of what
// is compared.
template <path P, class Q>
[[gnu::always_inline]] inline void put(Q& q, typename Q::producer& p,
                                       const typename Q::value_type& v) {
  if constexpr (P == path::block) {
    static_assert(Q::has_block, "this queue has no blocking path");
    q.push(p, v);
  } else if constexpr (requires { q.fallbacks; }) {
    q.push(p, v);  // moodycamel's MPMC: the same try_enqueue loop, with its way out
  } else {
    backoff wait;
    while (!q.try_push(p, v)) wait();
  }
}

template <path P, class Q>
[[gnu::always_inline]] inline typename Q::value_type take(Q& q, typename Q::consumer& c) {
  typename Q::value_type v{};
  if constexpr (P == path::block) {
    static_assert(Q::has_block, "this queue has no blocking path");
    q.pop(c, v);
  } else {
    backoff wait;
    while (!q.try_pop(c, v)) wait();
  }
  return v;
}

template <path P, class Q, regime R = regime::balanced>
void spsc_throughput(benchmark::State& state, std::size_t capacity) {
  using E = typename Q::value_type;
  auto q = std::make_unique<Q>(capacity);
  auto p = q->make_producer();  // per-thread state lives as long as the queue
  auto c = q->make_consumer();
  // How many items a queue so constructed accepts before it refuses: what "capacity"
  // really bought, measured on a twin (bounded peers round the capacity up, see above).
  double holds = 0;
  {
    auto twin = std::make_unique<Q>(capacity);
    auto tp = twin->make_producer();
    while (holds < 4.0 * static_cast<double>(capacity) && twin->try_push(tp, E{})) ++holds;
  }
  item out_of_order = 0;
  const auto pass = [&] {
    return run_pinned({
        {core(0),
         [&] {
           item w = 1;
           E v{};
           for (item i = 0; i < spsc_items; ++i) {
             if constexpr (R == regime::consumer_faster) work(w);
             fill(v, i);
             put<P>(*q, p, v);
           }
         }},
        {core(1),
         [&] {
           item bad = 0, w = 2;
           for (item i = 0; i < spsc_items; ++i) {
             bad += !is(take<P>(*q, c), i);
             if constexpr (R == regime::producer_faster) work(w);
           }
           out_of_order += bad;
         }},
    });
  };
  (void)pass();  // untimed: the ring's memory touched and the threads' caches warm
  for (auto _ : state) state.SetIterationTime(pass());
  if (out_of_order != 0) state.SkipWithError("consumer saw items out of FIFO order");
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * spsc_items));
  state.counters["holds"] = holds;
}

template <path P, class Q>
void round_trip(benchmark::State& state) {
  auto ping = std::make_unique<Q>(rtt_capacity);
  auto pong = std::make_unique<Q>(rtt_capacity);
  auto ping_p = ping->make_producer();
  auto ping_c = ping->make_consumer();
  auto pong_p = pong->make_producer();
  auto pong_c = pong->make_consumer();
  item wrong = 0;
  for (auto _ : state) {
    const double s = run_pinned({
        {core(0),
         [&] {
           item bad = 0;
           for (item i = 0; i < rtt_round_trips; ++i) {
             put<P>(*ping, ping_p, i);
             bad += take<P>(*pong, pong_c) != i;
           }
           wrong += bad;
         }},
        {core(1),
         [&] {
           for (item i = 0; i < rtt_round_trips; ++i) put<P>(*pong, pong_p, take<P>(*ping, ping_c));
         }},
    });
    state.SetIterationTime(s);
  }
  if (wrong != 0) state.SkipWithError("a round trip came back with the wrong value");
  const auto trips = static_cast<double>(state.iterations() * rtt_round_trips);
  state.SetItemsProcessed(static_cast<std::int64_t>(trips));
  // rate inverted: seconds per round trip, printed as ns.
  state.counters["ns_per_rtt"] =
      benchmark::Counter(trips, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

template <path P, class Q>
void mpmc_2x2(benchmark::State& state) {
  auto q = std::make_unique<Q>(mpmc_capacity);
  // Per-thread state (moodycamel's tokens) made once: a token per thread per iteration
  // would make moodycamel recycle producers, which is not the workload measured here.
  typename Q::producer producers[2] = {q->make_producer(), q->make_producer()};
  typename Q::consumer consumers[2] = {q->make_consumer(), q->make_consumer()};
  constexpr item half = mpmc_items / 2;
  item sum = 0;
  item expected = 0;
  for (auto _ : state) {
    item sums[2] = {0, 0};
    auto produce = [&](int k) {
      const item first = static_cast<item>(k) * half;
      typename Q::value_type v{};
      for (item i = first; i < first + half; ++i) {
        fill(v, i);
        put<P>(*q, producers[k], v);
      }
    };
    auto consume = [&](int k) {
      item local = 0;
      for (item i = 0; i < half; ++i) local += value_of(take<P>(*q, consumers[k]));  // half each
      sums[k] = local;
    };
    // One producer and one consumer per core: hand-offs happen within a core and across.
    const double s = run_pinned({
        {core(0), [&] { produce(0); }},
        {core(1), [&] { produce(1); }},
        {core(1), [&] { consume(0); }},
        {core(0), [&] { consume(1); }},
    });
    state.SetIterationTime(s);
    sum += sums[0] + sums[1];
    expected += mpmc_items * (mpmc_items - 1) / 2;
  }
  if (sum != expected) state.SkipWithError("items lost or duplicated");
  if constexpr (requires { q->fallbacks; })
    state.counters["allocating_enqueues"] = static_cast<double>(q->fallbacks.load());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * mpmc_items));
}

std::int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// A consumer blocked in pop() on an empty queue for 1 s: the CPU its own thread burns.
template <class Q>
void idle_consumer(benchmark::State& state) {
  auto q = std::make_unique<Q>(1024);
  auto p = q->make_producer();
  auto c = q->make_consumer();
  double cpu_s = 0, blocked_s = 0;
  for (auto _ : state) {
    std::int64_t cpu_ns = 0;
    clock_type::time_point blocked_at{}, woke_at{};
    const double s = run_pinned({
        {core(0),
         [&] {
           const std::int64_t t0 = thread_cpu_ns();
           blocked_at = clock_type::now();
           item v = 0;
           q->pop(c, v);
           woke_at = clock_type::now();
           cpu_ns = thread_cpu_ns() - t0;
         }},
        {core(1),
         [&] {
           std::this_thread::sleep_for(std::chrono::seconds(1));
           while (!q->try_push(p, 1)) std::this_thread::yield();
         }},
    });
    state.SetIterationTime(s);
    cpu_s += static_cast<double>(cpu_ns) * 1e-9;
    blocked_s += std::chrono::duration<double>(woke_at - blocked_at).count();
  }
  state.counters["cpu_us_per_s"] = benchmark::Counter(blocked_s > 0 ? 1e6 * cpu_s / blocked_s : 0);
}

// ---------------------------------------------------------------------------------------
// Registration: readable names, manual time, the same settings for every peer.

// iterations == 0: as many as min_time_s needs.
benchmark::internal::Benchmark* add(const std::string& name,
                                    std::function<void(benchmark::State&)> fn,
                                    benchmark::IterationCount iterations = 0) {
  auto* b = benchmark::RegisterBenchmark(name.c_str(),
                                         [fn = std::move(fn)](benchmark::State& st) { fn(st); });
  b->UseManualTime()->Unit(benchmark::kMillisecond);
  if (iterations > 0)
    b->Iterations(iterations);
  else
    b->MinTime(min_time_s);
  return b;
}

template <class Q>
void add_spsc(const std::string& queue, std::size_t cap, bool with_try = true) {
  const std::string suffix = "/" + std::to_string(cap);
  if (with_try)
    add("spsc/" + queue + "/try" + suffix,
        [cap](benchmark::State& st) { spsc_throughput<path::try_, Q>(st, cap); });
  if constexpr (Q::has_block)
    add("spsc/" + queue + "/block" + suffix,
        [cap](benchmark::State& st) { spsc_throughput<path::block, Q>(st, cap); });
}

// The regimes: conveyor's ring (both paths) against boost and the in-bench Lamport rings,
// named spsc/<queue>/<path>/<capacity>/<item bytes>B/<regime>.
template <regime R, std::size_t Cap, class E>
void add_spsc_regime() {
  const std::string tail =
      "/" + std::to_string(Cap) + "/" + std::to_string(sizeof(E)) + "B/" + regime_name(R);
  const auto one = [&]<class Q>(const std::string& queue, bool block) {
    add("spsc/" + queue + (block ? "/block" : "/try") + tail, [block](benchmark::State& st) {
      if (block) {
        if constexpr (Q::has_block) spsc_throughput<path::block, Q, R>(st, Cap);
      } else {
        spsc_throughput<path::try_, Q, R>(st, Cap);
      }
    });
  };
  one.template operator()<conveyor_spsc_of<E>>("conveyor", false);
  one.template operator()<conveyor_spsc_of<E>>("conveyor", true);
  using turns = conveyor_spsc_of<E, conveyor::spsc_layout::slot_turns>;
  one.template operator()<turns>("conveyor-turns", false);
  one.template operator()<turns>("conveyor-turns", true);
  one.template operator()<boost_spsc<Cap, E>>("boost", false);
  one.template operator()<lamport_spsc<0, E>>("lamport-packed", false);
  one.template operator()<lamport_spsc<64, E>>("lamport-pad64", false);
  one.template operator()<lamport_spsc<128, E>>("lamport-pad128", false);
}
template <regime R>
void add_spsc_regimes() {
  add_spsc_regime<R, 1024, item>();
  add_spsc_regime<R, 65536, item>();
  add_spsc_regime<R, 1024, item64>();
  add_spsc_regime<R, 65536, item64>();
}

template <std::size_t Cap>
void add_spsc_family() {
  add_spsc<conveyor_spsc>("conveyor", Cap);
  add_spsc<conveyor_spsc_turns>("conveyor-turns", Cap);
  add_spsc<boost_spsc<Cap>>("boost", Cap);
  add_spsc<moodycamel_spsc>("moodycamel", Cap);  // try path: plain ReaderWriterQueue
  add_spsc<moodycamel_spsc_blocking>("moodycamel", Cap, /*with_try=*/false);
  add_spsc<moodycamel_spsc_fit>("moodycamel-fit", Cap);
  add_spsc<moodycamel_circ>("moodycamel-circ", Cap);
  add_spsc<mutex_queue>("mutex", Cap);
  add_spsc<lamport_spsc<0>>("lamport-packed", Cap);
  add_spsc<lamport_spsc<64>>("lamport-pad64", Cap);
  add_spsc<lamport_spsc<128>>("lamport-pad128", Cap);
}

template <class Q, path P>
void add_rtt(const std::string& queue) {
  add("rtt/" + queue + (P == path::block ? "/block" : "/try"), round_trip<P, Q>);
}

template <class Q, path P>
void add_mpmc(const std::string& queue) {
  const std::string bytes = sizeof(typename Q::value_type) == sizeof(item)
                                ? ""
                                : "/" + std::to_string(sizeof(typename Q::value_type)) + "B";
  add("mpmc2x2/" + queue + (P == path::block ? "/block" : "/try") + bytes, mpmc_2x2<P, Q>);
}

void register_all() {
  add_spsc_regimes<regime::balanced>();
  add_spsc_regimes<regime::producer_faster>();
  add_spsc_regimes<regime::consumer_faster>();
  add_spsc_family<1024>();
  add_spsc_family<65536>();

  add_rtt<conveyor_spsc, path::try_>("conveyor");
  add_rtt<conveyor_spsc, path::block>("conveyor");
  add_rtt<boost_spsc<rtt_capacity>, path::try_>("boost");
  add_rtt<moodycamel_spsc, path::try_>("moodycamel");
  add_rtt<moodycamel_spsc_blocking, path::block>("moodycamel");
  add_rtt<moodycamel_circ, path::block>("moodycamel-circ");
  add_rtt<mutex_queue, path::try_>("mutex");
  add_rtt<mutex_queue, path::block>("mutex");

  add_mpmc<conveyor_mpmc, path::try_>("conveyor");
  add_mpmc<conveyor_mpmc, path::block>("conveyor");
  add_mpmc<boost_mpmc<mpmc_capacity>, path::try_>("boost");
  add_mpmc<moodycamel_mpmc, path::try_>("moodycamel");
  add_mpmc<moodycamel_mpmc_blocking, path::block>("moodycamel");
  add_mpmc<mutex_queue, path::try_>("mutex");
  add_mpmc<mutex_queue, path::block>("mutex");
  add_mpmc<conveyor_mpmc_of<item64>, path::try_>("conveyor");
  add_mpmc<conveyor_mpmc_of<item64>, path::block>("conveyor");
  add_mpmc<boost_mpmc<mpmc_capacity, item64>, path::try_>("boost");

  add("idle/conveyor-spsc", idle_consumer<conveyor_spsc>, 1);
  add("idle/conveyor-mpmc", idle_consumer<conveyor_mpmc>, 1);
  add("idle/moodycamel", idle_consumer<moodycamel_spsc_blocking>, 1);
  add("idle/mutex", idle_consumer<mutex_queue>, 1);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::AddCustomContext("conveyor_cache_line_size",
                              std::to_string(conveyor::cache_line_size));
  benchmark::AddCustomContext(
      "conveyor_asymmetric_barrier",
      conveyor::detail::asymmetric_barrier_enabled() ? "membarrier" : "seq_cst exchange");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
