// conveyor/stage/detail/context.hpp: what every running stage shares: the envelope that
// carries an item between stages, the link (ring) type, the control block that turns
// the first failure anywhere into a stop everywhere, and the per-worker probe through
// which a stage's thread feeds its counters, its trace track and NVTX.
//
//   detail::control ctl{/*metrics=*/true, /*trace_events=*/4096};   // one per pipeline
//   detail::worker_probe probe{ctl, stats, w, track, "decode", "ring decode"};  // worker w
//   auto x = probe.pop(in);      probe.occupancy(in);   // starved only if it waited
//   { metrics::nvtx_range r{probe.span_name()}; y = f(*x); }   probe.work_done();
//   probe.push(out, std::move(y));                      // blocked only if it waited
//   probe.emplace(out, std::move(v), meta, meta_list{}); // the same, built in the slot
//   probe.wait_as(worker_probe::wait_for::input, [&](wait_timing* t) {  // any other wait,
//     window.wait(ready, t); return true; });                         // measured the same
//
// Thread-safety: control's atomics from any thread; on_stop() and make_track() during
// setup only (before any stage thread runs). A worker_probe belongs to one thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/base/first_error.hpp"
#include "conveyor/pipeline/placement.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/base/clock.hpp"
#include "conveyor/counters/batch_stats.hpp"
#include "conveyor/counters/histogram.hpp"
#include "conveyor/counters/lane_stats.hpp"
#include "conveyor/counters/stage_stats.hpp"
#include "conveyor/counters/trace.hpp"
#include "conveyor/stage/detail/link.hpp"

namespace conveyor::detail {

using conveyor::now_ns;

// A source pipeline times the latency of a sample of its items (one clock read at each
// end); submit() times every item. The sample: 1 item in 8 of the first
// latency_dense_items (1024 samples, enough for the P99 of a short run), then 1 in 64
// up to latency_sparse_items (4096 more), then 1 in 256 (~4000 per million items).
// Each timed item is recorded with its period as its weight, so the histogram stands for
// every item and the later, sparser part of a long run is not under-weighted. A clock
// read costs ~26-29 ns on these VMs: at 1 in 8 the two per sample were 0.25 reads
// (~6.5 ns) per item, most of what measuring cost a pipeline of trivial stages; at 1 in
// 64 they were still a third of the clock reads of such a pipeline (perf: 73 of 213
// samples in clock_gettime); at 1 in 256, 0.008 reads per item.
inline constexpr std::uint64_t latency_dense_items = 8192;
inline constexpr std::uint64_t latency_sparse_items = 262144;

// The weight of item `seq` in the latency sample; 0: not timed.
constexpr std::uint32_t latency_sample_weight(std::uint64_t seq) noexcept {
  // Every period is a power of two: a mask. `seq % period` compiled to a 64-bit div on
  // every item, ~3 ns of the source's per-item cost with metrics on.
  const std::uint32_t period = seq < latency_dense_items ? 8 : seq < latency_sparse_items ? 64 : 256;
  return (seq & (period - 1)) == 0 ? period : 0;
}

// The number of the sample that item `seq` is (meaningful where its weight is not 0):
// 0, 1, 2, ... over the timed items in order.
constexpr std::uint64_t latency_sample_number(std::uint64_t seq) noexcept {
  constexpr std::uint64_t dense = latency_dense_items / 8;
  constexpr std::uint64_t sparse = (latency_sparse_items - latency_dense_items) / 64;
  if (seq < latency_dense_items) return seq / 8;
  if (seq < latency_sparse_items) return dense + (seq - latency_dense_items) / 64;
  return dense + sparse + (seq - latency_sparse_items) / 256;
}

// Identity of one item from the source or from submit(): 8 bytes, because every
// envelope crosses a ring at every hop and a ring's slot is the envelope and its turn
// counter: around a 64-bit value that is 32 bytes, two slots to a cache line. (When it
// also carried the entry time, the ticket and the weight, 24 bytes, the slots were 48
// bytes and straddled lines: benchmarks/RESULTS.md, "An 8-byte item identity".) What
// the id does not hold, control keeps (control::seq_of(), control::entered()):
// - from a source: id is the item's sequence number. Its weight in the latency sample
//   follows from it (latency_sample_weight), and a timed item's entry time is in
//   control's table of samples (latency_samples).
// - from submit(): id is the item's ticket, the slot its result goes to. The ticket's
//   entry in control holds the item's sequence number and entry time.
struct item_meta {
  std::uint64_t id = 0;
};
static_assert(sizeof(item_meta) == 8);

// The entry times of a source pipeline's timed items, by sample number: written by the
// source thread as it sends a timed item, read by the terminal stage when the item
// arrives there. The table holds the last `size` samples; a sample overwritten before
// its item arrived (more than 1024 samples in flight: over 8192 items in the first
// ones, 65536 to 262144 later) is dropped, never misread: each entry is a seqlock keyed
// by the item's sequence number.
// Thread-safety: put() from one thread (the source's); take() from any.
class latency_samples {
 public:
  static constexpr std::size_t size = 1024;

