// conveyor/stage/detail/worker_probe.hpp: one stage worker thread's instrumentation: its
// pops, pushes and waits charged as busy / starved / blocked time, its occupancy samples,
// its trace spans, and its registration with the pipeline while it runs.
//
//   detail::worker_probe probe{ctl, stats, w, track, "decode", "ring decode"};  // worker w
//   auto x = probe.pop(in);      probe.occupancy(in);   // starved only if it waited
//   { metrics::nvtx_range r{probe.span_name()}; y = f(*x); }   probe.work_done();
//   probe.push(out, std::move(y));                      // blocked only if it waited
//   probe.emplace(out, std::move(v), meta, meta_list{}); // the same, built in the slot
//   probe.wait_as(worker_probe::wait_for::input, [&](wait_timing* t) {  // any other wait,
//     window.wait(ready, t); return true; });                         // measured the same
//
// Thread-safety: a worker_probe belongs to the one thread that made it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"
#include "conveyor/counters/stage_stats.hpp"
#include "conveyor/counters/trace.hpp"
#include "conveyor/ring/detail/wait.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/worker_registry.hpp"

namespace conveyor::detail {

// The track name of worker w of a stage with `workers` workers: "decode", or "decode #2".
std::string worker_track_name(const std::string& stage, std::size_t w, std::size_t workers);
// The trace counter of a stage's input ring: "ring decode".
std::string ring_track_name(const std::string& stage);

// One worker thread's instrumentation. Charges the time between marks to its counters
// (metrics::phase_clock), draws each busy phase as a span and each occupancy sample as a
// counter on its trace track, when there is one. With metrics off every call is one
// predictable branch: no clock read, no counter write (item counts are still kept).
// The names must outlive the pipeline's trace (the node owns them).
class worker_probe {
 public:
  // The probe of worker `worker` of the stage whose counters are `stage`.
  worker_probe(const control& ctl, metrics::stage_stats& stage, std::size_t worker,
               metrics::trace_track* track, const char* span_name,
               const char* counter_name) noexcept
      : on_(ctl.metrics_on),
        w_(&stage.worker(worker)),
        clock_(*w_),
        track_(on_ ? track : nullptr),
        span_(span_name),
        counter_(counter_name),
        registered_(ctl.workers, stage, worker),
        occupancy_due_(on_),
        mark_period_(!on_                ? no_marks
                     : track_ != nullptr ? 1
                                         : 64) {}
  worker_probe(const worker_probe&) = delete;
  worker_probe& operator=(const worker_probe&) = delete;
  ~worker_probe();  // the last items' work, and the thread's CPU time, when the worker ends

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
  // Takes what the input link holds now, up to `burst` items and no further than the next
  // clock mark (work_done()'s period: one item with a trace track or for items of more
  // than mark_interval_ns, so a burst delays the stage's counts no more than a mark
  // would), and hands each to f(T&&) (ring_link::drain: an SPSC link's one consumer); f
  // returns false to stop after its item. 0: there was none (the caller waits with
  // pop()). Like a pop that found an item ready it reads no clock; the occupancy sample,
  // when due, is taken before the burst. Each item leaves the ring before f runs, as with
  // a pop; per burst instead of per item: the optional a pop returns, the calls through
  // the link, and the stage's counts (the caller's done()).
  template <class Link, class F>
  CONVEYOR_HOT_INLINE std::size_t drain(Link& in, F& f) noexcept {
    occupancy(in);
    // lazy_ < mark_period_ between calls (work_done() marks when it reaches it): >= 1.
    const std::uint32_t to_mark = mark_period_ - lazy_;
    return in.drain(f, to_mark < burst ? to_mark : burst);
  }
  // At most this many items per burst: between bursts the stage checks what a pop
  // would (the next wait, a stop) and samples its occupancy when due.
  static constexpr std::uint32_t burst = 32;

