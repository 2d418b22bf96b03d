// benchmarks/bench_inference.cpp: end-to-end inference — uint8 images, CPU preprocessing,
// an MLP with argmax on the device, labels back — as the loops people write and as a
// conveyor pipeline, on the same model, in one binary.
//
//   ./bench_inference                                      # everything, ~3 min on 2 cores (host)
//   ./bench_inference --benchmark_filter=conveyor          # the pipeline only
//   ./bench_inference --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// The runtime is chosen at start: conveyor::cuda::runtime with conveyor_models::mlp
// (cuBLAS) when a CUDA device answers, else conveyor::host::runtime with
// conveyor_models::cpu_mlp (the CPU reference run on host streams) at small sizes. The
// context block says which ("runtime"), with the sizes.
//
// Peers, all on `items` images per iteration (names start with the runtime):
//   serial           per image: prepare -> H2D -> classify (normalize, MLP, argmax) -> D2H -> sync
//   batched          the same per batch of B images
//   thread_queue     a producer thread prepares batches into a bounded mutex + condvar
//                    queue; the calling side copies, classifies and syncs each on one
//                    stream: what people write first (1 producer, 1 stream)
//   thread_queue/producers:W/streams:L  the fair peer: the same queue with W producer
//                    threads (conveyor's prepare workers) and L consumer threads, each with
//                    its own stream, staging buffers and model lane (conveyor's lanes)
//   .../staging:pageable  each loop again, staging through pageable memory (std::vector)
//                    instead of pinned buffers: its copies wait for the stream, as CUDA's
//                    from and to pageable memory do (on the host runtime, emulated: sync,
//                    then memcpy on the calling thread). conveyor's transfers take only
//                    pinned memory, so it has no such row: these show what that is worth.
//   conveyor/lanes:L source | map(prepare).workers(W).ordered() | batch(B) | gpu segment
//                    with L lanes (2 slots each) | unbatch | sink, L = 1..4
//   conveyor/wait:block|spin  the default configuration with lane threads that wait
//                    asleep (gpu_options::waiting, the default) or spin; counter
//                    lane_cpu_per_lane: the lane threads' CPU time / wall, per lane
// Sweeps at equal resources (2 lanes / 2 streams):
//   conveyor/batch:B/workers:W  and  thread_queue/batch:B/workers:W/streams:2 (W
//                      producers), B = 1, 4, 16, 64, 256, 1024, W = 1, 2, 4: throughput
//   conveyor/paced/batch:B/load:F  latency under paced arrivals: the source emits at F
//                      (0.25, 0.5, 0.75, 0.95) x the default pipeline's flood throughput,
//                      batch(B).max_delay(2 ms); P50/P95/P99 from each item's due time to
//                      the sink, offered and achieved items/s (see paced())
//   conveyor/graphs:off|on/batch:B  (CUDA) B = 1, 2, 4, 8, 16: the model replays a
//                      captured CUDA graph per batch bucket, or launches each kernel;
//                      counters graph_replays / _misses / _captures / _evictions
//   conveyor/precision:P, conveyor/model:wide/precision:P  (CUDA) the GEMMs at fp32,
//                      tf32, fp16, bf16, on the default and on the compute-bound model
//   conveyor/labels:kernel|thrust  (CUDA) the default configuration, its labels by the
//                      argmax kernel or by conveyor_models::thrust_topk (Thrust on the lane's
//                      stream, par_nosync over a per-lane arena)
//   conveyor/normalize:cpu  prepare normalizes on the CPU and the pipeline ships floats
//                      (4 bytes a pixel) instead of bytes normalized by a device kernel
// Configurations bound elsewhere than the CPU, each beside the thread_queue loop on the
// same work, as written first and at equal threads (thread_queue/model:wide[/producers:W/
// streams:2], thread_queue/frames[/streams:L]), the frames also beside
// by_hand/frames: L threads over L streams with two slots each, no rings, no metrics (the
// least any pipeline of that work does: what it reaches is this machine's practical bound):
//   conveyor/model:wide  the same images through a much wider MLP (compute-bound)
//   conveyor/frames    frames already in host memory (a pool used round robin, as decoded
//                      video would be), copied by stage-in straight into the pinned slot,
//                      through a light model, over 8 lanes on CUDA (4 on the host): meant
//                      to be transfer-bound, if the lanes' copies into pinned memory
//                      outrun PCIe (stage_stage_in against stage_h2d says whether they do).
//                      The pool (64 MiB on CUDA) is larger than the caches: each copy
//                      reads DRAM while the H2D DMA reads it too.
//   conveyor/frames/pool:hot  the same with a pool of 16 frames (4 MiB), in the caches, as
//                      a decoder's last few outputs would be
// The bandwidth probe, for the transfer stage's goodput as a ratio:
//   bandwidth/h2d:pinned, bandwidth/d2h:pinned   copy_async of 2 x 8 MiB (host) or
//                    2 x 64 MiB (CUDA) between pinned and device buffers, synchronized
//   bandwidth/h2d:pageable, bandwidth/d2h:pageable  the same to and from a std::vector,
//                    with the loops' pageable copies
//
// Counters:
//   items_per_second   wall clock (UseRealTime); pipeline construction is not timed
//                      (on CUDA it makes the lanes' cuBLAS handles)
//   gpu_busy_fraction  conveyor: the report's union of the lanes' compute intervals / wall;
//                      loops: their classify time (timing events around it) / wall
//   stage_<s>_items_per_second  each stage of the configuration measured alone in the same
//                      run, just before the timed loop, as the pipeline runs it: prepare on
//                      its W workers at once, stage-in (the copy into pinned slots) on its L
//                      lane threads at once, then h2d, compute and d2h each alone with
//                      batches spread over the L lanes' streams, and postprocess
//   ideal_items_per_second  the slowest of those: no pipeline of these stages goes faster.
//                      The loops get the bound of the pipeline's configuration.
//   efficiency         items_per_second / ideal_items_per_second
//   latency_p50_ms, latency_p95_ms, latency_p99_ms  conveyor: item latency (source -> sink)
//                      from the report (flooded: mostly queueing); paced rows: see above
//   h2d_goodput_bytes_per_second  conveyor: the lanes' H2D bytes / the run's wall time;
//                      compare with bandwidth/h2d:pinned's bytes_per_second (same run)
//   h2d_bytes_per_second  conveyor: the same bytes / the lanes' time in H2D (copy speed)
//   bytes_per_second   bandwidth probes
// CONVEYOR_BENCH_REPORTS=1 prints each conveyor row's last report to stderr.
// JSON: --benchmark_out=inf.json --benchmark_out_format=json; a short table of it:
// python3 benchmarks/summarize.py inf.json.
// On the host runtime the "device" is CPU threads too, so on 2 cores prepare and the
// model compete for the same cores and efficiency cannot reach 1; the figure says how
// much of the stage bound survives that. Every label is checked against the serial
// peer's labels (on the host runtime: exactly; on a GPU a near-tie may flip between
// batch shapes, counted in labels_differ).
//
// Thread-safety: a benchmark binary; each benchmark owns its pipeline and buffers.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor_models/graph_cache.hpp"
#include "conveyor_models/model.hpp"
#include "conveyor_models/reference.hpp"

namespace {

namespace cm = conveyor_models;
using clock_type = std::chrono::steady_clock;

struct config {
  cm::mlp_shape shape;
  std::size_t batch = 32;             // B
  std::size_t items = 2000;           // per iteration
  std::size_t workers = 2;            // W: prepare workers in the pipeline
  int prepare_rounds = 8;             // CPU preprocessing cost per image
  std::size_t copy_bytes = 8u << 20;  // per copy of the bandwidth probe
  // The compute-bound configuration (conveyor/model:wide): the same images through a
  // wider MLP, so the device is the slowest stage.
  std::size_t wide_hidden = 512;
  // The transfer-bound configuration (conveyor/frames): frames already in host memory (a
  // pool, as decoded video or a capture ring), copied by stage-in straight into the pinned
  // slot, through a model so light that the H2D copy is the slowest stage.
  std::size_t frame_bytes = 16u << 10;
  std::size_t frame_pool = 64;     // distinct frames, used round robin: more than the caches hold
  std::size_t frame_pool_hot = 8;  // conveyor/frames/pool:hot: a few frames, in the caches
  std::size_t frame_batch = 16;
  std::size_t frame_lanes = 4;  // stage-in copies on each lane's thread: lanes copy at once
  cm::mlp_shape frame_shape() const {
    return {.input = frame_bytes, .hidden = 16, .layers = 2, .classes = 10};
  }
  cm::mlp_shape wide_shape() const {
    return {.input = shape.input,
            .hidden = wide_hidden,
            .layers = shape.layers,
            .classes = shape.classes};
  }
};

constexpr std::size_t sweep_batches[] = {1, 4, 16, 64, 256, 1024};
constexpr std::size_t max_batch = 1024;  // the largest batch any benchmark uses

// One configuration of the pipeline.
struct run_opts {
  std::size_t lanes = 2;
  std::size_t batch = 0;    // 0: the config's
  std::size_t workers = 0;  // 0: the config's
  bool graphs = false;      // CUDA: the model with cuda_graphs
  // normalize in prepare and ship floats (else bytes, normalized on the device)
  bool cpu_normalize = false;
  bool wide = false;                         // the compute-bound model (config::wide_shape)
  cm::precision prec = cm::precision::fp32;  // CUDA: the GEMMs' precision
  conveyor::event_wait waiting = conveyor::event_wait::block;  // how the lane threads wait
  cm::label_method labels = cm::label_method::kernel;          // CUDA: argmax kernel or Thrust

