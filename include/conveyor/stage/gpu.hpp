// conveyor/stage/gpu.hpp: the GPU segment — stage-in, H2D copy, compute, D2H copy,
// stage-out — over N lanes, each with its own stream and its own staging slots.
//
//   using R = conveyor::cuda::runtime;                  // or conveyor::host::runtime
//   auto model = conveyor::gpu<R, std::uint8_t, float>(
//       {.lanes = 2, .in_elems = 64 * 784, .out_elems = 64 * 10},
//       [](std::vector<image>& b, R::pinned_span<std::uint8_t> dst) {   // prepare, straight
//         return fill(b, dst);  /* elements written */ },                //   into pinned memory
//       [&](conveyor::lane_batch<R, std::uint8_t, float>& l) {           // enqueue on l.stream
//         mlp.forward(l.in, l.out, l.items, l.stream, l.lane);
//         return l.items * 10;  /* output elements to copy back */ },
//       [](std::vector<image>&& b, R::pinned_span<const float> scores) { // read the result
//         return top1(b, scores); });
//
// Reads like the serial loop it replaces — prepare, copy, model, copy back — but each
// lane thread only *enqueues* work on its stream and moves on: while lane 0's kernels run,
// lane 1's batch is being copied in and the next batch is being prepared into a free
// slot. A slot (pinned in, device in, device out, pinned out) is reused only after the
// stream work behind its last use completed (slot_pool). Stage-in writes straight into
// the pinned slot (no extra host copy), and transfers take only pinned memory.
// Results leave in input order. Per batch, timing events on the lane's stream measure
// H2D, compute and D2H; the union of compute intervals over all lanes is the GPU busy time.
// The host work around them is timed too (the report's lane table and the verdict read it):
// stage-in on the lane thread, stage-out on the completion thread (its wall time and its
// thread CPU time: a stage-out that waits is not one that more cores would speed up).
//
// Threads: per lane, one thread that prepares and enqueues and one that waits for the
// batch's last event and runs stage-out. Both wait asleep by default (gpu_options::waiting:
// event_wait::block), leaving their cores to the CPU stages; event_wait::spin polls
// instead, a core per lane thread, for the last microseconds of latency. The report's
// lane table shows the CPU time the lane threads used. The compute functor is called on the lane
// thread (it must only enqueue work on l.stream); stage-in and stage-out run concurrently
// on different lanes, so they must be safe for that.
//
// Compute that waits: anything in it that waits for the device holds the lane thread
// until the stream drains, so the lane never has a second batch queued. With Thrust:
//   - thrust::cuda::par_nosync(alloc).on(l.stream) keeps an algorithm asynchronous; the
//     default policy (thrust::device) and par.on(stream) synchronize after it;
//   - alloc: an allocator over memory made before the run (sort, unique, copy_if,
//     reduce_by_key, ... take temporary storage; without one it comes from cudaMalloc and
//     cudaFree, and cudaFree waits for the whole device);
//   - calls that return a value to the host (reduce, count, find, min_element, equal, ...)
//     wait whatever the policy: keep their result on the device and read it in stage-out.
// conveyor_models::thrust_topk (src/models) is a per-row top-k written this way. Each
// batch records how long the compute call took (lane_report::enqueue_s) and whether the
// stream was already idle when it returned (drained_batches); the verdict names lanes
// whose calls last as long as the device's work.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/base/thread_group.hpp"
#include "conveyor/counters/lane_stats.hpp"
#include "conveyor/counters/nvtx.hpp"
#include "conveyor/ring/spsc_ring.hpp"
#include "conveyor/runtime/concepts.hpp"
#include "conveyor/runtime/event_clock.hpp"
#include "conveyor/runtime/event_timing.hpp"
#include "conveyor/runtime/slot_pool.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/envelope.hpp"
#include "conveyor/stage/detail/link.hpp"
#include "conveyor/stage/detail/reorder_buffer.hpp"
#include "conveyor/stage/detail/worker_probe.hpp"

