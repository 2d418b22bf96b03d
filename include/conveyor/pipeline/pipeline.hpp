// conveyor/pipeline/pipeline.hpp: a chain of stages as a running pipeline: its rings, its
// stage nodes, its lifecycle (run, or start / submit / stop) and its report.
//
//   conveyor::pipeline p{conveyor::source(next_image) | conveyor::map(decode).workers(3)
//                        | conveyor::sink(write_label)};
//   conveyor::report r = p.run();                              // blocks until done
//
//   conveyor::pipeline svc{conveyor::input<request>() | conveyor::map(answer)};
//   svc.start();
//   std::future<response> f = svc.submit(req);                 // or submit(req, done)
//   std::future<response> g = svc.submit(req, 50ms);           // worth a result for 50 ms
//   svc.stop(conveyor::stop_mode::drain);
//
// Failures (pipeline_options::errors): an exception in a stage is wrapped in
// conveyor::stage_error, which names the stage and the item and nests the original.
// isolate (a service's default): the item fails alone — a service's future or callback
// gets the stage_error — and the pipeline goes on. stop (a source pipeline's default):
// the first failure stops the pipeline (rings closed, blocked threads woken) and is
// rethrown from run()/wait()/stop() after every thread has joined; in a service the
// items that will get no result are settled at once (their futures and callbacks do
// not wait for stop() or wait()), and a later submit() throws closed_error saying why it
// stopped. Accounting always holds: produced == completed + failed + cancelled +
// expired (a service's items whose deadline passed before a stage took them). A
// moved-from pipeline throws closed_error from every call that needs its state; a
// pipeline runs once (run() or start(), then wait()).
// Memory is bounded: items in flight <= the ring capacities + what stages hold (a ring
// of small items may grow by pipeline_options::ring_growth, see pipeline/growth.hpp).
// Hops: a ring with one thread at each end is an spsc_ring, any other an mpmc_ring, and
// an ordered map between two in-order ends runs on lanes where no item is dropped on the
// way (a source pipeline under error_policy::stop; pipeline/detail/wiring.hpp).
// What does not depend on the stages' types — threads, placement, progress, trace,
// report assembly — is pipeline/detail/core.hpp, compiled once in the library.
//
// Thread-safety: one pipeline object is driven from one thread (run/start/stop/wait);
// submit() may be called from any number of threads between start() and stop();
// report(), counts(), trace_json() and write_trace() also while the stages run, from
// any thread that does not race with start()/wait()/stop() (the progress line does so).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <iosfwd>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "conveyor/base/box.hpp"
#include "conveyor/base/error.hpp"
#include "conveyor/base/outcome.hpp"
#include "conveyor/pipeline/detail/core.hpp"
#include "conveyor/pipeline/detail/service.hpp"
#include "conveyor/pipeline/detail/wiring.hpp"
#include "conveyor/pipeline/growth.hpp"
#include "conveyor/pipeline/options.hpp"
#include "conveyor/report/report.hpp"
#include "conveyor/stage/chain.hpp"

namespace conveyor {

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
      : state_(detail::make_box<state>(std::move(c), options)) {}