  void put(std::uint64_t seq, std::int64_t t0_ns) noexcept {
    entry& e = entries_[latency_sample_number(seq) & (size - 1)];
    // A seqlock without fences (ThreadSanitizer does not model them): mark the entry as
    // being written, then the time, then the key.
    // relaxed: the release store of the time below orders the mark before it.
    e.seq.store(writing, std::memory_order_relaxed);
    // release: a reader whose acquire load reads this time also sees the mark (or a
    // later key), so it cannot pair the new time with the old key.
    e.t0_ns.store(t0_ns, std::memory_order_release);
    // release: a reader that sees this key sees this time (or a later one).
    e.seq.store(seq, std::memory_order_release);
  }

  // Item seq's entry time; 0 when the table no longer holds it (or never did).
  std::int64_t take(std::uint64_t seq) const noexcept {
    const entry& e = entries_[latency_sample_number(seq) & (size - 1)];
    // acquire: pairs with put()'s release store of the key.
    if (e.seq.load(std::memory_order_acquire) != seq) return 0;
    // acquire: pairs with put()'s release store of the time: if this is a later put's
    // time, that put's mark happens-before the next load, which then cannot read our key.
    const std::int64_t t0 = e.t0_ns.load(std::memory_order_acquire);
    // relaxed: ordered after the load above by its acquire.
    return e.seq.load(std::memory_order_relaxed) == seq ? t0 : 0;
  }