  // Which model the run uses (bench_env::model_for).
  auto model_key() const { return std::tuple{wide, graphs, prec, labels}; }
};

// A prepared image: pixels as bytes, or (normalized on the CPU) as floats.
template <class Elem>
struct prepared {
  std::uint64_t id;
  std::vector<Elem> px;
};
using image = prepared<std::uint8_t>;
struct label {
  std::uint64_t id;
  std::uint32_t cls;
};

// CPU preprocessing: "decode" (deterministic pixels), then `rounds` passes of a 3-tap blur.
void prepare_into(std::uint64_t id, std::uint8_t* out, std::size_t n, int rounds,
                  std::vector<std::uint8_t>& tmp) {
  tmp.resize(n);
  cm::make_pixels(id, std::span(out, n));
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned a = out[i == 0 ? 0 : i - 1], c = out[i], b = out[i + 1 == n ? i : i + 1];
      tmp[i] = static_cast<std::uint8_t>((a + 2 * c + b) / 4);
    }
    std::memcpy(out, tmp.data(), n);
  }
}

image prepare(std::uint64_t id, const config& c) {
  image im{id, std::vector<std::uint8_t>(c.shape.input)};
  thread_local std::vector<std::uint8_t> tmp;
  prepare_into(id, im.px.data(), c.shape.input, c.prepare_rounds, tmp);
  return im;
}

// prepare, then normalize on the CPU (what the model's kernel does on the device).
template <class Elem>
prepared<Elem> prepare_as(std::uint64_t id, const config& c) {
  if constexpr (std::is_same_v<Elem, std::uint8_t>) {
    return prepare(id, c);
  } else {
    const image im = prepare(id, c);
    prepared<float> out{id, std::vector<float>(c.shape.input)};
    cm::normalize_ref(im.px, out.px, cm::normalize_params{});
    return out;
  }
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Where a loop stages its batches on the host: pinned buffers (what conveyor's slots
// are), or pageable ones (a std::vector: what a loop written without pinning uses).
enum class staging { pinned, pageable };

// Copies between pageable memory and the device, as CUDA makes them ("API
// synchronization behavior" in the CUDA runtime docs): from pageable memory the call
// synchronizes the stream, then returns once the bytes are staged; to pageable memory it
// returns once the copy completed. Either way the calling thread waits, and nothing it
// does overlaps the stream. The host runtime is made to do the same: wait for the stream,
// then memcpy on the calling thread. Conveyor's transfers take only pinned spans, so
// these live here, for the loops it is compared with.
template <class T>
void pageable_h2d(conveyor::host::device_span<T> dst, const T* src, conveyor::host::stream& s) {
  s.synchronize();
  std::memcpy(dst.unsafe_host().data(), src, dst.size_bytes());
}
template <class T>
void pageable_d2h(T* dst, std::type_identity_t<conveyor::host::device_span<const T>> src,
                  conveyor::host::stream& s) {
  s.synchronize();
  std::memcpy(dst, src.unsafe_host().data(), src.size_bytes());
}
#if CONVEYOR_HAS_CUDA
template <class T>
void pageable_h2d(conveyor::cuda::device_span<T> dst, const T* src, conveyor::cuda::stream& s) {
  CONVEYOR_CUDA_TRY(
      cudaMemcpyAsync(dst.data(), src, dst.size_bytes(), cudaMemcpyHostToDevice, s.native()));
}
template <class T>
void pageable_d2h(T* dst, std::type_identity_t<conveyor::cuda::device_span<const T>> src,
                  conveyor::cuda::stream& s) {
  CONVEYOR_CUDA_TRY(
      cudaMemcpyAsync(dst, src.data(), src.size_bytes(), cudaMemcpyDeviceToHost, s.native()));
}
#endif

// One synchronous device step: B images in host staging memory (pinned or pageable) ->
// labels in host staging memory of the same kind. Elem: uint8 pixels (the model
// normalizes on the device) or normalized floats.
template <class R, class Elem = std::uint8_t>
struct device_step {
  device_step(std::size_t batch, std::size_t n)
      : in(batch * n),
        d_in(batch * n),
        d_out(batch),
        out(batch),
        pageable_in(batch * n),
        pageable_out(batch),
        n_(n) {}

  // Where a loop writes a batch's images, and reads its labels after run().
  Elem* host_in(staging st) { return st == staging::pinned ? in.data() : pageable_in.data(); }
  const std::uint32_t* host_out(staging st) const {
    return st == staging::pinned ? out.data() : pageable_out.data();
  }

  // Enqueue one device stage for `items` images (pinned memory on the host side); nothing
  // waits, nothing is timed: the stage-bound probe calls each back to back, alone.
  void enqueue_h2d(std::size_t items) {
    copy_async(d_in.span().subspan(0, items * n_), in.span().subspan(0, items * n_), s);
  }
  template <class Model>
  void enqueue_classify(Model& model, std::size_t items, std::size_t lane) {
    model.classify(d_in.span().subspan(0, items * n_), d_out.span(), items, s, lane);
  }
  void enqueue_d2h(std::size_t items) {
    copy_async(out.span().subspan(0, items), d_out.span().subspan(0, items), s);
  }

  // Copies `items` images in from host_in(st), classifies them, copies the labels back to
  // host_out(st) and waits. The classify step is timed by events on the stream: its time
  // adds up in compute_s (the GPU's busy time, for the loops' gpu_busy_fraction).
  template <class Model>
  void run(Model& model, std::size_t items, std::size_t lane, staging st = staging::pinned) {
    const auto d_in_used = d_in.span().subspan(0, items * n_);
    if (st == staging::pinned)
      copy_async(d_in_used, in.span().subspan(0, items * n_), s);
    else
      pageable_h2d(d_in_used, pageable_in.data(), s);
    compute_start.record(s);
    model.classify(d_in_used, d_out.span(), items, s, lane);
    compute_end.record(s);
    if (st == staging::pinned)
      copy_async(out.span().subspan(0, items), d_out.span().subspan(0, items), s);
    else
      pageable_d2h(pageable_out.data(), d_out.span().subspan(0, items), s);
    s.synchronize();
    compute_s += static_cast<double>(elapsed_ms(compute_start, compute_end)) * 1e-3;
  }

  typename R::stream s;
  typename R::template pinned_buffer<Elem> in;
  typename R::template device_buffer<Elem> d_in;
  typename R::template device_buffer<std::uint32_t> d_out;
  typename R::template pinned_buffer<std::uint32_t> out;
  std::vector<Elem> pageable_in;
  std::vector<std::uint32_t> pageable_out;
  typename R::event compute_start{conveyor::event_timing::enabled};
  typename R::event compute_end{conveyor::event_timing::enabled};
  double compute_s = 0;  // classify time of every run() so far
  std::size_t n_;
};

// The stage bound of one configuration: each stage measured alone, now, in items per
// second, the way the pipeline runs it (prepare on its W workers at once, stage-in on its
// L lane threads at once, each device stage alone with batches spread over the L lanes'
// streams). The pipeline can go no faster than its slowest stage: ideal().
struct stage_rates {
  double prepare = 0, stage_in = 0, h2d = 0, compute = 0, d2h = 0, post = 0;  // 0: no such stage

  std::array<std::pair<double, const char*>, 6> named() const {
    return {{{prepare, "prepare"},
             {stage_in, "stage_in"},
             {h2d, "h2d"},
             {compute, "compute"},
             {d2h, "d2h"},
             {post, "postprocess"}}};
  }
  double ideal() const {
    double slowest = 1e300;
    for (const auto& [rate, name] : named())
      if (rate > 0) slowest = std::min(slowest, rate);
    return slowest;
  }
};

// Items per second of `threads` threads, started together, each calling fn(thread, i) for
// i < per_thread; the fastest of `repeats` (other work on the cores only ever slows a
// probe), with untimed() called before each. W workers are not W times one: cores share
// caches, memory and, in a VM, often a physical core (SMT), so a stage that runs on W
// threads is measured on W threads.
template <class Fn, class Untimed = void (*)()>
double parallel_rate(
    std::size_t threads, std::size_t per_thread, int repeats, Fn fn, Untimed untimed = [] {}) {
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    untimed();
    std::atomic<std::size_t> ready{0};
    std::atomic<bool> go{false};
    clock_type::time_point t0;
    {
      std::vector<std::jthread> pool;
      for (std::size_t t = 0; t < threads; ++t)
        // A start gate, not a hand-off: what fn touches was made before the threads (their
        // creation orders it) and is read after the joins, so relaxed counting suffices
        // for "all are waiting"; a worker starts once it sees `go`, stored after t0 was
        // taken (release/acquire: nothing relies on more than that value).
        pool.emplace_back([&, t] {
          ready.fetch_add(1, std::memory_order_relaxed);
          while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
          for (std::size_t i = 0; i < per_thread; ++i) fn(t, i);
        });
      while (ready.load(std::memory_order_relaxed) < threads) std::this_thread::yield();
      t0 = clock_type::now();
      go.store(true, std::memory_order_release);
    }  // joins
    best = std::max(best, static_cast<double>(threads * per_thread) / seconds_since(t0));
  }
  return best;
}

// The three device stages of `batch` images (or frames) each, as the pipeline runs them:
// batches spread over `lanes` lanes (each its own stream, buffers and model lane), back
// to back, one wait at the end (a wait per batch would add a host round trip that a
// pipeline hides). H2D, classify and D2H each alone, in items per second; the fastest of
// 5. `input` holds one batch, copied into every lane's pinned buffer first.
template <class R, class Elem, class Model>
void device_rates(stage_rates& r, Model& m, std::size_t batch, std::size_t n, std::size_t lanes,
                  const Elem* input) {
  std::vector<std::unique_ptr<device_step<R, Elem>>> steps;
  for (std::size_t l = 0; l < lanes; ++l) {
    steps.push_back(std::make_unique<device_step<R, Elem>>(batch, n));
    std::copy_n(input, batch * n, steps[l]->in.data());
    steps[l]->run(m, batch, l);  // warm: binds model lane l to this stream (graphs: captures)
  }
  const std::size_t batches = std::max<std::size_t>(4 * lanes, 1024 / batch);
  const double items = static_cast<double>(batches) * static_cast<double>(batch);
  auto rate = [&](auto&& enqueue_on) {
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = clock_type::now();
      for (std::size_t b = 0; b < batches; ++b) enqueue_on(*steps[b % lanes], b % lanes);
      for (auto& st : steps) st->s.synchronize();
      best = std::max(best, items / seconds_since(t0));
    }
    return best;
  };
  r.h2d = rate([&](device_step<R, Elem>& st, std::size_t) { st.enqueue_h2d(batch); });
  r.compute =
      rate([&](device_step<R, Elem>& st, std::size_t l) { st.enqueue_classify(m, batch, l); });
  r.d2h = rate([&](device_step<R, Elem>& st, std::size_t) { st.enqueue_d2h(batch); });
}

