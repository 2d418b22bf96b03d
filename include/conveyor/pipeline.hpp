// conveyor/pipeline.hpp: stages composed in code, run on their own threads, connected by
// bounded lock-free rings, so that the slowest stage — not the sum — sets the pace.
//
//   conveyor::pipeline p{conveyor::source(next_image)          // prepare
//                        | conveyor::map(decode).workers(3).ordered()
//                        | conveyor::batch(64)
//                        | conveyor::map(classify)             // or a GPU segment
//                        | conveyor::unbatch()
//                        | conveyor::sink(write_label)};       // postprocess
//   conveyor::report r = p.run();                              // blocks until done
//
// Service mode: start with conveyor::input<T>() instead of a source and leave the sink
// out; then start(), submit(x) -> std::future<result> (or submit(x, done): done gets a
// conveyor::outcome<result>, nothing allocated per item; try_submit(): refuses when full),
// stop(stop_mode::drain | cancel).
//
// Lifecycle: the first exception in any stage stops the pipeline (rings closed, blocked
// threads woken) and is rethrown from run()/wait()/stop() as conveyor::stage_error, which
// names the stage and the item and nests the original exception — after every thread has
// joined. Accounting always holds: produced == completed + failed + cancelled.
// Memory is bounded: items in flight <= the ring capacities + what stages hold (a ring
// of small items between two stage threads pinned to one CPU may grow by ring_growth
// where the second needs little CPU per item: pipeline_options).
// Hops: a ring with one thread at each end (a source, a one-worker or ordered map, a
// batcher, a one-worker sink) is an spsc_ring, any other an mpmc_ring (detail/link.hpp).
// Diagnosis: run()/stop()/wait()/report() return a conveyor::report (per-stage table,
// lanes, latency, the verdict naming the bottleneck). Options turn on a bounded trace
// and a live progress line, or turn measuring off. The stage threads are pinned to cores
// by what each stage costs while they alone fill the cores (placement = automatic, the
// default); by_load pins them whatever else runs, os never:
//   conveyor::pipeline p{chain, {.trace_events = 16384, .progress = true}};
//   conveyor::pipeline q{chain, {.placement = conveyor::thread_placement::by_load}};
//   p.run();  p.write_trace("run.trace.json");   // open in ui.perfetto.dev
//
// Thread-safety: one pipeline object is driven from one thread (run/start/stop/wait);
// submit() may be called from any number of threads between start() and stop();
// report(), counts(), trace_json() and write_trace() also while the stages run, from
// any thread that does not race with start()/wait()/stop() (the progress line does so).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/pipeline/placement.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/base/clock.hpp"
#include "conveyor/report/progress.hpp"
#include "conveyor/report/report.hpp"
#include "conveyor/report/trace_export.hpp"
#include "conveyor/report/verdict.hpp"
#include "conveyor/base/outcome.hpp"
#include "conveyor/ring/detail/storage.hpp"
#include "conveyor/stage/batch.hpp"
#include "conveyor/stage/chain.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/link.hpp"
#include "conveyor/stage/gpu.hpp"
#include "conveyor/stage/map.hpp"
#include "conveyor/stage/sink.hpp"
#include "conveyor/stage/source.hpp"