 private:
  static constexpr std::uint64_t writing = ~std::uint64_t{0};
  struct entry {
    std::atomic<std::uint64_t> seq{writing};
    std::atomic<std::int64_t> t0_ns{0};
  };
  std::unique_ptr<entry[]> entries_ = std::make_unique<entry[]>(size);
};

// The identities of the items a batch holds, in one pointer. Every envelope crosses a
// ring at every hop, and the ring's slots are its size: for single items (the common
// case) an empty list keeps the envelope small (24 bytes around a 64-bit value; a
// std::vector in its place made it 16 bytes larger, and hops of small items slower:
// see the pipeline section of benchmarks/RESULTS.md). One allocation per non-empty
// list; a move copies a pointer.
class meta_list {
 public:
  meta_list() noexcept = default;
  meta_list(const meta_list& o) : meta_list() { append(o); }
  meta_list(meta_list&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  meta_list& operator=(meta_list o) noexcept {
    std::swap(b_, o.b_);
    return *this;
  }
  ~meta_list() {
    if (b_) ::operator delete(b_);  // not a call into free() for every single item
  }

  bool empty() const noexcept { return size() == 0; }
  std::size_t size() const noexcept { return b_ ? b_->size : 0; }
  std::size_t capacity() const noexcept { return b_ ? b_->capacity : 0; }
  const item_meta* begin() const noexcept { return b_ ? b_->items() : nullptr; }
  const item_meta* end() const noexcept { return begin() + size(); }
  const item_meta& operator[](std::size_t i) const noexcept { return b_->items()[i]; }

  // @throws std::bad_alloc
  void reserve(std::size_t n) {
    if (n <= capacity()) return;
    block* b = static_cast<block*>(::operator new(sizeof(block) + n * sizeof(item_meta)));
    b->size = size();
    b->capacity = n;
    if (b_) std::memcpy(b->items(), b_->items(), b_->size * sizeof(item_meta));
    if (block* old = std::exchange(b_, b)) ::operator delete(old);
  }
  void push_back(const item_meta& m) {
    if (size() == capacity()) reserve(std::max<std::size_t>(8, 2 * capacity()));
    b_->items()[b_->size++] = m;
  }
  void append(const meta_list& o) { append(o.begin(), o.size()); }
  void append(const item_meta* first, std::size_t n) {
    if (n == 0) return;
    if (size() + n > capacity()) reserve(std::max(size() + n, 2 * capacity()));
    std::memcpy(b_->items() + b_->size, first, n * sizeof(item_meta));
    b_->size += n;
  }

 private:
  // A header and the items after it, in one allocation (item_meta is trivially
  // copyable: its objects are created by the copies into the storage).
  struct block {
    std::size_t size;
    std::size_t capacity;
    item_meta* items() noexcept { return reinterpret_cast<item_meta*>(this + 1); }
  };
  static_assert(std::is_trivially_copyable_v<item_meta> &&
                sizeof(block) % alignof(item_meta) == 0);

  block* b_ = nullptr;
};
static_assert(sizeof(meta_list) == sizeof(void*));

// A value in flight. A batch carries one meta per item it holds (metas); a single item
// carries its own (meta) and leaves metas empty, so it costs no allocation.
template <class T>
struct envelope {
  T value;
  item_meta meta;
  meta_list metas;

  std::uint64_t items() const noexcept { return metas.empty() ? 1 : metas.size(); }
};

// The ring between two stages (spsc_ring or mpmc_ring, see link.hpp).
template <class T>
using link = ring_link<envelope<T>>;

using latency_recorder = metrics::latency_histogram;

using metrics::stage_kind;

// What a running stage tells the report: its identity and its counters.
struct stage_info {
  stage_info(std::string n, stage_kind k, std::size_t capacity, const metrics::stage_stats* s)
      : name(std::move(n)), kind(k), input_capacity(capacity), stats(s) {}

  std::string name;
  stage_kind kind = stage_kind::map;
  std::size_t input_capacity = 0;  // 0: no input ring (a source)
  const metrics::stage_stats* stats = nullptr;
  metrics::gpu_stats* gpu = nullptr;                // the GPU segment's lanes
  const metrics::batch_stats* batches = nullptr;    // a batch stage's fill
  std::string_view runtime;                         // the GPU segment's runtime name
};

// Shared by every stage of one pipeline run.
class control {
 public:
  // metrics: stages read the clock and keep busy / starved / blocked time, occupancy,
  // latency and lane timings (false: only item counts). trace_events: events kept per
  // trace track; 0 = no trace (needs metrics). @throws config_error on a bad combination.
  explicit control(bool measure = true, std::size_t trace_events = 0)
      : metrics_on(measure),
        trace(trace_events == 0 ? nullptr : make_trace(measure, trace_events)) {}

  const bool metrics_on;
  const std::unique_ptr<metrics::trace_buffer> trace;  // null: tracing off

  // Setup only: a new trace track, or nullptr when tracing is off.
  metrics::trace_track* make_track(std::string name) {
    return trace ? &trace->add_track(std::move(name)) : nullptr;
  }

  // Setup only: where stage workers register for placement by load; null: off.
  thread_registry* placed = nullptr;