// Postprocess: the sink stores a label per item.
inline double post_rate() {
  constexpr std::size_t probe = 4096;
  std::vector<std::uint32_t> labels(probe);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = clock_type::now();
    for (std::size_t i = 0; i < probe; ++i) labels[i] = static_cast<std::uint32_t>(i) ^ 1u;
    benchmark::DoNotOptimize(labels.data());
    best = std::max(best, static_cast<double>(probe) / seconds_since(t0));
  }
  return best;
}

// Everything one runtime's benchmarks share: the models (lanes 0..3 for the pipeline and
// the device probes, each binding them to its own streams; 4 for the loops) and the serial
// peer's labels to check against.
template <class R>
struct bench_env {
  static constexpr std::size_t max_lanes = 4;
  explicit bench_env(const config& c)
      : cfg(c), model(options(c.shape, max_batch, false)), step(max_batch, c.shape.input) {
    expected.resize(c.items);
    for (std::uint64_t id = 0; id < c.items; ++id) {  // one at a time, as the serial peer
      prepare_into(id, step.in.data(), c.shape.input, c.prepare_rounds, tmp);
      step.run(model, 1, max_lanes);
      expected[id] = step.out.data()[0];
    }
  }

  static cm::mlp_options options(const cm::mlp_shape& shape, std::size_t max_items, bool graphs,
                                 cm::precision prec = cm::precision::fp32,
                                 cm::label_method labels = cm::label_method::kernel) {
    return {.shape = shape,
            .prec = prec,
            .lanes = max_lanes + 1,
            .max_items = max_items,
            .cuda_graphs = graphs,
            .labels = labels};
  }
  using model_key = decltype(run_opts{}.model_key());
  // The model a run uses: the default one (fp32, no graphs, the config's shape), or one
  // made on first use for another (wide, graphs, precision), with its labels computed in
  // batches of the configuration's size (the pipeline's shape) by the loops' lane.
  cm::model_t<R>& model_for(const run_opts& o) {
    if (o.model_key() == run_opts{}.model_key()) return model;
    auto& m = others_[o.model_key()];
    if (!m.model) {
      m.model = std::make_unique<cm::model_t<R>>(
          options(o.wide ? cfg.wide_shape() : cfg.shape, max_batch, o.graphs, o.prec, o.labels));
      m.expected.resize(cfg.items);
      for (std::uint64_t first = 0; first < cfg.items; first += cfg.batch) {
        const std::size_t b = std::min<std::size_t>(cfg.batch, cfg.items - first);
        for (std::size_t i = 0; i < b; ++i)
          prepare_into(first + i, step.in.data() + i * cfg.shape.input, cfg.shape.input,
                       cfg.prepare_rounds, tmp);
        step.run(*m.model, b, max_lanes);
        std::copy_n(step.out.data(), b, m.expected.begin() + static_cast<std::ptrdiff_t>(first));
      }
    }
    return *m.model;
  }
  const std::vector<std::uint32_t>& expected_for(const run_opts& o) {
    if (o.model_key() == run_opts{}.model_key()) return expected;
    model_for(o);
    return others_[o.model_key()].expected;
  }

  // The bound for the image pipeline with batches of `batch`, `workers` prepare workers,
  // `lanes` lanes and Elem inputs (floats: normalized in prepare, 4 bytes a pixel over the
  // copy), on the model the run uses. The loops get the same bound (the pipeline's shape).
  // Measured once per configuration and kept: a pipeline row and its thread_queue peer
  // (and their repetitions) share it.
  template <class Elem = std::uint8_t>
  stage_rates bound(run_opts o = {}) {
    const std::size_t batch = o.batch != 0 ? o.batch : cfg.batch;
    const std::size_t workers = o.workers != 0 ? o.workers : cfg.workers;
    const auto key =
        std::tuple{std::is_same_v<Elem, float>, batch, workers, o.lanes, o.model_key()};
    if (const auto it = bounds_.find(key); it != bounds_.end()) return it->second;
    return bounds_[key] = measure_bound<Elem>(o, batch, workers);
  }
  template <class Elem>
  stage_rates measure_bound(const run_opts& o, std::size_t batch, std::size_t workers) {
    auto& m = model_for(o);
    const std::size_t n = cfg.shape.input;
    stage_rates r;
    // Each prepared item is kept, as in the pipeline, where it leaves the worker for the
    // rings: every item gets fresh memory. (Dropping it at once would hand the next item
    // the same hot allocation, which no worker in a pipeline gets.) The items are freed
    // outside the timed part, as other stages free them in the pipeline.
    constexpr std::size_t per_worker = 400;
    std::vector<std::vector<prepared<Elem>>> held(workers);
    r.prepare = parallel_rate(
        workers, per_worker, 5,
        [&](std::size_t t, std::size_t i) {
          held[t].push_back(prepare_as<Elem>(t * per_worker + i, cfg));
        },
        [&] {
          for (auto& h : held) {
            h.clear();
            h.reserve(per_worker);
          }
        });
    // Stage-in: each lane thread copies prepared items into its pinned slot.
    {
      std::vector<prepared<Elem>> items;
      for (std::size_t i = 0; i < batch; ++i) items.push_back(prepare_as<Elem>(i, cfg));
      std::vector<typename R::template pinned_buffer<Elem>> slots;
      for (std::size_t l = 0; l < o.lanes; ++l) slots.emplace_back(batch * n);
      r.stage_in = parallel_rate(o.lanes, 2048, 5, [&](std::size_t t, std::size_t i) {
        const std::size_t k = i % batch;
        std::memcpy(slots[t].data() + k * n, items[k].px.data(), n * sizeof(Elem));
      });
      std::vector<Elem> input(batch * n);
      for (std::size_t i = 0; i < batch; ++i)
        std::copy(items[i].px.begin(), items[i].px.end(), input.data() + i * n);
      device_rates<R>(r, m, batch, n, o.lanes, input.data());
    }
    r.post = post_rate();
    return r;
  }