  pipeline(pipeline&&) noexcept = default;
  // A started pipeline that is assigned over is first stopped and joined, as if it were
  // destroyed.
  pipeline& operator=(pipeline&& other) noexcept {
    if (this != &other) {
      shut_down();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  ~pipeline() { shut_down(); }

  // Runs a finite source to its end. Rethrows the first stage failure after joining.
  // @note blocks the calling thread until every stage has finished.
  // @throws closed_error if the pipeline already ran (or was started, or moved from).
  conveyor::report run()
    requires(!service)
  {
    if (live("run()").core.started())
      throw closed_error(
          "conveyor::pipeline: run() called twice (or after start()): a pipeline runs "
          "once; build a new one to run again");
    start();
    return wait();
  }

  // Starts every stage's threads. @throws closed_error if already started (or moved from).
  void start() {
    live("start()").core.start([this](detail::thread_group& threads) {
      start_nodes(threads, std::make_index_sequence<n_stages>{});
    });
  }

  // Service mode: hands x to the pipeline; the future holds its result, or the
  // stage_error of the stage that failed on it (error_policy::isolate), or the error
  // that stopped the pipeline (error_policy::stop), or closed_error if it was cancelled.
  // Once a stage's failure has stopped the pipeline it is ready, whether or not stop()
  // or wait() is called. Each call allocates the future's shared state; submit(x, done)
  // does not.
  // @note blocks while the pipeline holds input<T>().capacity() items (backpressure).
  // @throws closed_error when the pipeline is not running: not started, stopped (the
  // message names the stage and item whose failure stopped it), or moved from.
  std::future<result_type> submit(input_type x)
    requires service
  {
    std::future<result_type> fut;
    enter(take_ticket("submit()"), std::move(x), [&fut](ticket_slot& slot) {
      slot.promise = std::promise<result_type>{};
      fut = slot.promise.get_future();
    });
    return fut;
  }

  // Service mode, with a callback instead of a future: done(conveyor::outcome<result>)
  // is called exactly once per accepted call, with the item's result, or its error (as
  // for submit(x)), or closed_error if the item was cancelled. It runs on the pipeline's
  // result thread when the item completes; on the thread of the stage that failed on it
  // or found it expired (error_policy::isolate, deadlines); for an item that will not, on the
  // result thread as soon as a stage's failure stops the pipeline, else on the thread
  // in stop(), wait() or the destructor (or on this one, for an item the stopping
  // pipeline did not take). done must be noexcept (nothing could catch what it
  // throws) and copyable (it is kept in a std::function); one that fits std::function's
  // small buffer (with libstdc++: trivially copyable, up to 16 bytes, e.g. a lambda
  // capturing two pointers or references) costs no allocation: with it, an item goes
  // from submit() to done without one. From inside done, follow-up items go in with
  // try_submit() (submit() could wait for a ticket that only this thread frees), and
  // stop() / wait() must not be called (they join this thread).
  // @note blocks while the pipeline holds input<T>().capacity() items (backpressure).
  // @throws closed_error as submit(x) (done is not called).
  template <class Done>
    requires(service && !detail::is_deadline_v<Done>)
  void submit(input_type x, Done&& done) {
    check_done<Done>();
    enter(take_ticket("submit()"), std::move(x),
          [&done](ticket_slot& slot) { slot.done = std::forward<Done>(done); });
  }

  // Service mode, with a deadline: as submit(x) and submit(x, done), but the item is
  // worth a result only until `deadline` (or for `within` from now). While the
  // pipeline is full the call waits for room until the deadline at most. An item whose
  // deadline has passed is dropped before the next stage spends work on it (each stage
  // checks as it takes an item; a batch drops its expired items before it leaves, and
  // before it goes to a GPU segment): its future or callback gets deadline_error, and it
  // counts as expired (item_counts::expired, and per stage in the report). An item
  // already in its last stage when the deadline passes completes.
  // @throws closed_error as submit(x).
  std::future<result_type> submit(input_type x, std::chrono::steady_clock::time_point deadline)
    requires service
  {
    std::future<result_type> fut;
    const auto arm = [&fut](ticket_slot& slot) {
      slot.promise = std::promise<result_type>{};
      fut = slot.promise.get_future();
    };
    enter_by(deadline, std::move(x), arm);
    return fut;
  }
  template <class Rep, class Period>
    requires service
  std::future<result_type> submit(input_type x, std::chrono::duration<Rep, Period> within) {
    return submit(std::move(x), deadline_in(within));
  }
  template <class Done>
    requires service
  void submit(input_type x, std::chrono::steady_clock::time_point deadline, Done&& done) {
    check_done<Done>();
    enter_by(deadline, std::move(x),
             [&done](ticket_slot& slot) { slot.done = std::forward<Done>(done); });
  }
  template <class Rep, class Period, class Done>
    requires service
  void submit(input_type x, std::chrono::duration<Rep, Period> within, Done&& done) {
    submit(std::move(x), deadline_in(within), std::forward<Done>(done));
  }

  // As submit(x) and submit(x, done), but never wait for room: when the pipeline already
  // holds as many items as it takes (input<T>().capacity(), 1024 unless set), they
  // refuse — nullopt, or false — and leave x as it was (it is moved from only when
  // accepted), so a server can shed load or retry.
  // @throws closed_error as submit(x).
  std::optional<std::future<result_type>> try_submit(input_type&& x)
    requires service
  {
    const std::optional<std::uint32_t> ticket = try_take_ticket("try_submit()");
    if (!ticket) return std::nullopt;
    std::future<result_type> fut;
    enter(*ticket, std::move(x), [&fut](ticket_slot& slot) {
      slot.promise = std::promise<result_type>{};
      fut = slot.promise.get_future();
    });
    return fut;
  }
  template <class Done>
    requires(service && !detail::is_deadline_v<Done>)
  [[nodiscard]] bool try_submit(input_type&& x, Done&& done) {
    check_done<Done>();
    const std::optional<std::uint32_t> ticket = try_take_ticket("try_submit()");
    if (!ticket) return false;
    enter(*ticket, std::move(x),
          [&done](ticket_slot& slot) { slot.done = std::forward<Done>(done); });
    return true;
  }
  // try_submit() with a deadline (see submit(x, deadline)).
  std::optional<std::future<result_type>> try_submit(input_type&& x,
                                                     std::chrono::steady_clock::time_point deadline)
    requires service
  {
    const std::optional<std::uint32_t> ticket = try_take_ticket("try_submit()");
    if (!ticket) return std::nullopt;
    std::future<result_type> fut;
    enter(
        *ticket, std::move(x),
        [&fut](ticket_slot& slot) {
          slot.promise = std::promise<result_type>{};
          fut = slot.promise.get_future();
        },
        deadline_ns(deadline));
    return fut;
  }
  template <class Done>
    requires service
  [[nodiscard]] bool try_submit(input_type&& x, std::chrono::steady_clock::time_point deadline,
                                Done&& done) {
    check_done<Done>();
    const std::optional<std::uint32_t> ticket = try_take_ticket("try_submit()");
    if (!ticket) return false;
    enter(
        *ticket, std::move(x), [&done](ticket_slot& slot) { slot.done = std::forward<Done>(done); },
        deadline_ns(deadline));
    return true;
  }

  // Stops the pipeline and waits for it. drain: input closes, everything inside
  // completes; cancel: stages stop at once, what is inside counts as cancelled.
  // @note blocks until every thread has joined. Rethrows a stage failure.
  conveyor::report stop(stop_mode mode) {
    if (!live("stop()").core.started())
      throw closed_error("conveyor::pipeline: stop() before start()");
    if (mode == stop_mode::cancel) {
      state_->core.ctl().stop();
    } else {
      close_input();
    }
    return wait();
  }

  // Waits for the pipeline to finish (a finite source ends, or stop() was called).
  // @note blocks the calling thread. Rethrows the first stage failure, after joining.
  conveyor::report wait() {
    if (!live("wait()").core.started())
      throw closed_error("conveyor::pipeline: wait() before start()");
    finish_threads();
    state_->core.ctl().error.rethrow_if_any();
    return this->report();
  }

  // What the pipeline measured: per-stage busy / starved / blocked time, per-lane H2D /
  // compute / D2H time, GPU busy fraction, latency percentiles, throughput, the item
  // accounting and the verdict naming the bottleneck. Callable while running (a
  // snapshot of the run so far) and after it (final). Not a hot path: it allocates.
  conveyor::report report() const { return live("report()").core.make_report(); }

  // The trace as Chrome trace-event JSON (Perfetto, chrome://tracing): per stage worker
  // a track of busy spans and input-ring occupancy counters; per lane a track of batch >
  // H2D / compute / D2H spans in device time, and the lane's enqueue and completion
  // threads. Callable during the run (the most recent events; see counters/trace.hpp)
  // and after it (exact). Not a hot path: it allocates.
  // @throws conveyor::error when the pipeline was built without trace_events.
  void write_trace(std::ostream& os) const { live("write_trace()").core.write_trace(os); }
  // @throws conveyor::error when the file cannot be written, or as write_trace(ostream&).
  void write_trace(const std::string& path) const { live("write_trace()").core.write_trace(path); }
  std::string trace_json() const { return live("trace_json()").core.trace_json(); }
  // True when the pipeline records a trace (pipeline_options::trace_events > 0).
  bool tracing() const noexcept { return state_ && state_->core.tracing(); }

  // A snapshot: exact once the pipeline has stopped (all zero for a moved-from one).
  item_counts counts() const noexcept { return state_ ? state_->core.counts() : item_counts{}; }

 private:
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

  // One ring behind each stage that has output (a service's last stage included).
  template <std::size_t I>
  using ring_t = detail::box<detail::link<out_t<I>>>;
  static constexpr std::size_t n_rings = has_sink ? n_stages - 1 : n_stages;

  template <class Seq>
  struct ring_tuple;
  template <std::size_t... I>
  struct ring_tuple<std::index_sequence<I...>> {
    using type = std::tuple<ring_t<I>...>;
  };
  using rings_t = typename ring_tuple<std::make_index_sequence<n_rings>>::type;

  // What a source pipeline has in place of a service's parts (tickets, result node).
  struct none {
    struct slot {};
  };
  // Only a service pipeline has tickets (its result_type is never void); the others name
  // the placeholder, so that their includers do not instantiate the tickets.
  using tickets_t =
      std::conditional_t<service, detail::service_tickets<input_type, result_type>, none>;
  using ticket_slot = typename tickets_t::slot;
  // The result end of a service pipeline: settles each item's future or callback.
  struct result_deliver {
    tickets_t* tickets;
    const detail::control* ctl;
    void operator()(detail::envelope<out_t<n_stages - 1>>& e) const { tickets->deliver(e); }
    // The result node's one worker delivers no more: after a failure, the rest fail now.
    void stopped_delivering() const noexcept { tickets->stop_delivering(*ctl); }
  };
  using result_node_t = detail::terminal_node<out_t<n_stages - 1>, result_deliver>;

  template <std::size_t I>
  static auto make_stage_node(stages_t& s, detail::control& ctl, rings_t& rings,
                              detail::latency_recorder* lat) {
    auto in = [&] {
      if constexpr (I == 0)
        return static_cast<void*>(nullptr);
      else
        return std::get<I - 1>(rings).get();
    }();
    auto out = [&] {
      if constexpr (I < n_rings)
        return std::get<I>(rings).get();
      else
        return static_cast<void*>(nullptr);
    }();
    if constexpr (detail::is_input<stage_t<I>>::value) {
      return detail::box<int>{};  // the input ring is the whole stage
    } else {
      return detail::make_node(std::move(std::get<I>(s).stage), ctl, in, out, lat);
    }
  }

  template <class Seq>
  struct node_tuple;
  template <std::size_t... I>
  struct node_tuple<std::index_sequence<I...>> {
    using type = std::tuple<decltype(make_stage_node<I>(std::declval<stages_t&>(),
                                                        std::declval<detail::control&>(),
                                                        std::declval<rings_t&>(), nullptr))...>;
  };
  using nodes_t = typename node_tuple<std::make_index_sequence<n_stages>>::type;

  struct state {
    state(chain<Bound...>&& c, const pipeline_options& o)
        : core(o),
          input_capacity(checked_input_capacity(c.stages)),
          rings(make_rings(o, c.stages, input_capacity, std::make_index_sequence<n_rings>{})),
          nodes(make_nodes(c.stages, std::make_index_sequence<n_stages>{})) {
      detail::control& ctl = core.ctl();
      ctl.isolate_failures = isolates(o);
      register_rings(std::make_index_sequence<n_rings>{});
      add_stages(std::make_index_sequence<n_stages>{});
      if constexpr (service) {
        tickets.emplace(input_capacity, ctl);
        result.reset(new result_node_t("results", 1, result_deliver{&*tickets, &ctl}, ctl,
                                       std::get<n_rings - 1>(rings).get(), &core.latency()));
        core.add_stage(result->info());
      }
    }

    // A service's input<T>().capacity(): its tickets, and a slot in the input ring for
    // each (try_submit() relies on it). 0 for a source pipeline.
    // @throws config_error unless it is a power of two in [2, 2^30].
    static std::size_t checked_input_capacity(const stages_t& s) {
      if constexpr (service) {
        const std::size_t n = std::get<0>(s).stage.capacity();
        detail::check_service_capacity(n);
        return n;
      } else {
        return 0;
      }
    }

    template <std::size_t... I>
    static rings_t make_rings(const pipeline_options& o, const stages_t& s,
                              std::size_t input_capacity, std::index_sequence<I...>) {
      const auto lanes = plan_lanes(s, o);
      return rings_t{detail::make_box<detail::link<out_t<I>>>(
          I == 0 && service ? input_capacity : o.ring_capacity, ring_ends<I>(s, lanes),
          I == 0 && service ? 0 : ring_reserve<out_t<I>>(o))...};
    }
    // The room ring_growth gives a ring of T: only where its slots are small and are all
    // the memory an item holds (see pipeline_options::ring_growth). A ring with several
    // threads at an end ignores it.
    template <class T>
    static std::size_t ring_reserve(const pipeline_options& o) {
      constexpr bool small = std::is_trivially_copyable_v<T> &&
                             sizeof(detail::envelope<T>) + sizeof(std::size_t) <= 64;
      return small ? o.ring_capacity * o.ring_growth : 0;
    }
    // The chain position of ring I's producer is I - first_ring_stage (a service's
    // input ring has no producer stage: it never grows).
    static constexpr std::size_t first_ring_stage = service ? 1 : 0;
    // Whether a stage's failure on an item fails that item alone (pipeline_options::errors).
    static bool isolates(const pipeline_options& o) noexcept {
      return o.errors == error_policy::isolate || (o.errors == error_policy::automatic && service);
    }
    // Ring I runs from stage I to stage I + 1 (or to the result node of a service).
    // lanes: plan_lanes(s, o), planned once for all rings.
    template <std::size_t I>
    static detail::ring_ends ring_ends(const stages_t& s,
                                       const std::array<std::size_t, n_stages>& lanes) {
      detail::ring_ends e;
      e.pushers = lanes[I] != 0 ? lanes[I] : detail::output_pushers(std::get<I>(s).stage);
      if constexpr (I + 1 < n_stages)
        e.poppers =
            lanes[I + 1] != 0 ? lanes[I + 1] : detail::input_poppers(std::get<I + 1>(s).stage);
      else
        e.poppers = 1;  // the result node's one thread
      e.lanes = lanes[I] != 0 || (I + 1 < n_stages && lanes[I + 1] != 0);
      return e;
    }
    // Lanes keep the order only where every item that enters a lane leaves it: not where
    // items may fail alone or expire (their positions would be missing); there an
    // ordered map's reorder window skips them.
    static std::array<std::size_t, n_stages> plan_lanes(const stages_t& s,
                                                        const pipeline_options& o) {
      std::array<std::size_t, n_stages> candidates{}, pushers{}, poppers{};
      if (service || isolates(o)) return candidates;
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

    template <std::size_t... I>
    nodes_t make_nodes(stages_t& s, std::index_sequence<I...>) {
      return nodes_t{make_stage_node<I>(s, core.ctl(), rings, &core.latency())...};
    }
    // Every ring closes on a stop; those that may grow are the placer's to deepen.
    template <std::size_t... I>
    void register_rings(std::index_sequence<I...>) {
      (
          [&] {
            auto* r = std::get<I>(rings).get();
            core.ctl().on_stop([r] { r->close(); });
            if (I >= first_ring_stage && r->can_grow())
              core.add_growable(
                  I - first_ring_stage,
                  detail::make_box<detail::growable_link<detail::envelope<out_t<I>>>>(*r));
          }(),
          ...);
    }
    template <std::size_t... I>
    void add_stages(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (!detail::is_input<stage_t<I>>::value)
              core.add_stage(std::get<I>(nodes)->info());
          }(),
          ...);
    }

    // First, so destroyed last: the stages and rings register with its control, and its
    // threads use them until they are joined.
    detail::pipeline_core core;
    const std::size_t input_capacity;  // a service's; before rings, which it sizes
    rings_t rings;
    nodes_t nodes;
    // A service's tickets and result node; nothing for the others.
    std::conditional_t<service, std::optional<tickets_t>, none> tickets;
    std::conditional_t<service, detail::box<result_node_t>, none> result;
    std::atomic<bool> input_closed{false};
  };

  template <std::size_t... I>
  void start_nodes(detail::thread_group& threads, std::index_sequence<I...>) {
    (
        [&] {
          if constexpr (!detail::is_input<stage_t<I>>::value)
            std::get<I>(state_->nodes)->start(threads);
        }(),
        ...);
    if constexpr (service) state_->result->start(threads);
  }

  void close_input() {
    if constexpr (service) {
      state_->input_closed.store(true, std::memory_order_release);  // pairs with require_running()
      std::get<0>(state_->rings)->close();
    } else {
      state_->core.ctl().stop_source.store(true, std::memory_order_release);
    }
  }

  // The state, for `call`. @throws closed_error on a moved-from pipeline.
  state& live(const char* call) const {
    if (!state_) detail::throw_moved_from(call);
    return *state_;
  }

  // submit()'s first half: a free ticket, which bounds the items in flight.
  // @note blocks while every ticket is out. @throws closed_error when not running.
  std::uint32_t take_ticket(const char* call) {
    require_running(call);
    const std::optional<std::uint32_t> ticket = state_->tickets->take();
    if (!ticket) refuse(call);  // the pipeline stopped while this call waited
    return *ticket;
  }
  // try_submit()'s: nullopt when every ticket is out. With a ticket, enter() does not
  // wait for room either: the input ring has a slot per ticket (its push may only wait
  // out another thread's pop of that slot, already under way).
  std::optional<std::uint32_t> try_take_ticket(const char* call) {
    require_running(call);
    std::optional<std::uint32_t> ticket = state_->tickets->try_take();
    // No ticket because the pipeline stopped (the free list closed) is not "full".
    if (!ticket && stopping()) refuse(call);
    return ticket;
  }
  void require_running(const char* call) const {
    if (!live(call).core.started()) detail::throw_before_start(call);
    if (stopping()) refuse(call);
  }
  // Whether the service takes no more: its input was closed (stop(drain)) or it stopped
  // (stop(cancel), or a stage failed).
  bool stopping() const noexcept {
    const state& st = *state_;
    // acquire: pairs with close_input()'s release store. is_stopping() (acquire) pairs
    // with the acq_rel exchange in control::stop(), which a failure's capture precedes:
    // a caller that sees the stop also sees the error that caused it (refuse()).
    return st.input_closed.load(std::memory_order_acquire) || st.core.ctl().is_stopping();
  }
  // @throws closed_error for `call` on a stopped service, saying why it stopped.
  [[noreturn]] void refuse(const char* call) const {
    detail::throw_refused(call, state_->core.ctl());
  }

  // submit()'s second half (see service_tickets::enter()).
  template <class Arm>
  void enter(std::uint32_t ticket, input_type&& x, Arm&& arm, std::int64_t deadline = 0) {
    state& st = *state_;
    st.tickets->enter(ticket, std::move(x), std::forward<Arm>(arm), *std::get<0>(st.rings),
                      st.core.ctl(), deadline);
  }

  // submit(x, deadline): waits for a ticket until the deadline at most. When it passes
  // first, the item expires here: armed as any other, counted as produced and expired,
  // and settled at once with deadline_error.
  template <class Arm>
  void enter_by(std::chrono::steady_clock::time_point deadline, input_type&& x, Arm&& arm) {
    require_running("submit()");
    state& st = *state_;
    if (const std::optional<std::uint32_t> ticket = st.tickets->take_until(deadline)) {
      enter(*ticket, std::move(x), std::forward<Arm>(arm), deadline_ns(deadline));
      return;
    }
    if (stopping()) refuse("submit()");  // no ticket because the service stopped
    ticket_slot expired;
    arm(expired);
    detail::control& ctl = st.core.ctl();
    ctl.produced.fetch_add(1, std::memory_order_relaxed);  // relaxed: read after join
    ctl.expired.fetch_add(1, std::memory_order_relaxed);
    expired.fail(std::make_exception_ptr(deadline_error(
        "conveyor::pipeline: submit(): the deadline passed while the pipeline had no room "
        "for the item (it holds input<T>().capacity() items)")));
  }

  // A deadline on the clock of the tickets (now_ns(): steady_clock's epoch); never 0,
  // which means none.
  static std::int64_t deadline_ns(std::chrono::steady_clock::time_point d) noexcept {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(d.time_since_epoch()).count();
    return ns > 0 ? static_cast<std::int64_t>(ns) : 1;
  }
  template <class Rep, class Period>
  static std::chrono::steady_clock::time_point deadline_in(std::chrono::duration<Rep, Period> d) {
    return std::chrono::steady_clock::now() +
           std::chrono::ceil<std::chrono::steady_clock::duration>(d);
  }

  // What the destructor does: a started pipeline is stopped (cancel) and joined.
  void shut_down() noexcept {
    if (state_ && state_->core.started() && !state_->core.joined()) {
      state_->core.ctl().stop();
      finish_threads();
    }
  }

  // Joins every thread, then accounts for whatever is still inside as cancelled.
  void finish_threads() {
    state& st = *state_;
    if (st.core.joined()) return;
    st.core.join();
    after_join(std::make_index_sequence<n_stages>{});
    drain_rings(std::make_index_sequence<n_rings>{});
    if constexpr (service) st.tickets->settle_rest(st.core.ctl());
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
          while (auto e = ring.take_any()) state_->core.ctl().cancel(e->items());
        }(),
        ...);
  }

  detail::box<state> state_;
};

template <class... Bound>
pipeline(chain<Bound...>) -> pipeline<chain<Bound...>>;
template <class... Bound>
pipeline(chain<Bound...>, pipeline_options) -> pipeline<chain<Bound...>>;

}  // namespace conveyor