  // What an item's id stands for (see item_meta). A service pipeline (submit()) has one
  // entry per ticket, written by submit() before the item enters the first ring and
  // read by the stage threads that pop it (the rings' release/acquire hops order the
  // two), rewritten only once the ticket has come back (after the result was delivered,
  // or after every thread has joined). A source pipeline has none.
  struct ticket_entry {
    std::uint64_t seq = 0;
    std::int64_t t0_ns = 0;  // 0: not timed (metrics off)
  };
  // Setup only: makes this a service pipeline's control, with `tickets` tickets.
  void use_tickets(std::size_t tickets) { tickets_.resize(tickets); }
  // submit() only, before the item enters: what ticket `ticket`'s item is.
  void enter_ticket(std::uint32_t ticket, std::uint64_t seq, std::int64_t t0_ns) noexcept {
    tickets_[ticket] = {seq, t0_ns};
  }
  // The item's sequence number (for errors: "item N").
  std::uint64_t seq_of(const item_meta& m) const noexcept {
    return tickets_.empty() ? m.id : tickets_[m.id].seq;
  }
  // When the item entered the pipeline (0: not timed) and how many items its latency
  // stands for. A service item's entry is its ticket's, which delivering its result
  // frees for the next submit(): ask before delivering it.
  struct entry_time {
    std::int64_t t0_ns = 0;
    std::uint32_t weight = 0;
  };
  // A service pipeline's: every item has a ticket, and each one is timed (with metrics).
  bool has_tickets() const noexcept { return !tickets_.empty(); }
  entry_time entered(const item_meta& m) const noexcept {
    if (!tickets_.empty()) return {tickets_[m.id].t0_ns, 1};
    const std::uint32_t weight = latency_sample_weight(m.id);
    if (weight == 0) return {};
    return {samples_.take(m.id), weight};
  }
  // The source thread only: item seq, a timed one, entered at t0_ns.
  void sampled(std::uint64_t seq, std::int64_t t0_ns) noexcept { samples_.put(seq, t0_ns); }

  std::atomic<bool> stopping{false};     // cancel or failure: stop taking new work
  std::atomic<bool> stop_source{false};  // drain: the source ends as if its input did
  first_error error;

  // Item accounting. Counting must not cost a locked instruction per item: a lock add
  // drains the store buffer, so the writer waits out the cache misses of the ring slots
  // it just wrote (one in the source and one in the sink took a bare chain of four
  // threads over the rings from 35 to 21 M/s; the pipeline ~4%: benchmarks/RESULTS.md,
  // "Inlining the hop"). So the counts on the hot path have one writer each: produced
  // by the source thread (count_produced(); submit() callers, who may be many, use
  // fetch_add: a pipeline has a source or an input, never both), completed by the
  // terminal stage's workers, each in its own counter slot (the stage's item counts;
  // completed() sums them). failed and cancelled change once per failure or stop, so
  // fetch_add is fine there.
  alignas(cache_line_size) std::atomic<std::uint64_t> produced{0};
  alignas(cache_line_size) std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> cancelled{0};