  // The transfer-bound configuration's frames, their model, step and labels (first use).
  struct frames_env {
    frames_env(const config& c)
        : model(cm::mlp_options{
              .shape = c.frame_shape(), .lanes = c.frame_lanes + 1, .max_items = c.frame_batch}),
          step(c.frame_batch, c.frame_bytes),
          pool(c.frame_pool * c.frame_bytes),
          label(c.frame_pool) {
      for (std::size_t f = 0; f < c.frame_pool; ++f)
        cm::make_pixels(1000003 + f, std::span(pool.data() + f * c.frame_bytes, c.frame_bytes));
      for (std::size_t first = 0; first < c.frame_pool; first += c.frame_batch) {
        const std::size_t b = std::min(c.frame_batch, c.frame_pool - first);
        std::memcpy(step.in.data(), pool.data() + first * c.frame_bytes, b * c.frame_bytes);
        // the loops' lane: 0 .. frame_lanes - 1 are the pipeline's
        step.run(model, b, c.frame_lanes);
        std::copy_n(step.out.data(), b, label.begin() + static_cast<std::ptrdiff_t>(first));
      }
    }
    cm::model_t<R> model;
    device_step<R> step;
    std::vector<std::uint8_t> pool;    // pageable host memory, as a decoder's output would be
    std::vector<std::uint32_t> label;  // per frame of the pool
  };
  // pool: cfg.frame_pool (more than the caches hold) or cfg.frame_pool_hot (a few frames,
  // as a decoder's last outputs: in the CPU's caches).
  frames_env& frames(std::size_t pool) {
    auto& f = frames_[pool];
    if (!f) {
      config c = cfg;
      c.frame_pool = pool;
      f = std::make_unique<frames_env>(c);
    }
    return *f;
  }
  stage_rates frames_bound(std::size_t pool) {
    auto& f = frames(pool);
    const std::size_t fb = cfg.frame_bytes, lanes = cfg.frame_lanes;
    stage_rates r;
    std::vector<typename R::template pinned_buffer<std::uint8_t>> slots;
    for (std::size_t l = 0; l < lanes; ++l) slots.emplace_back(cfg.frame_batch * fb);
    // Each lane thread copies frames of its share of the pool, round robin, as the
    // pipeline's lanes do (together they sweep the whole pool).
    const std::size_t per_lane = std::max<std::size_t>(64, 4 * pool / lanes);
    r.stage_in = parallel_rate(lanes, per_lane, 5, [&](std::size_t t, std::size_t i) {
      const std::size_t frame = (t * pool / lanes + i) % pool;
      std::memcpy(slots[t].data() + (i % cfg.frame_batch) * fb, f.pool.data() + frame * fb, fb);
    });
    std::vector<std::uint8_t> input(cfg.frame_batch * fb);
    for (std::size_t i = 0; i < cfg.frame_batch; ++i)
      std::memcpy(input.data() + i * fb, f.pool.data() + (i % pool) * fb, fb);
    device_rates<R>(r, f.model, cfg.frame_batch, fb, lanes, input.data());
    r.post = post_rate();
    return r;
  }

  // Counters every peer sets; false (and the benchmark skipped) when a label is wrong.
  // timed_s: the timed part of every iteration, as the framework's real time counts it;
  // compute_s (the loops; negative: not given): the device's classify time within it.
  bool finish(benchmark::State& state, const stage_rates& bound, double timed_s,
              const std::vector<std::uint32_t>& got, const std::vector<std::uint32_t>& want,
              double compute_s = -1) {
    const auto items = state.iterations() * static_cast<std::int64_t>(got.size());
    state.SetItemsProcessed(items);
    const double ideal = bound.ideal();
    state.counters["ideal_items_per_second"] = ideal;
    for (const auto& [rate, name] : bound.named())
      if (rate > 0) state.counters[std::string("stage_") + name + "_items_per_second"] = rate;
    if (timed_s > 0) state.counters["efficiency"] = static_cast<double>(items) / timed_s / ideal;
    if (timed_s > 0 && compute_s >= 0) state.counters["gpu_busy_fraction"] = compute_s / timed_s;
    std::size_t differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    state.counters["labels_differ"] = static_cast<double>(differ);
    if (differ != 0 && std::string_view(R::name) == "host") {
      state.SkipWithError("labels differ from the serial loop's on the host runtime");
      return false;
    }
    return true;
  }

  config cfg;
  cm::model_t<R> model;  // the default: fp32, no graphs, cfg.shape
  struct other_model {
    std::unique_ptr<cm::model_t<R>> model;
    std::vector<std::uint32_t> expected;  // its labels, batch by batch
  };
  std::map<model_key, other_model> others_;  // made on first use
  device_step<R> step;
  std::map<std::size_t, std::unique_ptr<frames_env>> frames_;  // by pool size; made on first use
  std::map<std::tuple<bool, std::size_t, std::size_t, std::size_t, model_key>, stage_rates> bounds_;
  std::vector<std::uint32_t> expected;  // the serial peer's labels
  std::vector<std::uint8_t> tmp;
};

// The loops stage through env.step's host buffers of kind `st`, and run the device step
// on lane max_lanes (a handle of its own). Their GPU busy fraction is the classify time
// the step's events measured over the timed wall time (one stream: no overlap to merge).
template <class R>
void serial(benchmark::State& state, bench_env<R>& env, staging st) {
  const config& c = env.cfg;
  const stage_rates bound = env.bound();
  std::vector<std::uint32_t> got(c.items);
  double timed_s = 0;
  env.step.compute_s = 0;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    for (std::uint64_t id = 0; id < c.items; ++id) {
      const image im = prepare(id, c);
      std::memcpy(env.step.host_in(st), im.px.data(), c.shape.input);
      env.step.run(env.model, 1, bench_env<R>::max_lanes, st);
      got[id] = env.step.host_out(st)[0];
    }
    timed_s += seconds_since(t0);
  }
  env.finish(state, bound, timed_s, got, env.expected, env.step.compute_s);
}

template <class R>
void batched(benchmark::State& state, bench_env<R>& env, staging st) {
  const config& c = env.cfg;
  const stage_rates bound = env.bound();
  std::vector<std::uint32_t> got(c.items);
  double timed_s = 0;
  env.step.compute_s = 0;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    for (std::uint64_t first = 0; first < c.items; first += c.batch) {
      const std::size_t b = std::min<std::size_t>(c.batch, c.items - first);
      for (std::size_t i = 0; i < b; ++i) {
        const image im = prepare(first + i, c);
        std::memcpy(env.step.host_in(st) + i * c.shape.input, im.px.data(), c.shape.input);
      }
      env.step.run(env.model, b, bench_env<R>::max_lanes, st);
      std::copy_n(env.step.host_out(st), b, got.begin() + static_cast<std::ptrdiff_t>(first));
    }
    timed_s += seconds_since(t0);
  }
  env.finish(state, bound, timed_s, got, env.expected, env.step.compute_s);
}

// The hand-written overlap: `producers` threads make batches of items (produce(id)) —
// producer p batches p, p + P, p + 2P, ... — into one bounded mutex + condvar queue; one
// consumer thread per step (each step its own stream, staging buffers and model lane)
// takes a batch, stages it (stage(item, dst)) into its step's host buffer, copies,
// classifies, copies back and waits. One producer and one step is what people write
// first; the fair peer of a pipeline has as many producers as its prepare workers and as
// many steps as its lanes. The queue holds 2 batches per thread at its ends (4 at least).
template <class R, class Model, class Produce, class Stage>
void thread_queue_loop(benchmark::State& state, bench_env<R>& env, staging st, Model& model,
                       const std::vector<device_step<R>*>& steps,
                       const std::vector<std::size_t>& lanes, std::size_t producers,
                       std::size_t batch, const std::vector<std::uint32_t>& want,
                       const stage_rates& bound, Produce produce, Stage stage) {
  using item_t = std::invoke_result_t<Produce&, std::uint64_t>;
  using batch_t = std::vector<std::pair<std::uint64_t, item_t>>;
  const std::size_t items = want.size(), batches = (items + batch - 1) / batch;
  const std::size_t depth = std::max<std::size_t>(4, 2 * (producers + steps.size()));
  std::vector<std::uint32_t> got(items);
  double timed_s = 0;
  for (device_step<R>* s : steps) s->compute_s = 0;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    std::mutex m;
    std::condition_variable cv;
    std::deque<batch_t> q;
    std::size_t producing = producers;  // producers not done yet
    {
      std::vector<std::jthread> threads;
      for (std::size_t p = 0; p < producers; ++p)
        threads.emplace_back([&, p] {
          for (std::size_t k = p; k < batches; k += producers) {
            batch_t b;
            for (std::uint64_t id = k * batch; id < std::min<std::uint64_t>((k + 1) * batch, items);
                 ++id)
              b.emplace_back(id, produce(id));
            std::unique_lock lock{m};
            cv.wait(lock, [&] { return q.size() < depth; });
            q.push_back(std::move(b));
            cv.notify_all();
          }
          std::lock_guard lock{m};
          --producing;
          cv.notify_all();
        });
      for (std::size_t c = 0; c < steps.size(); ++c)
        threads.emplace_back([&, c] {
          device_step<R>& step = *steps[c];
          const std::size_t n = step.n_;
          for (;;) {
            batch_t b;
            {
              std::unique_lock lock{m};
              cv.wait(lock, [&] { return producing == 0 || !q.empty(); });
              if (q.empty()) return;
              b = std::move(q.front());
              q.pop_front();
              cv.notify_all();
            }
            for (std::size_t i = 0; i < b.size(); ++i) stage(b[i].second, step.host_in(st) + i * n);
            step.run(model, b.size(), lanes[c], st);
            for (std::size_t i = 0; i < b.size(); ++i) got[b[i].first] = step.host_out(st)[i];
          }
        });
    }  // joins
    timed_s += seconds_since(t0);
  }
  // One stream: its classify time over the wall time is the GPU's busy fraction. Several
  // overlap, and their sum says nothing of the union: no figure.
  env.finish(state, bound, timed_s, got, want, steps.size() == 1 ? steps[0]->compute_s : -1);
}