  // Pushes to the output ring; waits are charged as blocked, measured as in pop().
  // false: the ring was closed (the pipeline is stopping).
  template <class Ring, class T>
    requires(!std::is_lvalue_reference_v<T>)  // an rvalue: it is moved into the ring
  CONVEYOR_HOT_INLINE bool push(Ring& out, T&& v) {
    if (out.try_push(std::forward<T>(v))) return true;  // moves v only when it succeeds
    return wait_as(wait_for::room, [&](wait_timing* t) { return out.push(std::forward<T>(v), t); });
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
  // The wait is inlined once; what it cost is charged out of line (wait_ended()).
  template <class Wait>
  auto wait_as(wait_for kind, Wait&& wait) -> decltype(wait(nullptr)) {
    wait_timing t;
    const bool timed = on_ && (track_ != nullptr || waits_++ % round_sample_period == 0);
    if (timed) before_wait();
    auto r = wait(&t);
    wait_ended(kind, t, timed);
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
  void busy(const char* name) noexcept;
  void busy() noexcept { busy(span_); }

  // Marks the end of one item's work. With a trace track it is busy(): one clock read
  // and a span per item. Without one it reads the clock only every mark_period_ items,
  // adapted after each mark so that a phase lasts about mark_interval_ns: a stage of
  // 20 ns items reads it once per 2500 items, one of 1 ms items once per item, and a
  // running report() lags a stage by about that interval whatever its items cost.
  // Waits that reach the ring's slow path, and sampled waits, close the phase too.
  // The count is inlined into the stage's loop; the mark is not.
  // One count and one compare per item whether metrics are on or off (off: the period
  // never ends; with a trace track it is 1).
  // k: inputs done at once (a burst's, see done()).
  CONVEYOR_HOT_INLINE void work_done(std::uint32_t k = 1) noexcept {
    lazy_ += k;
    if (lazy_ < mark_period_) return;
    mark_work();
  }
  // work_done(k) and items(n) for k inputs of n items: one input, or what a burst did,
  // counted once after it (see drain()) instead of per item.
  CONVEYOR_HOT_INLINE void done(std::uint32_t k, std::uint64_t n) noexcept {
    if (k == 0) return;
    items(n);
    work_done(k);
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
  // over items: reading the ring's size loads the producer's index, whose cache line the
  // producer keeps writing, too dear for every pop. With a trace track (a mark per item), every
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
  registered_worker registered_;  // known to the pipeline (its placer) while it runs

  // The end of a wait (see wait_as()): its spin rounds counted; with metrics, a wait
  // timed with the clock around it charged as starved or blocked and the cost of a spin
  // round learned from it, any other charged from its wait_timing.
  void wait_ended(wait_for kind, const wait_timing& t, bool timed) noexcept;

  // work_done()'s mark: a span with a trace track; else the lazy items' phase, whose
  // length per item sets the next mark period.
  void mark_work() noexcept;

  // Folds one timed wait's spin (spin_ns over `rounds` rounds) into the cost of a round:
  // a moving average (the first sample sets it), each sample bounded so that a spin
  // preempted in the middle (tens of milliseconds on a loaded machine) cannot make every
  // later estimate huge.
  void learn_round(std::int64_t spin_ns, std::uint32_t rounds) noexcept;
  static constexpr std::int64_t max_round_ns = 2000;  // a pause and a re-check: far less

  // A clock mark of the stage's work: closes the phase now, and the next pop (or burst)
  // samples the input ring's occupancy. A sample due stays due until taken: a burst
  // marks each of its items (with a trace track) before the next burst samples.
  metrics::phase mark() noexcept;

  // Closes the phase at end_ns: the waits not timed since the last mark are charged as
  // starved and blocked (at most the whole phase), the rest as busy.
  metrics::phase charge_until(std::int64_t end_ns) noexcept;

  static constexpr std::uint32_t no_marks = ~std::uint32_t{0};
  std::uint32_t marks_ = 0;    // with a trace track: for the occupancy sample
  bool occupancy_due_;         // the next pop samples the occupancy
  std::uint32_t lazy_ = 0;     // items whose work is not charged yet
  std::uint32_t mark_period_;  // items between marks (work_done()); no_marks: metrics off
  std::uint32_t waits_ = 0;    // blocking pops and pushes, for the sample
  std::int64_t round_ns_ = 0;  // learned cost of one spin round of a ring's wait
  static constexpr std::int64_t cpu_read_period_ns = 10'000'000;
  std::int64_t cpu_read_ns_ = 0;  // when the thread's CPU time was last read
  std::int64_t pending_starved_ns_ = 0, pending_blocked_ns_ = 0;  // not timed, not charged yet
};

}  // namespace conveyor::detail