  // Source thread only: one more item produced.
  void count_produced() noexcept {
    // relaxed: a counter read after join (exact) or as a snapshot; one writer, so a plain
    // load and store cannot lose an increment.
    produced.store(produced.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  // Setup only (before any stage thread runs): the stage whose items are the completed
  // ones. Each of its workers counts into its own slot after a successful delivery.
  void count_completions_of(const metrics::stage_stats& terminal) noexcept {
    completions_ = &terminal;
  }
  // Any thread: items delivered by the terminal stage; exact after join.
  std::uint64_t completed() const noexcept {
    return completions_ ? completions_->items() : 0;
  }

  // Registered at construction (before any thread runs): closes a ring, cancels a pool.
  void on_stop(std::function<void()> closer) { closers_.push_back(std::move(closer)); }

  // Stop taking work and wake every blocked thread. Idempotent.
  void stop() noexcept {
    // release: pairs with the acquire loads in is_stopping(); stages that see the flag
    // also see the failure recorded before it.
    if (stopping.exchange(true, std::memory_order_acq_rel)) return;
    for (auto& close : closers_) close();
    open_gate();  // a start() that failed half-way left threads at the gate
  }

  // The start gate: every stage thread waits here until the pipeline has spawned all of
  // them, so the run's wall clock and every worker's phase clock start together, after
  // the spawning (milliseconds per thread under sanitizers) rather than during it.
  void open_gate() noexcept {
    // release: pairs with the acquire in await_gate(); what start() wrote before opening
    // (the run's start time) is visible to the stage threads.
    gate_.store(true, std::memory_order_release);
    gate_.notify_all();
  }
  // @note blocks the calling stage thread until open_gate().
  void await_gate() const noexcept { gate_.wait(false, std::memory_order_acquire); }
  bool is_stopping() const noexcept { return stopping.load(std::memory_order_acquire); }

  // Call from inside a catch block: records the exception being handled, wrapped in a
  // stage_error naming the stage and the item, as the run's error if it is the first,
  // and stops everything. `items` were lost with it and count as failed.
  void fail_current(const std::string& stage, std::uint64_t item, std::uint64_t items) noexcept {
    failed.fetch_add(items, std::memory_order_relaxed);  // relaxed: read after join
    try {
      throw stage_error(stage, item, describe(std::current_exception()));
    } catch (...) {
      error.capture(std::current_exception());
    }
    stop();
  }
  // As above, for the item (or the batch: its first item) whose meta is `item`.
  void fail_current(const std::string& stage, const item_meta& item, std::uint64_t items) noexcept {
    fail_current(stage, seq_of(item), items);
  }

  void cancel(std::uint64_t items) noexcept {
    cancelled.fetch_add(items, std::memory_order_relaxed);  // relaxed: read after join
  }

 private:
  static std::unique_ptr<metrics::trace_buffer> make_trace(bool measure, std::size_t events) {
    CONVEYOR_EXPECTS(measure, "pipeline_options: trace_events needs metrics = true (the trace "
                              "is drawn from the same clock reads); set trace_events = 0 or "
                              "turn metrics on");
    return std::make_unique<metrics::trace_buffer>(events);
  }

  static std::string describe(std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      return ex.what();
    } catch (...) {
      return "unknown exception";
    }
  }

  std::vector<std::function<void()>> closers_;
  const metrics::stage_stats* completions_ = nullptr;
  std::vector<ticket_entry> tickets_;  // a service pipeline's; empty: a source's
  latency_samples samples_;            // a source pipeline's timed items
  std::atomic<bool> gate_{false};
};

// The track name of worker w of a stage with `workers` workers: "decode", or "decode #2".
inline std::string worker_track_name(const std::string& stage, std::size_t w, std::size_t workers) {
  return workers == 1 ? stage : stage + " #" + std::to_string(w + 1);
}

// One worker thread's instrumentation. Charges the time between marks to its counters
// (metrics::phase_clock), draws each busy phase as a span and each occupancy sample as a
// counter on its trace track, when there is one. With metrics off every call is one
// predictable branch: no clock read, no counter write (item counts are still kept).
// The names must outlive the pipeline's trace (the node owns them).
class worker_probe {
 public:
  // The probe of worker `worker` of the stage whose counters are `stage`.
  worker_probe(const control& ctl, metrics::stage_stats& stage, std::size_t worker,
               metrics::trace_track* track, const char* span_name, const char* counter_name) noexcept
      : on_(ctl.metrics_on), w_(&stage.worker(worker)), clock_(*w_), track_(on_ ? track : nullptr),
        span_(span_name), counter_(counter_name), placement_(ctl.placed, stage, worker),
        occupancy_due_(on_), mark_period_(!on_ ? no_marks : track_ != nullptr ? 1 : 64) {}
  worker_probe(const worker_probe&) = delete;
  worker_probe& operator=(const worker_probe&) = delete;
  ~worker_probe() { before_wait(); }  // the last items' work, when the worker ends