namespace conveyor {

enum class stop_mode {
  drain,   // take no new input; everything already inside completes
  cancel,  // stop at once; what is inside is dropped and counted as cancelled
};

// Where the pipeline's stage threads run.
enum class thread_placement {
  automatic,  // as by_load while the stage threads alone fill the cores, else as os
  os,         // wherever the OS scheduler puts them
  by_load,    // each pinned to one CPU, balanced by the stages' measured CPU time per item
};

constexpr std::string_view to_string(thread_placement p) noexcept {
  switch (p) {
    case thread_placement::os: return "os";
    case thread_placement::by_load: return "by_load";
    default: return "automatic";
  }
}

struct pipeline_options {
  // Every ring between two stages (power of two). An ordered map of W workers on lanes
  // (stage/map.hpp) has one such ring per worker on each side (between maps of W and V
  // workers: one per pair of workers that items pass between, up to W x V).
  std::size_t ring_capacity = 1024;
  // How far a ring may grow while the pipeline runs (a power of two in [1, 64]; 1: every
  // ring keeps ring_capacity). Where placement pins the two stage threads at the ends of
  // a ring to one CPU, they take turns on it, a context switch each time the ring fills
  // or empties: at 1024 items of stages of tens of ns, a switch every ~20-30 us, ~14% of
  // the CPU (benchmarks/RESULTS.md, "Rings that grow where stages share a core"). Such
  // a ring then moves to a reserve ring_capacity x ring_growth deep, made when it first
  // grows, where its consumer works through that many elements within 1 ms of its CPU
  // time (at the defaults, <= 122 ns per element: a ring in front of a slower stage
  // never grows), and back when the two are moved apart or unpinned; the move happens
  // when the ring is next full (detail/link.hpp, "Growing"). Only rings with one thread
  // at each end and slots of at most 64 bytes (items of up to 40 bytes by value) get a
  // reserve: 512 KiB a ring at most, at the defaults. Such a ring holds up to
  // ring_capacity x (1 + ring_growth) items while it moves. The report shows the deepest
  // each ring ran (ring_capacity).
  std::size_t ring_growth = 8;
  // Per-stage busy / starved / blocked time, ring occupancy, item latency and per-lane
  // H2D / compute / D2H time: a few clock reads per item and stage. false: only item
  // counts are kept (report() carries the counts and verdict_kind::unmeasured).
  bool metrics = true;
  // Events kept per trace track (one track per stage worker, three per lane), for
  // trace_json() / write_trace(): 40 bytes each, the oldest overwritten. 0: no trace,
  // and the cost is one branch per phase. Needs metrics.
  std::size_t trace_events = 0;
  // A live line on progress_out (default std::cerr) every progress_period (>= 250 ms):
  // items done, items/s, GPU busy and the bottleneck of the last period. Needs metrics.
  bool progress = false;
  std::chrono::milliseconds progress_period{500};
  std::ostream* progress_out = nullptr;
  // Where the stage threads run (Linux; elsewhere always as os). With more CPU-heavy
  // stage threads than cores the OS tends to wake a stage that waits for its input on
  // the core of the stage that fed it, often the slowest one, and the pipeline loses
  // what the two share. Pinning fixes that but a pinned thread cannot dodge other work.
  // by_load: 10 ms after the start, then every placement_period (>= 10 ms), each stage
  // thread's CPU time per item its stage moved (over the last 8 periods, less what it
  // spun away in waits) is its load, and every stage thread is pinned to one of the CPUs
  // this process may use: heaviest first onto the least loaded CPU (LPT), or in runs of
  // neighbouring stages, one run per CPU, when that costs less per item counting each
  // hop between CPUs at ~20 ns (stages of nanoseconds keep their hops within a core,
  // stages of microseconds get LPT's balance); re-pinned when a plan costs >= 10% less
  // (detail/placement.hpp).
  // Each pipeline plans alone: for one pipeline that owns the machine's cores.
  // automatic (the default): by_load's plan, applied only while this pipeline's stage
  // threads fill the cores (>= 80 % of them) and other work (the rest of the process,
  // other processes: CPU clocks and /proc/stat) takes <= 10 %; every thread goes back on
  // all allowed CPUs once other work takes > 20 % (or the stage threads < 50 % for two
  // periods). A pipeline that cannot fill the cores is never pinned; two that fill them
  // side by side see each other as other work and neither is.
  // os: never pinned.
  thread_placement placement = thread_placement::automatic;
  std::chrono::milliseconds placement_period{200};
};

// produced == completed + failed + cancelled once the pipeline has stopped.
struct item_counts {
  std::uint64_t produced = 0, completed = 0, failed = 0, cancelled = 0;
};

namespace detail {

template <class T>
struct is_input : std::false_type {};
template <class T>
struct is_input<input_stage<T>> : std::true_type {};
template <class T>
struct is_sink : std::false_type {};
template <class F>
struct is_sink<sink_stage<F>> : std::true_type {};

// make_node: the running counterpart of each stage kind.
template <class F>
auto make_node(source_stage<F>&& s, control& ctl, void*, link<typename source_stage<F>::out_type>* out,
               latency_recorder*) {
  return std::make_unique<source_node<F>>(std::move(s), ctl, out);
}
template <class F, class In, class Out>
auto make_node(map_stage<F>&& s, control& ctl, link<In>* in, link<Out>* out, latency_recorder*) {
  return std::make_unique<map_node<F, In>>(std::move(s), ctl, in, out);
}
template <class In, class Out>
auto make_node(batch_stage&& s, control& ctl, link<In>* in, link<Out>* out, latency_recorder*) {
  return std::make_unique<batch_node<In>>(std::move(s), ctl, in, out);
}
template <class In, class Out>
auto make_node(unbatch_stage&& s, control& ctl, link<In>* in, link<Out>* out, latency_recorder*) {
  return std::make_unique<unbatch_node<In>>(std::move(s), ctl, in, out);
}
template <class R, class IE, class OE, class SI, class C, class SO, class In, class Out>
auto make_node(gpu_stage<R, IE, OE, SI, C, SO>&& s, control& ctl, link<In>* in, link<Out>* out,
               latency_recorder*) {
  return std::make_unique<gpu_node<R, IE, OE, SI, C, SO, In>>(std::move(s), ctl, in, out);
}
template <class F, class In>
auto make_node(sink_stage<F>&& s, control& ctl, link<In>* in, void*, latency_recorder* lat) {
  using node = decltype(make_sink_node(std::move(s), ctl, in, lat));
  // terminal_node is not movable once built: construct it in place.
  return std::unique_ptr<node>(new node(make_sink_node(std::move(s), ctl, in, lat)));
}

// How many threads of a stage push to its output ring at the same time, and pop from its
// input ring at the same time: where both ends of a ring are 1, it is an spsc_ring.
template <class F>
std::size_t output_pushers(const source_stage<F>&) { return 1; }
template <class T>
std::size_t output_pushers(const input_stage<T>&) { return any_threads; }  // submit() callers
template <class F>
std::size_t output_pushers(const map_stage<F>& s) {
  return s.is_ordered() ? 1 : s.workers();  // ordered: one emitter at a time
}
inline std::size_t output_pushers(const batch_stage&) { return 1; }
inline std::size_t output_pushers(const unbatch_stage&) { return 1; }
template <class R, class IE, class OE, class SI, class C, class SO>
std::size_t output_pushers(const gpu_stage<R, IE, OE, SI, C, SO>&) {
  return 1;  // results leave through the reorder buffer's one emitter at a time
}

template <class F>
std::size_t input_poppers(const map_stage<F>& s) { return s.workers(); }
inline std::size_t input_poppers(const batch_stage&) { return 1; }
inline std::size_t input_poppers(const unbatch_stage&) { return 1; }
template <class R, class IE, class OE, class SI, class C, class SO>
std::size_t input_poppers(const gpu_stage<R, IE, OE, SI, C, SO>& s) {
  return s.options().lanes;  // one enqueue thread per lane
}
template <class F>
std::size_t input_poppers(const sink_stage<F>& s) { return s.workers(); }

// An ordered map with several workers may run on lanes (detail/link.hpp): each worker
// its own lane in and out, when the stages on both sides deal and take items in order.
template <class Stage>
std::size_t lane_workers(const Stage&) { return 0; }
template <class F>
std::size_t lane_workers(const map_stage<F>& s) {
  return s.is_ordered() && s.workers() > 1 ? s.workers() : 0;
}

// Which stages run on lanes: lanes[i] = workers of stage i if it does, else 0. A
// candidate needs the stage before it to push in order from one thread (or to run on
// lanes itself) and the one after it to pop from one thread (or to run on lanes; the
// last stage of a service hands its results to one thread). Dropping a candidate can
// only drop its neighbours, so the first pass that drops none is the answer.
template <std::size_t N>
std::array<std::size_t, N> plan_lanes(const std::array<std::size_t, N>& candidates,
                                      const std::array<std::size_t, N>& pushers,
                                      const std::array<std::size_t, N>& poppers) {
  std::array<std::size_t, N> lanes = candidates;
  for (bool dropped = true; dropped;) {
    dropped = false;
    for (std::size_t i = 0; i < N; ++i) {
      if (lanes[i] == 0) continue;
      const bool before = i > 0 && (lanes[i - 1] != 0 || pushers[i - 1] == 1);
      const bool after = i + 1 == N || lanes[i + 1] != 0 || poppers[i + 1] == 1;
      if (!before || !after) {
        lanes[i] = 0;
        dropped = true;
      }
    }
  }
  return lanes;
}

}  // namespace detail

template <class Chain>
class pipeline;

template <class... Bound>
class pipeline<chain<Bound...>> {
  using stages_t = std::tuple<Bound...>;
  static constexpr std::size_t n_stages = sizeof...(Bound);
  template <std::size_t I>
  using bound_t = std::tuple_element_t<I, stages_t>;
  template <std::size_t I>
  using stage_t = typename bound_t<I>::stage_type;
  template <std::size_t I>
  using out_t = typename bound_t<I>::out_type;