namespace conveyor {

struct gpu_options {
  std::size_t lanes = 2;           // streams working at once
  std::size_t slots_per_lane = 2;  // staging slots per lane: 2 = prepare one while one runs
  std::size_t in_elems = 0;        // capacity of a slot's input, in elements (required)
  std::size_t out_elems = 0;       // capacity of a slot's output, in elements (required)
  std::string name = "gpu";
  // How the lane threads wait for a batch's events and for a free slot (see event_wait).
  event_wait waiting = event_wait::block;
  // The devices the lanes run on: lane l on devices[l % devices.size()]. Each lane's
  // stream, events and slots are made on its device, and both its threads bind it
  // (R::set_device) before any work. Empty: the device current on the thread that
  // builds the pipeline.
  std::vector<int> devices = {};
};

// What the compute functor gets for one batch.
template <class R, class InElem, class OutElem>
struct lane_batch {
  typename R::stream_ref stream;                      // enqueue everything here
  std::size_t lane;                                   // 0 .. lanes-1 (per-lane handles)
  std::size_t items;                                  // items in the batch
  int device;                                         // the lane's device (bound already)
  typename R::template device_span<const InElem> in;  // what stage-in wrote, on the device
  typename R::template device_span<OutElem> out;      // the slot's whole output capacity
};

template <class R, class InElem, class OutElem, class StageIn, class Compute, class StageOut>
class gpu_stage {
 public:
  using pinned_in = typename R::template pinned_span<InElem>;
  using pinned_out = typename R::template pinned_span<const OutElem>;

  template <class In>
  static constexpr bool accepts =
      std::is_invocable_r_v<std::size_t, StageIn&, In&, pinned_in> &&
      std::is_invocable_r_v<std::size_t, Compute&, lane_batch<R, InElem, OutElem>&> &&
      std::is_invocable_v<StageOut&, In&&, pinned_out>;
  template <class In>
  using output = std::decay_t<std::invoke_result_t<StageOut&, In&&, pinned_out>>;

  gpu_stage(gpu_options o, StageIn in, Compute c, StageOut out)
      : options_(std::move(o)),
        stage_in_(std::move(in)),
        compute_(std::move(c)),
        stage_out_(std::move(out)) {}

  // How each lane's stream is made (default: R::stream{}). The host runtime's jitter
  // mode goes here: .streams([](std::size_t lane) { return host::stream{host::jitter{lane, 20us}}; })
  gpu_stage& streams(std::function<typename R::stream(std::size_t lane)> f) & {
    make_stream_ = std::move(f);
    return *this;
  }
  gpu_stage&& streams(std::function<typename R::stream(std::size_t lane)> f) && {
    make_stream_ = std::move(f);
    return std::move(*this);
  }

  const gpu_options& options() const noexcept { return options_; }
  StageIn& stage_in() noexcept { return stage_in_; }
  Compute& compute() noexcept { return compute_; }
  StageOut& stage_out() noexcept { return stage_out_; }
  typename R::stream make_stream(std::size_t lane) const {
    return make_stream_ ? make_stream_(lane) : typename R::stream{};
  }

 private:
  gpu_options options_;
  StageIn stage_in_;
  Compute compute_;
  StageOut stage_out_;
  std::function<typename R::stream(std::size_t)> make_stream_;
};

template <class R, class InElem, class OutElem = InElem, class StageIn, class Compute,
          class StageOut>
gpu_stage<R, InElem, OutElem, std::decay_t<StageIn>, std::decay_t<Compute>, std::decay_t<StageOut>>
gpu(gpu_options options, StageIn&& stage_in, Compute&& compute, StageOut&& stage_out) {
  static_assert(runtime<R>,
                "conveyor::gpu: R must be a runtime (conveyor::cuda::runtime or "
                "conveyor::host::runtime)");
  return {std::move(options), std::forward<StageIn>(stage_in), std::forward<Compute>(compute),
          std::forward<StageOut>(stage_out)};
}

namespace detail {

template <class R, class InElem, class OutElem, class StageIn, class Compute, class StageOut,
          class In>
class gpu_node {
  using stage_t = gpu_stage<R, InElem, OutElem, StageIn, Compute, StageOut>;
  using pool_t = slot_pool<R, InElem, OutElem>;
  using slot_t = typename pool_t::slot;

 public:
  using out_type = typename stage_t::template output<In>;