  // Pops from the input ring (with its position when pos is given). A pop that found an
  // item ready reads no clock: it is charged with the phase after it (the work), which
  // saves two of the three clock reads per item of a stage that keeps up. A pop that has
  // to wait waits exactly as it would with metrics off (the ring's own spin, yield and
  // sleep, see wait_as()). nullopt: closed and drained.
  template <class Ring>
  CONVEYOR_HOT_INLINE auto pop(Ring& in, std::size_t* pos = nullptr) {
    if (auto v = in.try_pop(pos)) return v;
    return wait_as(wait_for::input, [&](wait_timing* t) { return in.pop(pos, t); });
  }
  // Takes what the input link holds now, up to `burst` items, and hands each to f(T&&)
  // (ring_link::drain: an SPSC link's one consumer); f returns false to stop after its
  // item. 0: there was none (the caller waits with pop()). Like a pop that found an
  // item ready it reads no clock; the occupancy sample, when due, is taken before the
  // burst. Each item leaves the ring before f runs, as with a pop; per burst instead of
  // per item: the consumer's index store, the optional a pop returns, the calls through
  // the link. bench_pipeline's trivial chain of one-worker stages runs 1.27-1.38x as
  // fast for it in paired rounds (benchmarks/RESULTS.md, "Bursts").
  template <class Link, class F>
  CONVEYOR_HOT_INLINE std::size_t drain(Link& in, F& f) noexcept {
    occupancy(in);
    return in.drain(f, burst);
  }
  // At most this many items per burst: between bursts the stage checks what a pop
  // would (the next wait, a stop) and samples its occupancy when due.
  static constexpr std::size_t burst = 32;

  // Pushes to the output ring; waits are charged as blocked, measured as in pop().
  // false: the ring was closed (the pipeline is stopping).
  template <class Ring, class T>
    requires(!std::is_lvalue_reference_v<T>)  // an rvalue: it is moved into the ring
  CONVEYOR_HOT_INLINE bool push(Ring& out, T&& v) {
    if (out.try_push(std::move(v))) return true;  // moves v only when it succeeds
    return wait_as(wait_for::room, [&](wait_timing* t) { return out.push(std::move(v), t); });
  }
  // As push(out, T(args...)), but when there is room (the common case) the element is
  // constructed in the ring's slot: no temporary envelope between the stage and the ring.
  template <class Ring, class... Args>
  CONVEYOR_HOT_INLINE bool emplace(Ring& out, Args&&... args) {
    using T = typename Ring::value_type;
    if constexpr (std::is_nothrow_constructible_v<T, Args&&...>) {
      // try_emplace uses the arguments only when it succeeds: after false they are intact.
      if (out.try_emplace(std::forward<Args>(args)...)) return true;
    }
    return push(out, T(std::forward<Args>(args)...));
  }
  // Runs a blocking wait and charges it as starved (waiting for input) or blocked
  // (waiting for room downstream). wait(timing) waits as it would for anyone (a ring's
  // blocking pop or push, a wait_point) and adds to *timing what the wait cost
  // (wait_timing: the rounds it spun, and the clock readings its slow path took anyway).
  // The rounds spun are counted with metrics off too (placement by load takes them out of
  // the worker's load: a thread that spins while its core has room looks no heavier
  // than it is). With metrics, the rounds are charged at the learned cost of a round,
  // the slow path as read. A wait that reached the slow path (a yield at least:
  // microseconds) also closes the phase at its last reading, so that a running report
  // shows a stage that has waited for seconds as waiting. So a wait reads no clock of
  // its own, except the sampled one, timed with the clock around it to keep the cost of
  // a round current (a pause and a re-check of the ring, whose cache misses depend on
  // the other side), and with a trace track every wait, to draw its span.
  enum class wait_for : bool { input, room };
  template <class Wait>
  auto wait_as(wait_for kind, Wait&& wait) -> decltype(wait(nullptr)) {
    wait_timing t;
    const auto counted_wait = [&] {
      auto r = wait(&t);
      w_->add_spin_rounds(t.rounds);
      return r;
    };
    if (!on_) return counted_wait();
    if (track_ != nullptr || waits_++ % round_sample_period == 0) {
      before_wait();
      auto r = counted_wait();
      const metrics::phase p = kind == wait_for::input ? clock_.starved() : clock_.blocked();
      learn_round(p.length_ns() - t.slow_ns, t.rounds);
      return r;
    }
    auto r = counted_wait();
    (kind == wait_for::input ? pending_starved_ns_ : pending_blocked_ns_) +=
        std::int64_t{t.rounds} * round_ns_ + t.slow_ns;
    if (t.end_ns != 0) (void)charge_until(t.end_ns);
    return r;
  }
  // One wait in round_sample_period (and every wait of a worker with a trace track) is
  // timed with the clock around it; the others are charged from their wait_timing.
  static constexpr std::uint32_t round_sample_period = 64;