  static constexpr bool service = detail::is_input<stage_t<0>>::value;
  static constexpr bool has_sink = detail::is_sink<stage_t<n_stages - 1>>::value;
  static_assert(n_stages >= 2 || service,
                "conveyor::pipeline: a pipeline needs a source and at least one more stage");
  static_assert(has_sink || service,
                "conveyor::pipeline: end the chain with conveyor::sink(...) (or start it with "
                "conveyor::input<T>() to get results back from submit())");
  static_assert(!(has_sink && service),
                "conveyor::pipeline: a service pipeline (conveyor::input<T>()) hands each "
                "result back through submit(): leave the sink out");

 public:
  // The type a service pipeline's submit() future yields.
  using result_type = std::conditional_t<has_sink, void, out_t<n_stages - 1>>;
  using input_type = out_t<0>;

  // Builds every ring and stage; nothing runs yet. Bad configuration throws config_error.
  explicit pipeline(chain<Bound...> c, pipeline_options options = {})
      : state_(std::make_unique<state>(std::move(c), options)) {}

  pipeline(pipeline&&) noexcept = default;
  pipeline& operator=(pipeline&&) noexcept = default;
  ~pipeline() {
    if (state_ && state_->started && !state_->joined) {
      state_->ctl.stop();
      finish_threads();
    }
  }

  // Runs a finite source to its end. Rethrows the first stage failure after joining.
  // @note blocks the calling thread until every stage has finished.
  conveyor::report run()
    requires(!service)
  {
    start();
    return wait();
  }

  // Starts every stage's threads. @throws closed_error if already started.
  void start() {
    if (state_->started) throw closed_error("conveyor::pipeline: start() called twice");
    state_->started = true;
    state_->start_ns = now_ns();  // a placeholder should spawning throw
    start_nodes(std::make_index_sequence<n_stages>{});  // the threads wait at the gate
    state_->start_ns = now_ns();
    state_->start_cpu_ns = conveyor::process_cpu_ns();
    state_->ctl.open_gate();
    if (state_->options.placement != thread_placement::os)
      state_->placer = std::make_unique<detail::load_placer>(
          state_->placed, state_->options.placement_period,
          state_->options.placement == thread_placement::by_load ? detail::pin_policy::always
                                                                 : detail::pin_policy::automatic,
          detail::load_placer::shares_override{},
          // The placer is stopped before the state goes (finish_threads()).
          [st = state_.get()](const detail::chain_placement& where) {
            st->follow_placement(where, std::make_index_sequence<n_rings>{});
          });
    if (state_->options.progress) {
      const state* st = state_.get();  // stable: the state is heap-allocated
      state_->progress = std::make_unique<metrics::progress_line>(
          [st] { return make_report(*st); }, state_->options.progress_period,
          state_->options.progress_out != nullptr ? *state_->options.progress_out : std::cerr);
    }
  }