  gpu_node(stage_t stage, control& ctl, link<In>* in, link<out_type>* out)
      : stage_(std::move(stage)),
        ctl_(ctl),
        in_(in),
        stats_((validate(stage_.options()), stage_.options().lanes)),
        gpu_(stage_.options().lanes),
        reorder_(
            next_power_of_two(2 * stage_.options().lanes * stage_.options().slots_per_lane + 8),
            out, ctl) {
    const gpu_options& o = stage_.options();
    lanes_.reserve(o.lanes);
    ring_name_ = ring_track_name(o.name);
    for (std::size_t l = 0; l < o.lanes; ++l) {
      // Everything of the lane is made on its device (the guard restores this thread's).
      const int dev = o.devices.empty() ? R::current_device() : o.devices[l % o.devices.size()];
      const device_scope on{dev};
      lanes_.push_back(std::make_unique<lane>(stage_.make_stream(l), o, dev));
      // Per lane, three tracks: the stream (batch > H2D, compute, D2H, in device time),
      // the enqueue thread (stage-in, enqueue) and the completion thread (stage-out).
      const std::string lane_name = o.name + " lane " + std::to_string(l);
      lanes_.back()->device_track = ctl_.make_track(lane_name);
      lanes_.back()->enqueue_track = ctl_.make_track(lane_name + " enqueue");
      lanes_.back()->complete_track = ctl_.make_track(lane_name + " complete");
    }
    std::vector<int> lane_devices;
    for (const auto& l : lanes_) lane_devices.push_back(l->device);
    gpu_.set_devices(lane_devices);
    ctl_.on_stop([this] {
      for (auto& l : lanes_) {
        l->pool.close();
        l->done.close();
      }
      reorder_.wake();
    });
  }

  stage_info info() {
    stage_info i{stage_.options().name, stage_kind::gpu, in_->capacity(), &stats_};
    i.gpu = &gpu_;
    i.runtime = R::name;
    return i;
  }

  // After join: batches enqueued but never completed, and results held back for order,
  // are cancelled.
  void after_join() noexcept {
    for (auto& l : lanes_)
      while (auto f = l->done.try_pop()) ctl_.cancel(f->batch.items());
    ctl_.cancel(reorder_.discard());
  }
  metrics::gpu_stats& gpu() noexcept { return gpu_; }

  void start(thread_group& threads) {
    may_expire_ = ctl_.has_tickets();                       // set up by now
    live_.store(lanes_.size(), std::memory_order_relaxed);  // relaxed: before spawn
    for (std::size_t l = 0; l < lanes_.size(); ++l) {
      anchor(*lanes_[l]);
      spawn_stage_thread(threads, [this, l] { enqueue_loop(l); });
      spawn_stage_thread(threads, [this, l] { complete_loop(l); });
    }
  }

 private:
  // A batch between its enqueue and its stage-out.
  struct in_flight {
    envelope<In> batch;
    slot_t* slot = nullptr;
    std::size_t position = 0;  // input order, for the reorder buffer
    std::size_t in_count = 0, out_count = 0;
    std::int64_t stage_in_ns = 0;  // how long stage-in took (0 with metrics off)
    std::int64_t enqueue_ns = 0;   // how long the compute call took (0 with metrics off)
    bool drained = false;          // the stream had no work left when compute returned
  };

  struct lane {
    lane(typename R::stream s, const gpu_options& o, int dev)
        : device(dev),
          pool(o.slots_per_lane, o.in_elems, o.out_elems, o.waiting),
          done(next_power_of_two(o.slots_per_lane)),
          stream(std::move(s)) {
      timing.reserve(o.slots_per_lane);
      for (std::size_t i = 0; i < o.slots_per_lane; ++i) timing.emplace_back(o.waiting);
    }
    int device;
    pool_t pool;
    spsc_ring<in_flight> done;  // enqueue thread -> completion thread, in stream order
    // Four timing events per slot: before H2D, after H2D, after compute, after D2H.
    struct events {
      explicit events(event_wait w)
          : e{typename R::event{event_timing::enabled, w},
              typename R::event{event_timing::enabled, w},
              typename R::event{event_timing::enabled, w},
              typename R::event{event_timing::enabled, w}} {}
      typename R::event e[4];
    };
    std::vector<events> timing;
    event_clock<typename R::event> clock;  // event times -> now_ns(), re-anchored each second
    metrics::trace_track* device_track = nullptr;  // nullptr: no trace
    metrics::trace_track* enqueue_track = nullptr;
    metrics::trace_track* complete_track = nullptr;
    // Last member, so destroyed first: the stream finishes its queued copies before the
    // slot memory they write goes away.
    typename R::stream stream;
  };