// A fair peer's own steps (streams, staging buffers), one per lane 0 .. n - 1, each run
// once untimed to bind its model lane, as a pipeline's lanes are made before its run.
template <class R, class Model>
struct peer_steps {
  peer_steps(Model& model, std::size_t n, std::size_t batch, std::size_t elems,
             const std::uint8_t* first) {
    for (std::size_t l = 0; l < n; ++l) {
      owned.push_back(std::make_unique<device_step<R>>(batch, elems));
      std::copy_n(first, elems, owned.back()->in.data());
      owned.back()->run(model, 1, l);
      steps.push_back(owned.back().get());
      lanes.push_back(l);
    }
  }
  std::vector<std::unique_ptr<device_step<R>>> owned;
  std::vector<device_step<R>*> steps;
  std::vector<std::size_t> lanes;
};

// The image work (o.wide: on the compute-bound model). streams 0: what people write
// first: one producer, and the loops' step (lane max_lanes); else o.workers producers
// (the config's when 0) and `streams` steps of their own on lanes 0 .. streams - 1.
template <class R>
void thread_queue(benchmark::State& state, bench_env<R>& env, staging st, run_opts o = {},
                  std::size_t streams = 0) {
  const config& c = env.cfg;
  auto& model = env.model_for(o);
  const std::size_t batch = o.batch != 0 ? o.batch : c.batch;
  auto produce = [&c](std::uint64_t id) { return prepare(id, c).px; };
  auto stage = [&c](const std::vector<std::uint8_t>& px, std::uint8_t* dst) {
    std::memcpy(dst, px.data(), c.shape.input);
  };
  const std::vector<std::uint32_t>& want = env.expected_for(o);
  if (streams == 0) {
    thread_queue_loop(state, env, st, model, {&env.step}, {bench_env<R>::max_lanes}, 1, batch, want,
                      env.bound(o), produce, stage);
    return;
  }
  o.lanes = streams;  // the bound of the pipeline with as many lanes
  const std::vector<std::uint8_t> px = prepare(0, c).px;
  peer_steps<R, cm::model_t<R>> peer(model, streams, batch, c.shape.input, px.data());
  thread_queue_loop(state, env, st, model, peer.steps, peer.lanes,
                    o.workers != 0 ? o.workers : c.workers, batch, want, env.bound(o), produce,
                    stage);
}

// The transfer-bound frames: the producer only passes frame ids (the frames exist); the
// copy into the staging buffer is the work, on the consumer thread. streams 0: one
// consumer on the frames' loop step; else `streams` consumers with steps of their own (as
// the pipeline's lanes copy on theirs).
template <class R>
void thread_queue_frames(benchmark::State& state, bench_env<R>& env, std::size_t pool,
                         std::size_t streams = 0) {
  const config& c = env.cfg;
  auto& f = env.frames(pool);
  std::vector<std::uint32_t> want(c.items);
  for (std::size_t id = 0; id < c.items; ++id) want[id] = f.label[id % pool];
  auto produce = [](std::uint64_t id) { return id; };
  auto stage = [&](std::uint64_t id, std::uint8_t* dst) {
    std::memcpy(dst, f.pool.data() + (id % pool) * c.frame_bytes, c.frame_bytes);
  };
  if (streams == 0) {
    thread_queue_loop(state, env, staging::pinned, f.model, {&f.step}, {c.frame_lanes}, 1,
                      c.frame_batch, want, env.frames_bound(pool), produce, stage);
    return;
  }
  peer_steps<R, cm::model_t<R>> peer(f.model, streams, c.frame_batch, c.frame_bytes, f.pool.data());
  thread_queue_loop(state, env, staging::pinned, f.model, peer.steps, peer.lanes, 1, c.frame_batch,
                    want, env.frames_bound(pool), produce, stage);
}

// The frames' work as a hand-tuned multi-stream loop, the floor of what any pipeline adds
// to it: L threads, each with its own stream (model lane t) and two slots; thread t takes
// batches t, t + L, t + 2L, ...: waits until its slot's last use completed and reads
// that batch's labels, copies the frames into the slot's pinned memory, enqueues H2D,
// classify and D2H, records the slot's event. No rings, no batching stage, no order
// restored, no metrics: the same stage-in, copies and model on the same lanes.
template <class R>
void by_hand_frames(benchmark::State& state, bench_env<R>& env, std::size_t pool) {
  const config& c = env.cfg;
  auto& f = env.frames(pool);
  const stage_rates bound = env.frames_bound(pool);
  const std::size_t fb = c.frame_bytes, per_batch = c.frame_batch, lanes = c.frame_lanes;
  const std::size_t batches = (c.items + per_batch - 1) / per_batch;
  std::vector<std::uint32_t> got(c.items), want(c.items);
  for (std::size_t id = 0; id < c.items; ++id) want[id] = f.label[id % pool];
  struct slot {
    slot(std::size_t b, std::size_t bytes) : in(b * bytes), d_in(b * bytes), d_out(b), out(b) {}
    typename R::template pinned_buffer<std::uint8_t> in;
    typename R::template device_buffer<std::uint8_t> d_in;
    typename R::template device_buffer<std::uint32_t> d_out;
    typename R::template pinned_buffer<std::uint32_t> out;
    typename R::event done{conveyor::event_timing::disabled};
    std::size_t first = 0, items = 0;  // the batch it holds (items 0: none)
  };
  struct lane {
    typename R::stream s;
    std::unique_ptr<slot> slots[2];
  };
  std::vector<std::unique_ptr<lane>> ls;
  auto enqueue = [&](lane& l, slot& sl, std::size_t t) {
    const std::size_t bytes = sl.items * fb;
    for (std::size_t i = 0; i < sl.items; ++i)
      std::memcpy(sl.in.data() + i * fb, f.pool.data() + ((sl.first + i) % pool) * fb, fb);
    copy_async(sl.d_in.span().subspan(0, bytes), sl.in.span().subspan(0, bytes), l.s);
    f.model.classify(sl.d_in.span().subspan(0, bytes), sl.d_out.span(), sl.items, l.s, t);
    copy_async(sl.out.span().subspan(0, sl.items), sl.d_out.span().subspan(0, sl.items), l.s);
    sl.done.record(l.s);
  };
  auto collect = [&](slot& sl) {
    sl.done.synchronize();
    for (std::size_t i = 0; i < sl.items; ++i) got[sl.first + i] = sl.out.data()[i];
    sl.items = 0;
  };
  for (std::size_t t = 0; t < lanes; ++t) {  // made and warmed untimed, as a pipeline's lanes
    ls.push_back(std::make_unique<lane>());
    for (auto& sl : ls[t]->slots) sl = std::make_unique<slot>(per_batch, fb);
    slot& warm = *ls[t]->slots[0];
    warm.items = std::min(per_batch, c.items);
    enqueue(*ls[t], warm, t);  // binds model lane t to this stream
    collect(warm);
  }
  double timed_s = 0;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    {
      std::vector<std::jthread> threads;
      for (std::size_t t = 0; t < lanes; ++t)
        threads.emplace_back([&, t] {
          lane& l = *ls[t];
          std::size_t k = 0;
          for (std::size_t b = t; b < batches; b += lanes, k ^= 1) {
            slot& sl = *l.slots[k];
            if (sl.items != 0) collect(sl);
            sl.first = b * per_batch;
            sl.items = std::min(per_batch, c.items - sl.first);
            enqueue(l, sl, t);
          }
          for (auto& sl : l.slots)
            if (sl->items != 0) collect(*sl);
        });
    }  // joins
    timed_s += seconds_since(t0);
  }
  env.finish(state, bound, timed_s, got, want);
}