  // Service mode: hands x to the pipeline; the future holds its result, or the error
  // that stopped the pipeline, or closed_error if it was cancelled. Each call allocates
  // the future's shared state; submit(x, done) does not.
  // @note blocks while the pipeline is full (backpressure).
  // @throws closed_error when the pipeline is not running.
  std::future<result_type> submit(input_type x)
    requires service
  {
    std::future<result_type> fut;
    enter(take_ticket(), std::move(x), [&fut](ticket_slot& slot) {
      slot.promise = std::promise<result_type>{};
      fut = slot.promise.get_future();
    });
    return fut;
  }

  // Service mode, with a callback instead of a future: done(conveyor::outcome<result>)
  // is called exactly once per accepted call, with the item's result, or the error that
  // stopped the pipeline, or closed_error if the item was cancelled. It runs on the
  // pipeline's result thread when the item completes; for an item that does not, on the
  // thread that settles it (the one in stop() or wait(), or this one if the pipeline
  // stopped before taking the item). done must be noexcept (nothing could catch what it
  // throws) and copyable (it is kept in a std::function); one that fits std::function's
  // small buffer (with libstdc++: trivially copyable, up to 16 bytes, e.g. a lambda
  // capturing two pointers or references) costs no allocation: with it, an item goes
  // from submit() to done without one. From inside done, follow-up items go in with
  // try_submit() (submit() could wait for a ticket that only this thread frees), and
  // stop() / wait() must not be called (they join this thread).
  // @note blocks while the pipeline is full (backpressure).
  // @throws closed_error when the pipeline is not running (done is not called).
  template <class Done>
    requires service
  void submit(input_type x, Done&& done) {
    check_done<Done>();
    enter(take_ticket(), std::move(x),
          [&done](ticket_slot& slot) { slot.done = std::forward<Done>(done); });
  }

  // As submit(x) and submit(x, done), but never wait for room: when the pipeline already
  // holds as many items as it takes (1024), they refuse — nullopt, or false — and leave
  // x as it was (it is moved from only when accepted), so a server can shed load or retry.
  // @throws closed_error when the pipeline is not running.
  std::optional<std::future<result_type>> try_submit(input_type&& x)
    requires service
  {
    const std::optional<std::uint32_t> ticket = try_take_ticket();
    if (!ticket) return std::nullopt;
    std::future<result_type> fut;
    enter(*ticket, std::move(x), [&fut](ticket_slot& slot) {
      slot.promise = std::promise<result_type>{};
      fut = slot.promise.get_future();
    });
    return fut;
  }
  template <class Done>
    requires service
  [[nodiscard]] bool try_submit(input_type&& x, Done&& done) {
    check_done<Done>();
    const std::optional<std::uint32_t> ticket = try_take_ticket();
    if (!ticket) return false;
    enter(*ticket, std::move(x),
          [&done](ticket_slot& slot) { slot.done = std::forward<Done>(done); });
    return true;
  }

  // Stops the pipeline and waits for it. drain: input closes, everything inside
  // completes; cancel: stages stop at once, what is inside counts as cancelled.
  // @note blocks until every thread has joined. Rethrows a stage failure.
  conveyor::report stop(stop_mode mode) {
    if (!state_->started) throw closed_error("conveyor::pipeline: stop() before start()");
    if (mode == stop_mode::cancel) {
      state_->ctl.stop();
    } else {
      close_input();
    }
    return wait();
  }

  // Waits for the pipeline to finish (a finite source ends, or stop() was called).
  // @note blocks the calling thread. Rethrows the first stage failure, after joining.
  conveyor::report wait() {
    if (!state_->started) throw closed_error("conveyor::pipeline: wait() before start()");
    finish_threads();
    state_->ctl.error.rethrow_if_any();
    return this->report();
  }

  // What the pipeline measured: per-stage busy / starved / blocked time, per-lane H2D /
  // compute / D2H time, GPU busy fraction, latency percentiles, throughput, the item
  // accounting and the verdict naming the bottleneck. Callable while running (a
  // snapshot of the run so far) and after it (final). Not a hot path: it allocates.
  conveyor::report report() const { return make_report(*state_); }

  // The trace as Chrome trace-event JSON (Perfetto, chrome://tracing): per stage worker
  // a track of busy spans and input-ring occupancy counters; per lane a track of batch >
  // H2D / compute / D2H spans in device time, and the lane's enqueue and completion
  // threads. Callable during the run (the most recent events; see metrics/trace.hpp)
  // and after it (exact). Not a hot path: it allocates.
  // @throws conveyor::error when the pipeline was built without trace_events.
  void write_trace(std::ostream& os) const {
    const state& st = *state_;
    if (!st.ctl.trace)
      throw error("conveyor::pipeline: no trace was recorded; construct the pipeline with "
                  "pipeline_options{.trace_events = N} (e.g. 16384)");
    metrics::write_chrome_trace(os, *st.ctl.trace);
  }
  // @throws conveyor::error when the file cannot be written, or as write_trace(ostream&).
  void write_trace(const std::string& path) const {
    std::ofstream f{path};
    if (!f) throw error("conveyor::pipeline: cannot open '" + path + "' to write the trace");
    write_trace(f);
    f.flush();
    if (!f) throw error("conveyor::pipeline: writing the trace to '" + path + "' failed");
  }
  std::string trace_json() const {
    std::ostringstream o;
    write_trace(o);
    return o.str();
  }
  // True when the pipeline records a trace (pipeline_options::trace_events > 0).
  bool tracing() const noexcept { return state_->ctl.trace != nullptr; }