  static void validate(const gpu_options& o) {
    CONVEYOR_EXPECTS(o.lanes >= 1 && o.lanes <= 64,
                     "gpu '" + o.name + "': lanes must be in [1, 64], got " +
                         std::to_string(o.lanes) + "; 2-4 lanes usually saturate one GPU");
    CONVEYOR_EXPECTS(o.slots_per_lane >= 1 && o.slots_per_lane <= 64,
                     "gpu '" + o.name + "': slots_per_lane must be in [1, 64], got " +
                         std::to_string(o.slots_per_lane) + "; 2 overlaps preparing and running");
    CONVEYOR_EXPECTS(o.in_elems >= 1 && o.out_elems >= 1,
                     "gpu '" + o.name +
                         "': set in_elems and out_elems to the largest batch's "
                         "input and output element counts");
    for (const int d : o.devices)
      CONVEYOR_EXPECTS(d >= 0 && d < R::device_count(),
                       "gpu '" + o.name + "': device " + std::to_string(d) + " requested but " +
                           std::to_string(R::device_count()) + " answer (" + std::string(R::name) +
                           " runtime); list devices in [0, device_count())");
  }

  // Pins a lane's event clock to the host clock; the completion thread then moves the
  // anchor to a batch's last event about once a second (event_clock::advance).
  static void anchor(lane& l) { l.clock.anchor(l.stream.ref()); }

  static std::int64_t to_ns(const lane& l, const typename R::event& e) { return l.clock.to_ns(e); }

  // Charges the CPU time its lane thread used since the last charge to the lane's
  // counters: one clock read of the thread's CPU time per batch, with metrics on (a
  // reading taken anyway can be charged instead: charge(now)).
  struct cpu_meter {
    explicit cpu_meter(metrics::lane_stats* l) noexcept
        : lane(l), last(l != nullptr ? thread_cpu_ns() : 0) {}
    void charge() noexcept {
      if (lane != nullptr) charge(thread_cpu_ns());
    }
    void charge(std::int64_t now) noexcept {
      lane->add_cpu_ns(now - last);
      last = now;
    }
    metrics::lane_stats* lane;  // nullptr: not measured
    std::int64_t last;
  };

  // Sets the calling thread's current device for the scope, then restores it.
  struct device_scope {
    explicit device_scope(int dev) : previous(R::current_device()) { R::set_device(dev); }
    ~device_scope() {
      try {
        R::set_device(previous);
      } catch (...) {  // the previous device was valid a moment ago; nothing to do
      }
    }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;
    int previous;
  };

  // A lane thread's first act: its device. false (the failure recorded): the lane cannot
  // run, the pipeline stops.
  bool bind(const lane& l) noexcept {
    try {
      R::set_device(l.device);
      return true;
    } catch (...) {
      ctl_.fail_current(stage_.options().name, stage_error::no_item, 0);
      return false;
    }
  }