// What the pipeline's report says: GPU busy (mean over the iterations), the last
// iteration's item latency, and its H2D traffic two ways: per second of the lanes' own
// H2D time (the copies' speed; concurrent copies on several lanes each count their own
// time) and per second of the run's wall time (the goodput: what the pipeline delivered).
// The source of the pipelines: item ids 0 .. c.items - 1.
inline auto ids(const config& c) {
  return conveyor::source([i = std::uint64_t{0}, &c]() mutable -> std::optional<std::uint64_t> {
    if (i == c.items) return std::nullopt;
    return i++;
  });
}

// What a pipeline row adds up over its iterations.
struct run_totals {
  double timed_s = 0;  // in run()
  double busy = 0;     // GPU busy fractions, summed
  conveyor::report last;
};

// Times p.run(); the caller pauses the framework's clock around the rest of the
// iteration (construction and destruction), this resumes it for the run alone.
template <class Pipeline>
void timed_run(benchmark::State& state, Pipeline& p, run_totals& t) {
  state.ResumeTiming();
  const auto t0 = clock_type::now();
  t.last = p.run();
  t.timed_s += seconds_since(t0);
  t.busy += t.last.gpu_busy_fraction;
  state.PauseTiming();
}

std::string current_row;  // the benchmark running now (State has no name in benchmark 1.7)

// The CUDA model's graph cache counters (cpu_mlp has none: all zero).
template <class Model>
cm::graph_cache_stats graph_stats_of(const Model& m) {
  if constexpr (requires { m.graph_stats(); })
    return m.graph_stats();
  else
    return {};
}

// A row's graph replays, misses, captures and evictions (the model outlives its rows).
inline void graph_counters(benchmark::State& state, const cm::graph_cache_stats& before,
                           const cm::graph_cache_stats& after) {
  if (after.hits + after.misses == before.hits + before.misses) return;  // graphs off
  state.counters["graph_replays"] = static_cast<double>(after.hits - before.hits);
  state.counters["graph_misses"] = static_cast<double>(after.misses - before.misses);
  state.counters["graph_captures"] = static_cast<double>(after.captures - before.captures);
  state.counters["graph_evictions"] = static_cast<double>(after.evictions - before.evictions);
}

// With CONVEYOR_BENCH_REPORTS=1 in the environment the last iteration's report is printed
// to stderr too (which stage was busy, starved or blocked, the verdict).
inline void report_counters(benchmark::State& state, double busy_sum,
                            const conveyor::report& last) {
  if (const char* e = std::getenv("CONVEYOR_BENCH_REPORTS");
      e != nullptr && std::string_view(e) == "1")
    std::cerr << "\n" << current_row << ":\n" << last << std::flush;
  state.counters["gpu_busy_fraction"] =
      busy_sum / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["latency_p50_ms"] = last.item_latency.p50_s * 1e3;
  state.counters["latency_p95_ms"] = last.item_latency.p95_s * 1e3;
  state.counters["latency_p99_ms"] = last.item_latency.p99_s * 1e3;
  double h2d_bytes = 0, h2d_s = 0;
  for (const auto& l : last.lanes) {
    h2d_bytes += static_cast<double>(l.h2d_bytes);
    h2d_s += l.h2d_s;
  }
  if (h2d_s > 0) state.counters["h2d_bytes_per_second"] = h2d_bytes / h2d_s;
  if (last.wall_s > 0) state.counters["h2d_goodput_bytes_per_second"] = h2d_bytes / last.wall_s;
  // CPU the lane threads used (both of each lane) over the run's wall time, per lane: near
  // 0 while they wait asleep, near 2 when both spin through the run.
  double lane_cpu_s = 0;
  for (const auto& l : last.lanes) lane_cpu_s += l.cpu_s;
  if (!last.lanes.empty() && last.wall_s > 0)
    state.counters["lane_cpu_per_lane"] =
        lane_cpu_s / last.wall_s / static_cast<double>(last.lanes.size());
}

template <class R, class Elem>
void pipelined_as(benchmark::State& state, bench_env<R>& env, run_opts o) {
  using item_t = prepared<Elem>;
  const config& c = env.cfg;
  const std::size_t lanes = o.lanes;
  const std::size_t batch = o.batch != 0 ? o.batch : c.batch;
  const std::size_t workers = o.workers != 0 ? o.workers : c.workers;
  const stage_rates bound = env.template bound<Elem>(o);
  const std::size_t n = c.shape.input;
  auto& model = env.model_for(o);
  const auto graphs_before = graph_stats_of(model);
  std::vector<std::uint32_t> got(c.items);
  run_totals runs;
  for (auto _ : state) {
    // Construction (streams, slots, on CUDA cuBLAS handles) and destruction (freeing the
    // slots: the frames' pipeline has 128 MiB of them pinned) are not timed, as an
    // application makes its pipeline once; run() is.
    state.PauseTiming();
    {
      auto segment = conveyor::gpu<R, Elem, std::uint32_t>(
          {.lanes = lanes,
           .slots_per_lane = 2,
           .in_elems = batch * n,
           .out_elems = batch,
           .name = "mlp",
           .waiting = o.waiting},
          [n](std::vector<item_t>& b, typename R::template pinned_span<Elem> dst) {
            for (std::size_t i = 0; i < b.size(); ++i)
              std::memcpy(dst.data() + i * n, b[i].px.data(), n * sizeof(Elem));
            return b.size() * n;
          },
          [&model](conveyor::lane_batch<R, Elem, std::uint32_t>& l) {
            model.classify(l.in, l.out, l.items, l.stream, l.lane);
            return l.items;
          },
          [](std::vector<item_t>&& b, typename R::template pinned_span<const std::uint32_t> cls) {
            std::vector<label> out;
            out.reserve(b.size());
            for (std::size_t i = 0; i < b.size(); ++i) out.push_back({b[i].id, cls[i]});
            return out;
          });
      segment.streams(cm::lane_streams<R>(model));
      conveyor::pipeline p{
          ids(c) |
          conveyor::map([&c](std::uint64_t id) { return prepare_as<Elem>(id, c); })
              .workers(workers)
              .ordered()
              .name("prepare") |
          conveyor::batch(batch) | std::move(segment) | conveyor::unbatch() |
          conveyor::sink([&got](label l) { got[l.id] = l.cls; }).name("postprocess")};
      timed_run(state, p, runs);
    }  // p and the segment go here, untimed
    state.ResumeTiming();
  }
  report_counters(state, runs.busy, runs.last);
  graph_counters(state, graphs_before, graph_stats_of(model));
  env.finish(state, bound, runs.timed_s, got, env.expected_for(o));
}

// The transfer-bound configuration: frame ids | batch | gpu segment whose stage-in copies
// each frame from the pool straight into the pinned slot (the one copy a frame in
// pageable memory needs) | unbatch | sink. No prepare stage: the frames exist.
template <class R>
void pipelined_frames(benchmark::State& state, bench_env<R>& env, std::size_t pool) {
  const config& c = env.cfg;
  auto& f = env.frames(pool);
  const stage_rates bound = env.frames_bound(pool);
  const std::size_t fb = c.frame_bytes;
  std::vector<std::uint32_t> got(c.items), want(c.items);
  for (std::size_t id = 0; id < c.items; ++id) want[id] = f.label[id % pool];
  run_totals runs;
  for (auto _ : state) {
    state.PauseTiming();  // construction and destruction are not timed (see pipelined_as)
    {
      auto segment = conveyor::gpu<R, std::uint8_t, std::uint32_t>(
          {.lanes = c.frame_lanes,
           .slots_per_lane = 2,
           .in_elems = c.frame_batch * fb,
           .out_elems = c.frame_batch,
           .name = "mlp"},
          [&](std::vector<std::uint64_t>& b, typename R::template pinned_span<std::uint8_t> dst) {
            for (std::size_t i = 0; i < b.size(); ++i)
              std::memcpy(dst.data() + i * fb, f.pool.data() + (b[i] % pool) * fb, fb);
            return b.size() * fb;
          },
          [&f](conveyor::lane_batch<R, std::uint8_t, std::uint32_t>& l) {
            f.model.classify(l.in, l.out, l.items, l.stream, l.lane);
            return l.items;
          },
          [](std::vector<std::uint64_t>&& b,
             typename R::template pinned_span<const std::uint32_t> cls) {
            std::vector<label> out;
            out.reserve(b.size());
            for (std::size_t i = 0; i < b.size(); ++i) out.push_back({b[i], cls[i]});
            return out;
          });
      segment.streams(cm::lane_streams<R>(f.model));
      conveyor::pipeline p{
          ids(c) | conveyor::batch(c.frame_batch) | std::move(segment) | conveyor::unbatch() |
          conveyor::sink([&got](label l) { got[l.id] = l.cls; }).name("postprocess")};
      timed_run(state, p, runs);
    }  // p and the segment go here, untimed
    state.ResumeTiming();
  }
  report_counters(state, runs.busy, runs.last);
  env.finish(state, bound, runs.timed_s, got, want);
}