  // A snapshot: exact once the pipeline has stopped.
  item_counts counts() const noexcept {
    const auto& c = state_->ctl;
    // relaxed: counters; after join they are exact, before it a recent snapshot.
    return {c.produced.load(std::memory_order_relaxed), c.completed(),
            c.failed.load(std::memory_order_relaxed), c.cancelled.load(std::memory_order_relaxed)};
  }

 private:
  struct state;

  // What submit(x, done) and try_submit(x, done) require of done, said at the call.
  template <class Done>
  static constexpr void check_done() {
    static_assert(std::is_invocable_v<Done&, outcome<result_type>&&>,
                  "conveyor::pipeline::(try_)submit(x, done): done must be callable with "
                  "conveyor::outcome<result> (the result type of the pipeline's last stage)");
    static_assert(std::is_nothrow_invocable_v<Done&, outcome<result_type>&&>,
                  "conveyor::pipeline::(try_)submit(x, done): declare done noexcept; it runs "
                  "on the pipeline's threads, where nothing could catch what it throws");
    static_assert(std::is_copy_constructible_v<std::decay_t<Done>>,
                  "conveyor::pipeline::(try_)submit(x, done): done must be copyable (it is "
                  "kept in a std::function); capture move-only state by pointer or "
                  "std::shared_ptr");
  }

  // The report from the counters; see report(). Runs on the progress thread too.
  static conveyor::report make_report(const state& st) {
    conveyor::report r;
    const std::int64_t end = st.joined ? st.end_ns : now_ns();
    r.wall_s = st.started ? conveyor::ns_to_s(end - st.start_ns) : 0.0;
    const auto& c = st.ctl;
    // relaxed: counters; after join they are exact, before it a recent snapshot.
    r.produced = c.produced.load(std::memory_order_relaxed);
    r.completed = c.completed();
    r.failed = c.failed.load(std::memory_order_relaxed);
    r.cancelled = c.cancelled.load(std::memory_order_relaxed);
    r.runtime = "host";
    if (st.started) {
      r.cpus = conveyor::usable_cpus();
      const std::int64_t cpu_end = st.joined ? st.end_cpu_ns : conveyor::process_cpu_ns();
      r.process_cpu_s = conveyor::ns_to_s(std::max<std::int64_t>(cpu_end - st.start_cpu_ns, 0));
    }
    r.placement.mode = to_string(st.options.placement);
    if (st.placer) {  // made in start() before the progress thread, kept until destruction
      r.placement.rounds = st.placer->rounds();
      r.placement.pinned_rounds = std::min(st.placer->pinned_rounds(), r.placement.rounds);
    }
    std::int64_t gpu_busy_ns = 0;
    for (const detail::stage_info& i : st.infos) {
      r.stages.push_back(metrics::make_stage_report(i.name, i.kind, *i.stats, i.input_capacity));
      if (i.gpu) {
        for (auto& l : metrics::make_lane_reports(*i.gpu)) r.lanes.push_back(l);
        gpu_busy_ns += i.gpu->compute_busy_ns();
        r.runtime = std::string(i.runtime);
      }
      if (i.batches && !r.batching) r.batching = metrics::make_batch_report(i.batches->snapshot());
    }
    report_depths(st, r, std::make_index_sequence<n_rings>{});
    r.gpu_busy_fraction = r.wall_s > 0 ? conveyor::ns_to_s(gpu_busy_ns) / r.wall_s : 0.0;
    r.item_latency = metrics::make_latency_report(st.latency);
    metrics::complete_report(r);
    if (!st.ctl.metrics_on) {
      r.verdict = {verdict_kind::unmeasured, {},
                   "the pipeline ran with pipeline_options::metrics = false: only item counts "
                   "were kept",
                   "turn metrics on (the default) to see busy / starved / blocked time per "
                   "stage and the bottleneck"};
    }
    return r;
  }

  // A ring that could grow is reported at the deepest it ran: the stage after ring I is
  // at chain position I + 1 - first_ring_stage in the report.
  template <std::size_t... I>
  static void report_depths(const state& st, conveyor::report& r, std::index_sequence<I...>) {
    (
        [&] {
          const auto& ring = *std::get<I>(st.rings);
          const std::size_t at = I + 1 - state::first_ring_stage;
          if (I >= state::first_ring_stage && ring.can_grow() && at < r.stages.size())
            r.stages[at].ring_capacity = ring.deepest();
        }(),
        ...);
  }

  // One ring behind each stage that has output (a service's last stage included).
  template <std::size_t I>
  using ring_t = std::unique_ptr<detail::link<out_t<I>>>;
  static constexpr std::size_t n_rings = has_sink ? n_stages - 1 : n_stages;

  template <class Seq>
  struct ring_tuple;
  template <std::size_t... I>
  struct ring_tuple<std::index_sequence<I...>> {
    using type = std::tuple<ring_t<I>...>;
  };
  using rings_t = typename ring_tuple<std::make_index_sequence<n_rings>>::type;