  void enqueue_loop(std::size_t index) noexcept {
    ctl_.await_gate();
    lane& l = *lanes_[index];
    if (!bind(l)) {
      l.done.close();
      return;
    }
    worker_probe probe{ctl_, stats_, index, l.enqueue_track, "enqueue", ring_name_.c_str()};
    cpu_meter cpu{ctl_.metrics_on ? &gpu_.lane(index) : nullptr};
    auto stream = l.stream.ref();
    for (;;) {
      std::size_t pos = 0;
      auto b = probe.pop(*in_, &pos);
      cpu.charge();  // the previous batch's work, and this wait
      if (!b) break;
      probe.occupancy(*in_);
      if (ctl_.is_stopping() || !reorder_.admit(pos)) {
        ctl_.cancel(b->items());
        break;
      }
      // A service's items whose deadline passed do not go to the GPU (see drop_expired()).
      if (may_expire_ && drop_expired(ctl_, stats_, *b) == 0) {
        reorder_.skip(pos);
        continue;
      }
      const std::uint64_t items = b->items();
      slot_t* s = nullptr;
      try {
        s = l.pool.acquire();  // waits until the slot's last stream use completed
      } catch (...) {          // that wait rethrows a failure of the lane's stream
        probe.blocked();
        if (!ctl_.fail_items(stage_.options().name, stats_, b->metas, items)) break;
        reorder_.skip(pos);  // the batch failed alone
        continue;
      }
      probe.blocked();
      if (!s) {
        ctl_.cancel(items);
        break;
      }
      in_flight f{std::move(*b), s, pos, 0, 0, 0, 0};
      try {
        const std::int64_t in_start = probe.mark_ns();  // the mark blocked() just set
        {
          metrics::nvtx_range range{"stage-in"};
          f.in_count = stage_.stage_in()(f.batch.value, s->pinned_in);
        }
        probe.busy("stage-in");
        f.stage_in_ns = probe.mark_ns() - in_start;
        check_count("stage-in wrote", f.in_count, s->pinned_in.size());
        // NVTX ranges around the enqueue calls: Nsight Systems projects them onto the
        // stream work they launched, so the GPU rows carry the trace's phase names.
        auto& ev = l.timing[s->index].e;
        {
          metrics::nvtx_range range{"H2D"};
          ev[0].record(stream);
          copy_async(s->device_in.subspan(0, f.in_count), s->pinned_in.subspan(0, f.in_count),
                     stream);
          ev[1].record(stream);
        }
        lane_batch<R, InElem, OutElem> lb{
            stream, index, items, l.device, s->device_in.subspan(0, f.in_count), s->device_out};
        {
          metrics::nvtx_range range{"compute"};
          const std::int64_t enqueue_start = probe.on() ? now_ns() : 0;
          f.out_count = stage_.compute()(lb);
          if (probe.on()) {
            f.enqueue_ns = now_ns() - enqueue_start;
            // An enqueue-only compute returns with its kernels still queued or running;
            // one that waited for the device returns to an idle stream.
            f.drained = stream.query();
          }
        }
        check_count("compute returned", f.out_count, s->device_out.size());
        {
          metrics::nvtx_range range{"D2H"};
          ev[2].record(stream);
          copy_async(s->pinned_out.subspan(0, f.out_count), s->device_out.subspan(0, f.out_count),
                     stream);
          ev[3].record(stream);
        }
      } catch (...) {
        probe.busy();
        release_after_stream(l, s);  // copies already enqueued may still use the slot
        if (!ctl_.fail_items(stage_.options().name, stats_, f.batch.metas, items)) break;
        reorder_.skip(pos);  // the batch failed alone
        continue;
      }
      probe.busy();
      probe.items(items);
      if (!l.done.push(std::move(f))) {  // closed: stopping
        ctl_.cancel(items);
        break;
      }
      probe.blocked();
    }
    cpu.charge();
    l.done.close();
  }