template <class R>
void pipelined(benchmark::State& state, bench_env<R>& env, run_opts o) {
  if (o.cpu_normalize)
    pipelined_as<R, float>(state, env, o);
  else
    pipelined_as<R, std::uint8_t>(state, env, o);
}

// ---- latency under paced arrivals ---------------------------------------------------
// The rows above flood the pipeline (the source emits as fast as the rings take items),
// so their latency is mostly time queued behind earlier items. Here the source emits item
// i at start + i / offered (sleeping until then; a late source emits at once, its items
// keep their due time), and an item's latency is the sink's clock minus its due time:
// queueing before the source counts too. Batches are dynamic: batch(B).max_delay(2 ms).

double paced_seconds = 0.25;  // per iteration; main() sets it from --benchmark_min_time

struct paced_item {
  std::uint64_t id;
  std::int64_t due_ns;  // steady clock
};
struct paced_image {
  std::uint64_t id;
  std::int64_t due_ns;
  std::vector<std::uint8_t> px;
};
struct paced_label {
  std::uint64_t id;
  std::int64_t due_ns;
  std::uint32_t cls;
};

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch())
      .count();
}

// Builds the image pipeline of o over `items` paced items (offered items/s; 0: a flood)
// and runs it; sink(paced_label) gets every result. With a state, only run() is timed.
// Returns run()'s seconds.
template <class R, class Sink>
double run_paced(bench_env<R>& env, const run_opts& o, std::size_t items, double offered, Sink sink,
                 benchmark::State* state) {
  const config& c = env.cfg;
  const std::size_t n = c.shape.input, lanes = o.lanes;
  const std::size_t batch = o.batch != 0 ? o.batch : c.batch;
  const std::size_t workers = o.workers != 0 ? o.workers : c.workers;
  auto& model = env.model_for(o);
  auto segment = conveyor::gpu<R, std::uint8_t, std::uint32_t>(
      {.lanes = lanes,
       .slots_per_lane = 2,
       .in_elems = batch * n,
       .out_elems = batch,
       .name = "mlp"},
      [n](std::vector<paced_image>& b, typename R::template pinned_span<std::uint8_t> dst) {
        for (std::size_t i = 0; i < b.size(); ++i)
          std::memcpy(dst.data() + i * n, b[i].px.data(), n);
        return b.size() * n;
      },
      [&model](conveyor::lane_batch<R, std::uint8_t, std::uint32_t>& l) {
        model.classify(l.in, l.out, l.items, l.stream, l.lane);
        return l.items;
      },
      [](std::vector<paced_image>&& b, typename R::template pinned_span<const std::uint32_t> cls) {
        std::vector<paced_label> out;
        out.reserve(b.size());
        for (std::size_t i = 0; i < b.size(); ++i) out.push_back({b[i].id, b[i].due_ns, cls[i]});
        return out;
      });
  segment.streams(cm::lane_streams<R>(model));
  const double period_ns = offered > 0 ? 1e9 / offered : 0.0;
  conveyor::pipeline p{
      conveyor::source([i = std::uint64_t{0}, items, period_ns,
                        start = std::int64_t{0}]() mutable -> std::optional<paced_item> {
        if (i == items) return std::nullopt;
        if (i == 0) start = now_ns();
        const std::int64_t due =
            start + static_cast<std::int64_t>(static_cast<double>(i) * period_ns);
        if (const std::int64_t now = now_ns(); now < due)
          std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
        return paced_item{i++, period_ns > 0 ? due : now_ns()};
      }) |
      conveyor::map([&c](paced_item it) {
        paced_image im{it.id, it.due_ns, std::vector<std::uint8_t>(c.shape.input)};
        thread_local std::vector<std::uint8_t> tmp;
        // the config's images, again and again
        prepare_into(it.id % c.items, im.px.data(), c.shape.input, c.prepare_rounds, tmp);
        return im;
      })
          .workers(workers)
          .ordered()
          .name("prepare") |
      conveyor::batch(batch).max_delay(std::chrono::milliseconds(2)) | std::move(segment) |
      conveyor::unbatch() | conveyor::sink(std::move(sink)).name("postprocess")};
  if (state != nullptr) state->ResumeTiming();
  const auto t0 = clock_type::now();
  p.run();
  const double s = seconds_since(t0);
  if (state != nullptr) state->PauseTiming();
  return s;
}

// What the paced rows' loads are fractions of: the default pipeline's flood throughput,
// measured once (the better of two runs of the config's items).
template <class R>
double reference_rate(bench_env<R>& env) {
  static double rate = 0;
  if (rate == 0)
    for (int r = 0; r < 2; ++r) {
      const double s = run_paced(
          env, {}, env.cfg.items, 0.0, [](paced_label) {}, nullptr);
      rate = std::max(rate, static_cast<double>(env.cfg.items) / s);
    }
  return rate;
}

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

template <class R>
void paced(benchmark::State& state, bench_env<R>& env, run_opts o, double load) {
  const double offered = load * reference_rate(env);
  const auto items = static_cast<std::size_t>(std::max(64.0, offered * paced_seconds));
  std::vector<double> latency_ms;  // every item of every iteration
  std::vector<std::uint32_t> got(items);
  double timed_s = 0;
  for (auto _ : state) {
    state.PauseTiming();  // construction and destruction are not timed (see pipelined_as)
    timed_s += run_paced(
        env, o, items, offered,
        [&](paced_label l) {
          latency_ms.push_back(static_cast<double>(now_ns() - l.due_ns) * 1e-6);
          got[l.id] = l.cls;
        },
        &state);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(items));
  state.counters["load"] = load;
  state.counters["offered_items_per_second"] = offered;
  state.counters["achieved_items_per_second"] =
      static_cast<double>(state.iterations()) * static_cast<double>(items) / timed_s;
  state.counters["latency_p50_ms"] = percentile(latency_ms, 0.50);
  state.counters["latency_p95_ms"] = percentile(latency_ms, 0.95);
  state.counters["latency_p99_ms"] = percentile(latency_ms, 0.99);
  std::size_t differ = 0;
  const auto& want = env.expected_for(o);
  for (std::size_t i = 0; i < items; ++i) differ += got[i] != want[i % want.size()];
  state.counters["labels_differ"] = static_cast<double>(differ);
  if (differ != 0 && std::string_view(R::name) == "host")
    state.SkipWithError("labels differ from the serial loop's on the host runtime");
}

// Peak copy bandwidth between a host buffer (pinned, or pageable: a std::vector) and a
// device buffer of c.copy_bytes, in one direction: two copies on one stream, synchronized
// per pair. Pageable copies go through pageable_h2d / pageable_d2h, as the loops' do.
template <class R>
void bandwidth(benchmark::State& state, bench_env<R>& env, bool h2d, staging st) {
  const std::size_t bytes = env.cfg.copy_bytes;
  typename R::stream s;
  typename R::template pinned_buffer<std::byte> pinned(st == staging::pinned ? 2 * bytes : 1);
  std::vector<std::byte> pageable(st == staging::pageable ? 2 * bytes : 0, std::byte{1});
  typename R::template device_buffer<std::byte> dev(2 * bytes);
  if (st == staging::pinned) std::fill_n(pinned.data(), pinned.size(), std::byte{1});
  for (auto _ : state) {
    for (std::size_t k = 0; k < 2; ++k) {
      const auto d = dev.span().subspan(k * bytes, bytes);
      if (st == staging::pinned) {
        const auto p = pinned.span().subspan(k * bytes, bytes);
        if (h2d)
          copy_async(d, p, s);
        else
          copy_async(p, d, s);
      } else if (h2d) {
        pageable_h2d(d, pageable.data() + k * bytes, s);
      } else {
        pageable_d2h(pageable.data() + k * bytes, d, s);
      }
    }
    s.synchronize();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(2 * bytes));
}