  // One submitted item's way back: its future's promise, or its callback. in_use is
  // true from submit() until the item is settled; exactly one thread settles it.
  // Only a service pipeline has tickets (its result_type is never void); the others
  // name a placeholder.
  using ticket_value = std::conditional_t<service, result_type, int>;
  struct ticket_slot {
    std::promise<ticket_value> promise;                 // submit(x)
    std::function<void(outcome<ticket_value>&&)> done;  // submit(x, done); else empty
    std::atomic<bool> in_use{false};

    void succeed(ticket_value&& v) {
      if (done)
        std::exchange(done, nullptr)(outcome<ticket_value>::success(std::move(v)));
      else
        promise.set_value(std::move(v));
    }
    void fail(std::exception_ptr e) {
      if (done)
        std::exchange(done, nullptr)(outcome<ticket_value>::failure(std::move(e)));
      else
        promise.set_exception(std::move(e));
    }
  };
  // The result end of a service pipeline: settles each item's future or callback.
  struct result_deliver {
    state* st;
    void operator()(detail::envelope<out_t<n_stages - 1>>&& e) const {
      if (!e.metas.empty())
        throw error("a service pipeline must deliver one result per submitted item; end "
                    "the chain with unbatch() after a batch");
      const auto ticket = static_cast<std::uint32_t>(e.meta.id);  // see detail::item_meta
      auto& slot = st->tickets[ticket];
      slot.succeed(std::move(e.value));
      slot.in_use.store(false, std::memory_order_relaxed);  // relaxed: the ring push publishes
      st->free_tickets.push(std::uint32_t{ticket});
    }
  };

  template <std::size_t I>
  static auto make_stage_node(stages_t& s, detail::control& ctl, rings_t& rings,
                              detail::latency_recorder* lat, state* st) {
    auto in = [&] {
      if constexpr (I == 0) return static_cast<void*>(nullptr);
      else return std::get<I - 1>(rings).get();
    }();
    auto out = [&] {
      if constexpr (I < n_rings) return std::get<I>(rings).get();
      else return static_cast<void*>(nullptr);
    }();
    if constexpr (detail::is_input<stage_t<I>>::value) {
      return std::unique_ptr<int>{};  // the input ring is the whole stage
    } else {
      (void)st;
      return detail::make_node(std::move(std::get<I>(s).stage), ctl, in, out, lat);
    }
  }

  template <class Seq>
  struct node_tuple;
  template <std::size_t... I>
  struct node_tuple<std::index_sequence<I...>> {
    using type = std::tuple<decltype(make_stage_node<I>(std::declval<stages_t&>(),
                                                        std::declval<detail::control&>(),
                                                        std::declval<rings_t&>(), nullptr,
                                                        nullptr))...>;
  };
  using nodes_t = typename node_tuple<std::make_index_sequence<n_stages>>::type;

  using result_node_t = detail::terminal_node<out_t<n_stages - 1>, result_deliver>;

  struct state {
    state(chain<Bound...>&& c, const pipeline_options& o)
        : options((check_options(o), o)),
          ctl(o.metrics, o.trace_events),
          rings(make_rings(o, c.stages, std::make_index_sequence<n_rings>{})),
          nodes(make_nodes(c.stages, std::make_index_sequence<n_stages>{})),
          free_tickets(service ? detail::next_power_of_two(ticket_count(c)) : 2),
          tickets(service ? ticket_count(c) : 0) {
      if (o.placement != thread_placement::os) ctl.workers = &placed;
      register_closers(std::make_index_sequence<n_rings>{});
      collect_infos(std::make_index_sequence<n_stages>{});
      if constexpr (service) {
        ctl.use_tickets(tickets.size());
        for (std::uint32_t t = 0; t < tickets.size(); ++t) (void)free_tickets.try_push(t);
        ctl.on_stop([this] { free_tickets.close(); });
        result.reset(new result_node_t("results", 1, result_deliver{this}, ctl,
                                       std::get<n_rings - 1>(rings).get(), &latency));
        infos.push_back(result->info());
      }
      std::vector<const metrics::stage_stats*> chain;
      for (const detail::stage_info& i : infos) chain.push_back(i.stats);
      placed.set_chain(std::move(chain));
    }

    template <std::size_t... I>
    static rings_t make_rings(const pipeline_options& o, const stages_t& s,
                              std::index_sequence<I...>) {
      detail::check_ring_capacity("pipeline ring", o.ring_capacity);
      const auto lanes = plan_lanes(s);
      return rings_t{std::make_unique<detail::link<out_t<I>>>(
          I == 0 && service ? input_capacity() : o.ring_capacity, ring_ends<I>(s, lanes),
          I == 0 && service ? 0 : ring_reserve<out_t<I>>(o))...};
    }
    // The room ring_growth gives a ring of T: only where its slots are small (see
    // pipeline_options::ring_growth). A ring with several threads at an end ignores it.
    template <class T>
    static std::size_t ring_reserve(const pipeline_options& o) {
      constexpr bool small = sizeof(detail::envelope<T>) + sizeof(std::size_t) <= 64;
      return small ? o.ring_capacity * o.ring_growth : 0;
    }
    static void check_growth(const pipeline_options& o) {
      CONVEYOR_EXPECTS(o.ring_growth >= 1 && o.ring_growth <= 64 &&
                           (o.ring_growth & (o.ring_growth - 1)) == 0,
                       "pipeline_options: ring_growth must be a power of two in [1, 64] (1: "
                       "rings never grow), got " + std::to_string(o.ring_growth) +
                           "; 8 is the default");
      CONVEYOR_EXPECTS(o.ring_capacity <= detail::max_ring_capacity / o.ring_growth,
                       "pipeline_options: ring_capacity x ring_growth must be <= 2^30, got " +
                           std::to_string(o.ring_capacity) + " x " +
                           std::to_string(o.ring_growth) + "; lower ring_growth (1: rings "
                           "never grow)");
    }