  void starved() noexcept {
    if (on_) clock_.starved();
  }
  void blocked() noexcept {
    if (on_) clock_.blocked();
  }
  // Charges busy time since the last mark and draws it as a span named `name`.
  // Waits since the last mark that were not timed (see wait_as()) are charged as
  // what they were.
  void busy(const char* name) noexcept {
    if (!on_) return;
    const metrics::phase p = mark();
    if (track_ != nullptr) track_->span(name, p);
  }
  void busy() noexcept { busy(span_); }

  // Marks the end of one item's work. With a trace track it is busy(): one clock read
  // and a span per item. Without one it reads the clock only every mark_period_ items,
  // adapted after each mark so that a phase lasts about mark_interval_ns: a stage of
  // 20 ns items reads it once per 2500 items, one of 1 ms items once per item, and a
  // running report() lags a stage by about that interval whatever its items cost. (A
  // fixed 1 in 64 was half the clock reads of a pipeline of trivial stages, perf.)
  // Waits that reach the ring's slow path, and sampled waits, close the phase too.
  // The count is inlined into the stage's loop; the mark is not (a call per item cost
  // the trivial pipeline's stages ~7% of their samples, perf).
  // One count and one compare per item whether metrics are on or off (off: the period
  // never ends; with a trace track it is 1).
  CONVEYOR_HOT_INLINE void work_done() noexcept {
    if (++lazy_ < mark_period_) return;
    mark_work();
  }
  static constexpr std::int64_t mark_interval_ns = 50'000;
  static constexpr std::uint32_t max_mark_period = 4096;

  // Charges the work done since the last clock read as busy, before a wait that the
  // caller will charge with starved() or blocked().
  void before_wait() noexcept {
    if (on_ && (lazy_ != 0 || pending_starved_ns_ != 0 || pending_blocked_ns_ != 0)) busy();
  }
  // Samples the input ring's occupancy: at the first pop, and at the first pop after
  // each clock mark of the stage's work (busy(), and work_done()'s about every
  // mark_interval_ns of the stage's time), so the samples are spread over time, not
  // over items. Reading the ring's size loads the producer's index, whose
  // cache line the producer keeps writing: on every pop that cost more than the rest of
  // the probe together, one pop in 8 ~16 ns per item, and one in 64 still ~2 ns per item
  // and stage of a trivial pipeline. With a trace track (a mark per item), every
  // occupancy_period-th mark is followed by a sample. Per pop: one flag, never set with
  // metrics off.
  template <class Ring>
  CONVEYOR_HOT_INLINE void occupancy(const Ring& ring) noexcept {
    if (!occupancy_due_) return;
    occupancy_due_ = false;
    const std::size_t n = ring.size_approx();
    w_->sample_occupancy(n);
    if (track_ != nullptr && counter_ != nullptr)
      track_->counter(counter_, static_cast<double>(n), clock_.mark_ns());
  }
  static constexpr std::uint32_t occupancy_period = 64;
  void items(std::uint64_t n) noexcept { w_->add_items(n); }