  void complete_loop(std::size_t index) noexcept {
    ctl_.await_gate();
    lane& l = *lanes_[index];
    if (!bind(l)) {
      if (live_.fetch_sub(1, std::memory_order_acq_rel) == 1) reorder_.close_output();
      return;
    }
    const bool measure = ctl_.metrics_on;
    metrics::trace_track* const device_track = measure ? l.device_track : nullptr;
    metrics::trace_track* const complete_track = measure ? l.complete_track : nullptr;
    cpu_meter cpu{measure ? &gpu_.lane(index) : nullptr};
    // The thread's CPU clock is read twice per batch, around stage-out: the meter takes
    // both readings (the waits before stage-out go to the first, stage-out to the second).
    while (auto f = l.done.pop()) {
      const std::uint64_t items = f->batch.items();
      if (ctl_.is_stopping()) {
        release_after_stream(l, f->slot);  // its stream work may still run: reuse after it
        ctl_.cancel(items);
        continue;
      }
      auto& ev = l.timing[f->slot->index].e;
      std::optional<envelope<out_type>> out;
      meta_list metas = std::move(f->batch.metas);  // the envelope's, unless stage-out throws
      try {
        ev[3].synchronize();  // the batch's last stream work; rethrows a stream failure
        const std::int64_t out_start = measure ? now_ns() : 0;
        const std::int64_t out_cpu = measure ? thread_cpu_ns() : 0;
        if (measure) cpu.charge(out_cpu);
        {
          metrics::nvtx_range range{"stage-out"};
          out.emplace(envelope<out_type>{
              stage_.stage_out()(
                  std::move(f->batch.value),
                  typename stage_t::pinned_out(f->slot->pinned_out.subspan(0, f->out_count))),
              std::move(metas)});
        }
        if (measure) {
          const std::int64_t out_end = now_ns();
          const std::int64_t out_cpu_end = thread_cpu_ns();
          cpu.charge(out_cpu_end);
          if (complete_track != nullptr) complete_track->span("stage-out", out_start, out_end);
          metrics::batch_timing t;
          t.items = items;
          t.h2d = {to_ns(l, ev[0]), to_ns(l, ev[1])};
          t.compute = {t.h2d.end_ns, to_ns(l, ev[2])};
          t.d2h = {t.compute.end_ns, to_ns(l, ev[3])};
          l.clock.advance(ev[3], t.d2h.end_ns);  // ev[3] is rerecorded only after release
          t.h2d_bytes = f->in_count * sizeof(InElem);
          t.d2h_bytes = f->out_count * sizeof(OutElem);
          t.stage_in_ns = f->stage_in_ns;
          t.enqueue_ns = f->enqueue_ns;
          t.drained = f->drained;
          t.stage_out_ns = out_end - out_start;
          t.stage_out_cpu_ns = out_cpu_end - out_cpu;
          gpu_.record_batch(index, t);
          if (device_track != nullptr) {
            // Parent first: the batch spans its three phases, which follow each other.
            device_track->span("batch", t.h2d.start_ns, t.d2h.end_ns);
            device_track->span("H2D", t.h2d);
            device_track->span("compute", t.compute);
            device_track->span("D2H", t.d2h);
          }
        }
      } catch (...) {
        release_after_stream(l, f->slot);  // a failed stream may not have reached the end
        if (!ctl_.fail_items(stage_.options().name, stats_, metas, items)) break;
        reorder_.skip(f->position);  // the batch failed alone
        continue;
      }
      l.pool.release(f->slot);  // stage-out has read pinned_out; every stream use is done
      reorder_.deposit(f->position, std::move(*out));
    }
    // acq_rel: the last completion thread closes the ring behind the segment after every
    // lane's deposits (release by each, acquire by the last).
    cpu.charge();
    if (live_.fetch_sub(1, std::memory_order_acq_rel) == 1) reorder_.close_output();
  }

  // Returns a slot whose stream work may still be queued: reusable once the stream gets
  // past this point. If the stream has failed, recording throws; the slot then stays
  // out of circulation (the pipeline is stopping), and its memory outlives the stream,
  // which the lane destroys first.
  static void release_after_stream(lane& l, slot_t* s) noexcept {
    try {
      l.pool.release(s, l.stream);
    } catch (...) {
    }
  }

  void check_count(const char* what, std::size_t n, std::size_t capacity) const {
    if (n > capacity)
      throw config_error("gpu '" + stage_.options().name + "': " + what + " " + std::to_string(n) +
                         " elements but a slot holds " + std::to_string(capacity) +
                         "; raise in_elems/out_elems or use smaller batches");
  }

  stage_t stage_;
  control& ctl_;
  link<In>* in_;
  metrics::stage_stats stats_;  // one "worker" per lane: its enqueue thread
  metrics::gpu_stats gpu_;
  std::string ring_name_;  // the trace counter of the input ring
  reorder_buffer<out_type> reorder_;
  std::vector<std::unique_ptr<lane>> lanes_;
  bool may_expire_ = false;  // a service's items carry deadlines (set in start())
  std::atomic<std::size_t> live_{0};
};

}  // namespace detail
}  // namespace conveyor