    // After each placer round (on its thread): every ring that can grow moves to its
    // reserve where its two stages' threads share a CPU and shared_core_grows() says so
    // at its consumer's CPU time per element, and back elsewhere. Ring I runs from chain
    // position I - first_ring_stage to the next one (a service's input has no position:
    // its ring never grows).
    template <std::size_t... I>
    void follow_placement(const detail::chain_placement& where, std::index_sequence<I...>) {
      (
          [&] {
            auto& ring = *std::get<I>(rings);
            if (I < first_ring_stage || !ring.can_grow()) return;
            const std::size_t from = I - first_ring_stage;
            ring.grow(where.share_cpu(from) &&
                      detail::shared_core_grows(ring.reserve(), where.load(from + 1)));
          }(),
          ...);
    }
    // The chain position of ring I's producer is I - first_ring_stage.
    static constexpr std::size_t first_ring_stage = service ? 1 : 0;
    // Ring I runs from stage I to stage I + 1 (or to the result node of a service).
    // lanes: plan_lanes(s), planned once for all rings.
    template <std::size_t I>
    static detail::ring_ends ring_ends(const stages_t& s,
                                       const std::array<std::size_t, n_stages>& lanes) {
      detail::ring_ends e;
      e.pushers = lanes[I] != 0 ? lanes[I] : detail::output_pushers(std::get<I>(s).stage);
      if constexpr (I + 1 < n_stages)
        e.poppers = lanes[I + 1] != 0 ? lanes[I + 1] : detail::input_poppers(std::get<I + 1>(s).stage);
      else
        e.poppers = 1;  // the result node's one thread
      e.lanes = lanes[I] != 0 || (I + 1 < n_stages && lanes[I + 1] != 0);
      return e;
    }
    static std::array<std::size_t, n_stages> plan_lanes(const stages_t& s) {
      std::array<std::size_t, n_stages> candidates{}, pushers{}, poppers{};
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (
            [&] {
              const auto& stage = std::get<I>(s).stage;
              candidates[I] = detail::lane_workers(stage);
              if constexpr (requires { detail::output_pushers(stage); })
                pushers[I] = detail::output_pushers(stage);
              if constexpr (requires { detail::input_poppers(stage); })
                poppers[I] = detail::input_poppers(stage);
            }(),
            ...);
      }(std::make_index_sequence<n_stages>{});
      return detail::plan_lanes(candidates, pushers, poppers);
    }
    static void check_options(const pipeline_options& o) {
      check_growth(o);
      CONVEYOR_EXPECTS(!o.progress || o.metrics,
                       "pipeline_options: progress needs metrics = true (the line shows "
                       "measured rates and the bottleneck)");
      CONVEYOR_EXPECTS(!o.progress || o.progress_period >= metrics::progress_line::min_period,
                       "pipeline_options: progress_period must be >= 250 ms (at most 4 "
                       "refreshes a second)");
      CONVEYOR_EXPECTS(o.placement == thread_placement::os ||
                           o.placement_period >= std::chrono::milliseconds(10),
                       "pipeline_options: placement_period must be >= 10 ms; 200 ms is the "
                       "default");
    }
    // A slot in the input ring for every ticket: try_submit() relies on it.
    static std::size_t input_capacity() { return 1024; }
    static std::size_t ticket_count(const chain<Bound...>&) { return input_capacity(); }