  // The clock reading of the last mark (0 with metrics off): saves a read where the
  // end of the last phase is the time wanted.
  std::int64_t mark_ns() const noexcept { return on_ ? clock_.mark_ns() : 0; }
  bool on() const noexcept { return on_; }
  metrics::trace_track* track() const noexcept { return track_; }
  const char* span_name() const noexcept { return span_; }

 private:
  bool on_;
  metrics::worker_stats* w_;
  metrics::phase_clock clock_;
  metrics::trace_track* track_;
  const char* span_;
  const char* counter_;
  placement_entry placement_;  // in the placer's registry while the worker runs

  // work_done()'s mark: a span with a trace track; else the lazy items' phase, whose
  // length per item sets the next mark period.
  [[gnu::noinline]] void mark_work() noexcept {
    if (!on_) {  // 2^32 - 1 items without metrics
      lazy_ = 0;
      return;
    }
    if (track_ != nullptr) return busy();
    const std::uint32_t items = lazy_;
    const std::int64_t per_item = mark().length_ns() / items;
    mark_period_ = static_cast<std::uint32_t>(std::clamp<std::int64_t>(
        per_item > 0 ? mark_interval_ns / per_item : max_mark_period, 1, max_mark_period));
  }

  // Folds one timed wait's spin (spin_ns over `rounds` rounds) into the cost of a round:
  // a moving average (the first sample sets it), each sample bounded so that a spin
  // preempted in the middle (tens of milliseconds on a loaded machine) cannot make every
  // later estimate huge.
  void learn_round(std::int64_t spin_ns, std::uint32_t rounds) noexcept {
    if (rounds == 0) return;
    std::int64_t per_round = std::clamp<std::int64_t>(spin_ns / rounds, 0, max_round_ns);
    if (round_ns_ != 0) per_round = std::min(per_round, 2 * round_ns_);
    round_ns_ = round_ns_ == 0 ? per_round : (3 * round_ns_ + per_round) / 4;
  }
  static constexpr std::int64_t max_round_ns = 2000;  // a pause and a re-check: far less

  // A clock mark of the stage's work: closes the phase now, and the next pop (or burst)
  // samples the input ring's occupancy. A sample due stays due until taken: a burst
  // marks each of its items (with a trace track) before the next burst samples.
  metrics::phase mark() noexcept {
    if (track_ == nullptr || ++marks_ % occupancy_period == 0) occupancy_due_ = true;
    return charge_until(now_ns());
  }

  // Closes the phase at end_ns: the waits not timed since the last mark are charged as
  // starved and blocked (at most the whole phase), the rest as busy.
  metrics::phase charge_until(std::int64_t end_ns) noexcept {
    lazy_ = 0;
    const metrics::phase p = clock_.busy_until(end_ns, pending_starved_ns_, pending_blocked_ns_);
    pending_starved_ns_ = pending_blocked_ns_ = 0;
    return p;
  }

  static constexpr std::uint32_t no_marks = ~std::uint32_t{0};
  std::uint32_t marks_ = 0;     // with a trace track: for the occupancy sample
  bool occupancy_due_;          // the next pop samples the occupancy
  std::uint32_t lazy_ = 0;      // items whose work is not charged yet
  std::uint32_t mark_period_;   // items between marks (work_done()); no_marks: metrics off
  std::uint32_t waits_ = 0;  // blocking pops and pushes, for the sample
  std::int64_t round_ns_ = 0;  // learned cost of one spin round of a ring's wait
  std::int64_t pending_starved_ns_ = 0, pending_blocked_ns_ = 0;  // not timed, not charged yet
};

}  // namespace conveyor::detail