template <class R>
void register_all(const config& c) {
  // Built on first use, after benchmark's own setup; lives until exit.
  static bench_env<R>* env = nullptr;
  auto get = [c]() -> bench_env<R>& {
    if (!env) env = new bench_env<R>(c);
    return *env;
  };
  const std::string rt{R::name};
  constexpr bool cuda = !std::is_same_v<R, conveyor::host::runtime>;
  auto add = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(),
                                 [fn, name](benchmark::State& s) {
                                   current_row = name;
                                   fn(s);
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  auto conveyor_run = [get, add](const std::string& name, run_opts o) {
    add(name, [get, o](benchmark::State& s) { pipelined<R>(s, get(), o); });
  };
  // The fair peer: as many producers as the pipeline's prepare workers, as many streams
  // (each a consumer thread) as its lanes.
  auto fair_peer = [get, add](const std::string& name, run_opts o, staging st = staging::pinned) {
    add(name, [get, o, st](benchmark::State& s) { thread_queue<R>(s, get(), st, o, o.lanes); });
  };
  const std::string fair = "/producers:" + std::to_string(c.workers) + "/streams:2";

  // The loops people write, pinned and pageable staging: serial, batched, and a producer
  // thread + queue (1 producer, 1 stream: what people write first), then the same queue
  // with the pipeline's threads (the fair peer).
  using loop_fn = void (*)(benchmark::State&, bench_env<R>&, staging);
  const std::pair<const char*, loop_fn> loops[] = {
      {"/serial", serial<R>},
      {"/batched", batched<R>},
      {"/thread_queue",
       [](benchmark::State& s, bench_env<R>& e, staging st) { thread_queue<R>(s, e, st); }}};
  for (const staging st : {staging::pinned, staging::pageable}) {
    const std::string suffix = st == staging::pageable ? "/staging:pageable" : "";
    for (const auto& [name, fn] : loops)
      add(rt + name + suffix, [get, fn, st](benchmark::State& s) { fn(s, get(), st); });
    fair_peer(rt + "/thread_queue" + fair + suffix, {}, st);
  }
  for (std::size_t lanes = 1; lanes <= bench_env<R>::max_lanes; ++lanes)
    conveyor_run(rt + "/conveyor/lanes:" + std::to_string(lanes), {.lanes = lanes});
  // The default (CPU-bound) configuration with lanes that wait asleep and that spin.
  for (const auto w : {conveyor::event_wait::block, conveyor::event_wait::spin})
    conveyor_run(rt + "/conveyor/wait:" + (w == conveyor::event_wait::block ? "block" : "spin"),
                 {.waiting = w});
  // The sweep at equal resources: batch x workers, conveyor and its fair peer side by side.
  for (const std::size_t b : sweep_batches)
    for (const std::size_t w : {1, 2, 4}) {
      const std::string at = "/batch:" + std::to_string(b) + "/workers:" + std::to_string(w);
      conveyor_run(rt + "/conveyor" + at, {.batch = b, .workers = w});
      fair_peer(rt + "/thread_queue" + at + "/streams:2", {.batch = b, .workers = w});
    }
  if constexpr (cuda) {
    // CUDA graphs where launch overhead matters: small batches.
    for (const std::size_t b : {1, 2, 4, 8, 16})
      for (const bool g : {false, true})
        conveyor_run(rt + "/conveyor/graphs:" + (g ? "on" : "off") + "/batch:" + std::to_string(b),
                     {.batch = b, .graphs = g});
    // The GEMMs' precision, on the default model and on the compute-bound one.
    for (const cm::precision p :
         {cm::precision::fp32, cm::precision::tf32, cm::precision::fp16, cm::precision::bf16}) {
      const std::string ps{cm::to_string(p)};
      conveyor_run(rt + "/conveyor/precision:" + ps, {.prec = p});
      conveyor_run(rt + "/conveyor/model:wide/precision:" + ps, {.wide = true, .prec = p});
    }
  }
  if constexpr (cuda) {
    // Labels by the argmax kernel (the default) or by the Thrust top-1 on the lane's
    // stream (par_nosync over a per-lane arena): the same labels, checked.
    conveyor_run(rt + "/conveyor/labels:kernel", {});
    conveyor_run(rt + "/conveyor/labels:thrust", {.labels = cm::label_method::thrust});
  }
  conveyor_run(rt + "/conveyor/normalize:cpu", {.cpu_normalize = true});
  // Latency against offered load: batch sizes x loads (fractions of the default
  // pipeline's flood throughput), paced arrivals, dynamic batching.
  for (const std::size_t b : sweep_batches)
    for (const double load : {0.25, 0.5, 0.75, 0.95}) {
      char name[96];
      std::snprintf(name, sizeof name, "%s/conveyor/paced/batch:%zu/load:%.2f", rt.c_str(), b,
                    load);
      add(name, [get, b, load](benchmark::State& s) { paced<R>(s, get(), {.batch = b}, load); });
    }
  // The compute-bound and the transfer-bound configurations, each beside the hand-written
  // thread + queue loop on the same work: as people write it first, and at equal threads.
  conveyor_run(rt + "/conveyor/model:wide", {.wide = true});
  add(rt + "/thread_queue/model:wide",
      [get](benchmark::State& s) { thread_queue<R>(s, get(), staging::pinned, {.wide = true}); });
  fair_peer(rt + "/thread_queue/model:wide" + fair, {.wide = true});
  for (const bool hot : {false, true}) {
    const std::size_t pool = hot ? c.frame_pool_hot : c.frame_pool;
    const std::string suffix = hot ? "/frames/pool:hot" : "/frames";
    add(rt + "/conveyor" + suffix,
        [get, pool](benchmark::State& s) { pipelined_frames<R>(s, get(), pool); });
    add(rt + "/thread_queue" + suffix,
        [get, pool](benchmark::State& s) { thread_queue_frames<R>(s, get(), pool); });
    add(rt + "/thread_queue" + suffix + "/streams:" + std::to_string(c.frame_lanes),
        [get, pool, l = c.frame_lanes](benchmark::State& s) {
          thread_queue_frames<R>(s, get(), pool, l);
        });
    add(rt + "/by_hand" + suffix,
        [get, pool](benchmark::State& s) { by_hand_frames<R>(s, get(), pool); });
  }
  for (const staging st : {staging::pinned, staging::pageable})
    for (const bool h2d : {true, false})
      add(rt + "/bandwidth/" + (h2d ? "h2d:" : "d2h:") +
              (st == staging::pinned ? "pinned" : "pageable"),
          [get, h2d, st](benchmark::State& s) { bandwidth<R>(s, get(), h2d, st); });
}

void add_context(const char* runtime, const config& c) {
  benchmark::AddCustomContext("runtime", runtime);
  benchmark::AddCustomContext(
      "workload", std::to_string(c.items) + " uint8 images of " + std::to_string(c.shape.input) +
                      " px per iteration; MLP " + std::to_string(c.shape.input) + "->" +
                      std::to_string(c.shape.hidden) + "x" + std::to_string(c.shape.layers - 1) +
                      "->" + std::to_string(c.shape.classes) + " fp32; batch " +
                      std::to_string(c.batch) + "; prepare workers " + std::to_string(c.workers) +
                      ", blur rounds " + std::to_string(c.prepare_rounds));
  double load[1] = {0};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load[0]) != 1) load[0] = -1;
    std::fclose(f);
  }
  benchmark::AddCustomContext("loadavg_1min_at_start", std::to_string(load[0]));
}

}  // namespace

int main(int argc, char** argv) {
  // The paced rows run paced_seconds of arrivals per iteration: --benchmark_min_time's
  // value within [0.02, 0.25] s, so that the smoke test (0.01) stays short.
  for (int i = 1; i < argc; ++i)
    if (const std::string_view a = argv[i]; a.starts_with("--benchmark_min_time="))
      paced_seconds = std::clamp(std::strtod(argv[i] + a.find('=') + 1, nullptr), 0.02, 0.25);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
#if CONVEYOR_HAS_CUDA
  if (conveyor::cuda::device_count() > 0) {
    const config c{.shape = {.input = 784, .hidden = 1024, .layers = 4, .classes = 10},
                   .batch = 256,
                   .items = 32768,
                   .workers = 4,
                   .prepare_rounds = 8,
                   .copy_bytes = std::size_t{64} << 20,
                   .wide_hidden = 8192,
                   .frame_bytes = std::size_t{256} << 10,
                   .frame_pool = 256,
                   .frame_pool_hot = 16,
                   .frame_batch = 32,
                   .frame_lanes = 8};
    add_context("cuda (conveyor_models::mlp, cuBLAS)", c);
    register_all<conveyor::cuda::runtime>(c);
  } else
#endif
  {
    const config c{.shape = {.input = 256, .hidden = 128, .layers = 3, .classes = 10},
                   .batch = 32,
                   .items = 4096,
                   .workers = 2,
                   .prepare_rounds = 8,
                   .wide_hidden = 512,
                   .frame_bytes = std::size_t{16} << 10,
                   .frame_pool = 64,
                   .frame_batch = 16};
    add_context("host (no GPU: conveyor_models::cpu_mlp on host streams)", c);
    register_all<conveyor::host::runtime>(c);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