    template <std::size_t... I>
    nodes_t make_nodes(stages_t& s, std::index_sequence<I...>) {
      return nodes_t{make_stage_node<I>(s, ctl, rings, &latency, this)...};
    }
    template <std::size_t... I>
    void register_closers(std::index_sequence<I...>) {
      (ctl.on_stop([r = std::get<I>(rings).get()] { r->close(); }), ...);
    }
    template <std::size_t... I>
    void collect_infos(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (!detail::is_input<stage_t<I>>::value)
              infos.push_back(std::get<I>(nodes)->info());
          }(),
          ...);
    }

    // First, so destroyed last: stage threads use the registry until they end.
    detail::thread_registry placed;               // by_load: the running stage workers
    std::unique_ptr<detail::load_placer> placer;  // null: placement left to the OS
    pipeline_options options;
    detail::control ctl;  // before rings and nodes: they register with it
    detail::latency_recorder latency;
    rings_t rings;
    nodes_t nodes;
    mpmc_ring<std::uint32_t> free_tickets;
    std::vector<ticket_slot> tickets;
    std::unique_ptr<result_node_t> result;
    std::vector<detail::stage_info> infos;
    detail::thread_group threads;
    std::unique_ptr<metrics::progress_line> progress;  // null: no progress line
    std::atomic<std::uint64_t> next_seq{0};
    std::atomic<bool> input_closed{false};
    bool started = false, joined = false;
    std::int64_t start_ns = 0, end_ns = 0;
    std::int64_t start_cpu_ns = 0, end_cpu_ns = 0;  // conveyor::process_cpu_ns()
  };

  template <std::size_t... I>
  void start_nodes(std::index_sequence<I...>) {
    (
        [&] {
          if constexpr (!detail::is_input<stage_t<I>>::value)
            std::get<I>(state_->nodes)->start(state_->threads);
        }(),
        ...);
    if constexpr (service) state_->result->start(state_->threads);
  }

  void close_input() {
    if constexpr (service) {
      state_->input_closed.store(true, std::memory_order_release);  // pairs with take_ticket()
      std::get<0>(state_->rings)->close();
    } else {
      state_->ctl.stop_source.store(true, std::memory_order_release);
    }
  }

  // submit()'s first half: a free ticket, which bounds the items in flight.
  // @note blocks while every ticket is out. @throws closed_error when not running.
  std::uint32_t take_ticket() {
    require_running();
    auto ticket = state_->free_tickets.pop();
    if (!ticket) throw closed_error("conveyor::pipeline: submit() after stop()");
    return *ticket;
  }
  // try_submit()'s: nullopt when every ticket is out. With a ticket, enter() does not
  // wait for room either: the input ring has a slot per ticket (its push may only wait
  // out another thread's pop of that slot, already under way).
  std::optional<std::uint32_t> try_take_ticket() {
    require_running();
    return state_->free_tickets.try_pop();
  }
  void require_running() const {
    const state& st = *state_;
    if (!st.started || st.input_closed.load(std::memory_order_acquire))  // pairs with close_input()
      throw closed_error("conveyor::pipeline: submit() needs a started, not stopped pipeline");
  }

  // submit()'s second half: arm(slot) sets the ticket's promise or callback, then x
  // enters the pipeline under it. If arming or wrapping x throws (bad_alloc in a
  // std::function, a throwing move), the ticket goes back unused: nothing is counted, no
  // callback runs, and the pipeline keeps its capacity. If the pipeline stopped first,
  // the item is settled here as cancelled.
  template <class Arm>
  void enter(std::uint32_t ticket, input_type&& x, Arm&& arm) {
    state& st = *state_;
    auto& slot = st.tickets[ticket];
    std::optional<detail::envelope<input_type>> e;
    try {
      arm(slot);
      // The item's id is its ticket; its number and entry time go with the ticket.
      st.ctl.enter_ticket(ticket, st.next_seq.fetch_add(1, std::memory_order_relaxed),
                          st.ctl.metrics_on ? now_ns() : 0);
      e.emplace(detail::envelope<input_type>{std::move(x), {ticket}, {}});
    } catch (...) {
      slot.done = nullptr;
      (void)st.free_tickets.try_push(std::uint32_t{ticket});  // never full: one slot per ticket
      throw;
    }
    // release: pairs with the acq_rel exchange in finish_threads(); if a stop() racing
    // this call settles the item from its own thread, it sees the promise or callback
    // that arm() wrote.
    slot.in_use.store(true, std::memory_order_release);
    st.ctl.produced.fetch_add(1, std::memory_order_relaxed);  // relaxed: read after join
    // release (via the ring's push): the promise or callback written before is visible
    // to whichever thread pops this envelope and settles it.
    if (!std::get<0>(st.rings)->push(std::move(*e))) {
      st.ctl.cancel(1);
      // Exactly one of this call and finish_threads() settles the item: whichever takes
      // in_use from true to false (acq_rel: pairs with the exchange there, so the loser
      // sees the winner's claim).
      if (slot.in_use.exchange(false, std::memory_order_acq_rel))
        slot.fail(std::make_exception_ptr(
            closed_error("conveyor::pipeline: stopped before the item was accepted")));
      (void)st.free_tickets.try_push(std::uint32_t{ticket});  // never full: one slot per ticket
    }
  }

  // Joins every thread, then accounts for whatever is still inside as cancelled.
  void finish_threads() {
    state& st = *state_;
    if (st.joined) return;
    st.threads.join();
    if (st.placer) st.placer->stop();
    // Before joined/end_ns change: the progress thread reads them through make_report().
    if (st.progress) st.progress->stop();
    st.joined = true;
    st.end_ns = now_ns();
    st.end_cpu_ns = conveyor::process_cpu_ns();
    after_join(std::make_index_sequence<n_stages>{});
    drain_rings(std::make_index_sequence<n_rings>{});
    if constexpr (service) {
      st.free_tickets.close();
      for (auto& slot : st.tickets)
        if (slot.in_use.exchange(false, std::memory_order_acq_rel))  // see enter()
          slot.fail(st.ctl.error.failed() ? st.ctl.error.get()
                                          : std::make_exception_ptr(closed_error(
                                                "conveyor::pipeline: the item was cancelled")));
    }
  }

  template <std::size_t... I>
  void after_join(std::index_sequence<I...>) {
    (
        [&] {
          if constexpr (requires { std::get<I>(state_->nodes)->after_join(); })
            std::get<I>(state_->nodes)->after_join();
        }(),
        ...);
  }

  template <std::size_t... I>
  void drain_rings(std::index_sequence<I...>) {
    (
        [&] {
          auto& ring = *std::get<I>(state_->rings);
          while (auto e = ring.take_any()) state_->ctl.cancel(e->items());
        }(),
        ...);
  }

  std::unique_ptr<state> state_;
};

template <class... Bound>
pipeline(chain<Bound...>) -> pipeline<chain<Bound...>>;
template <class... Bound>
pipeline(chain<Bound...>, pipeline_options) -> pipeline<chain<Bound...>>;

}  // namespace conveyor
