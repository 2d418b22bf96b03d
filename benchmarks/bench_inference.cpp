// benchmarks/bench_inference.cpp: end-to-end inference — uint8 images, CPU preprocessing,
// an MLP with argmax on the device, labels back — as the loops people write and as a
// conveyor pipeline, on the same model, in one binary.
//
//   ./bench_inference                                      # everything, ~1 min on 2 cores (host)
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
//                    queue (depth 4); the calling thread copies, classifies and syncs each
//   .../staging:pageable  each loop again, staging through pageable memory (std::vector)
//                    instead of pinned buffers: its copies wait for the stream, as CUDA's
//                    from and to pageable memory do (on the host runtime, emulated: sync,
//                    then memcpy on the calling thread). conveyor's transfers take only
//                    pinned memory, so it has no such row: these show what that is worth.
//   conveyor/lanes:L source | map(prepare).workers(W).ordered() | batch(B) | gpu segment
//                    with L lanes (2 slots each) | unbatch | sink, L = 1..4
// Sweeps of the pipeline (2 lanes, the other knobs at their defaults):
//   conveyor/batch:B    B = 1, 4, 16, 64, 256, 1024: throughput against latency
//   conveyor/workers:W  W = 1, 2, 4 prepare workers
//   conveyor/graphs:on  (CUDA) the model replays a captured CUDA graph per batch shape
//   conveyor/normalize:cpu  prepare normalizes on the CPU and the pipeline ships floats
//                      (4 bytes a pixel) instead of bytes normalized by a device kernel
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
//   ideal_items_per_second  1 / the slowest stage measured in isolation in the same run,
//                      just before the timed loop: prepare (per image, on one thread,
//                      divided by the W workers the pipeline gets), the device step (H2D +
//                      classify + D2H of batches of B back to back on one stream, one wait
//                      at the end, per image) and
//                      postprocess (per image). The same bound for every peer.
//   efficiency         items_per_second / ideal_items_per_second
//   latency_p50_ms, latency_p95_ms  conveyor: item latency (source -> sink) from the report
//   h2d_bytes_per_second  conveyor: the lanes' H2D bytes / time in H2D (goodput); compare
//                      with bandwidth/h2d:pinned's bytes_per_second from the same run
//   bytes_per_second   bandwidth probes
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
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor_models/model.hpp"
#include "conveyor_models/reference.hpp"

namespace {

namespace cm = conveyor_models;
using clock_type = std::chrono::steady_clock;

struct config {
  cm::mlp_shape shape;
  std::size_t batch = 32;         // B
  std::size_t items = 2000;       // per iteration
  std::size_t workers = 2;        // W: prepare workers in the pipeline
  int prepare_rounds = 8;         // CPU preprocessing cost per image
  std::size_t copy_bytes = 8u << 20;  // per copy of the bandwidth probe
};

constexpr std::size_t sweep_batches[] = {1, 4, 16, 64, 256, 1024};
constexpr std::size_t max_batch = 1024;  // the largest batch any benchmark uses

// One configuration of the pipeline.
struct run_opts {
  std::size_t lanes = 2;
  std::size_t batch = 0;    // 0: the config's
  std::size_t workers = 0;  // 0: the config's
  bool graphs = false;      // CUDA: the model with cuda_graphs
  bool cpu_normalize = false;  // normalize in prepare and ship floats (else bytes, normalized on the device)
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
  CONVEYOR_CUDA_TRY(cudaMemcpyAsync(dst.data(), src, dst.size_bytes(), cudaMemcpyHostToDevice,
                                    s.native()));
}
template <class T>
void pageable_d2h(T* dst, std::type_identity_t<conveyor::cuda::device_span<const T>> src,
                  conveyor::cuda::stream& s) {
  CONVEYOR_CUDA_TRY(cudaMemcpyAsync(dst, src.data(), src.size_bytes(), cudaMemcpyDeviceToHost,
                                    s.native()));
}
#endif

// One synchronous device step: B images in host staging memory (pinned or pageable) ->
// labels in host staging memory of the same kind. Elem: uint8 pixels (the model
// normalizes on the device) or normalized floats.
template <class R, class Elem = std::uint8_t>
struct device_step {
  device_step(std::size_t batch, std::size_t n)
      : in(batch * n), d_in(batch * n), d_out(batch), out(batch), pageable_in(batch * n),
        pageable_out(batch), n_(n) {}

  // Where a loop writes a batch's images, and reads its labels after run().
  Elem* host_in(staging st) { return st == staging::pinned ? in.data() : pageable_in.data(); }
  const std::uint32_t* host_out(staging st) const {
    return st == staging::pinned ? out.data() : pageable_out.data();
  }

  // Enqueues H2D, classify and D2H of `items` images from and to pinned memory; nothing
  // waits, nothing is timed (the stage-bound probe calls this back to back).
  template <class Model>
  void enqueue(Model& model, std::size_t items, std::size_t lane) {
    copy_async(d_in.span().subspan(0, items * n_), in.span().subspan(0, items * n_), s);
    model.classify(d_in.span().subspan(0, items * n_), d_out.span(), items, s, lane);
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

// Everything one runtime's benchmarks share: the model (lanes 0..3 for the pipeline, 4
// for the loops) and the serial peer's labels to check against.
template <class R>
struct bench_env {
  static constexpr std::size_t max_lanes = 4;
  explicit bench_env(const config& c)
      : cfg(c), model(options(c, false)), step(max_batch, c.shape.input) {
    expected.resize(c.items);
    for (std::uint64_t id = 0; id < c.items; ++id) {  // one at a time, as the serial peer
      prepare_into(id, step.in.data(), c.shape.input, c.prepare_rounds, tmp);
      step.run(model, 1, max_lanes);
      expected[id] = step.out.data()[0];
    }
  }

  static cm::mlp_options options(const config& c, bool graphs) {
    return {.shape = c.shape, .lanes = max_lanes + 1, .max_items = max_batch, .cuda_graphs = graphs};
  }
  // The model a run uses: the graph-capturing one is made on first use.
  cm::model_t<R>& model_for(bool graphs) {
    if (!graphs) return model;
    if (!graph_model) graph_model = std::make_unique<cm::model_t<R>>(options(cfg, true));
    return *graph_model;
  }

  // The device step for Elem inputs (the float one is made on first use).
  template <class Elem>
  device_step<R, Elem>& step_for() {
    if constexpr (std::is_same_v<Elem, std::uint8_t>) {
      return step;
    } else {
      if (!float_step) float_step = std::make_unique<device_step<R, float>>(max_batch, cfg.shape.input);
      return *float_step;
    }
  }

  // The bound: 1 / the slowest stage, each measured alone, now, for batches of `batch`,
  // `workers` prepare workers and Elem inputs (floats: normalized in prepare, 4 bytes a
  // pixel over the copy). Each stage is measured five times and the fastest kept: other
  // processes on the cores only ever slow a probe.
  template <class Elem = std::uint8_t>
  double ideal_items_per_second(std::size_t batch = 0, std::size_t workers = 0,
                                bool graphs = false) {
    auto& m = model_for(graphs);  // the model the run uses: graphs make the device faster
    if (batch == 0) batch = cfg.batch;
    if (workers == 0) workers = cfg.workers;
    constexpr std::size_t probe = 200;
    constexpr int repeats = 5;
    const int batches = static_cast<int>(std::max<std::size_t>(2, 256 / batch));
    const std::size_t n = cfg.shape.input;
    auto& st = step_for<Elem>();
    for (std::size_t i = 0; i < batch; ++i) {
      const auto im = prepare_as<Elem>(i, cfg);
      std::copy(im.px.begin(), im.px.end(), st.in.data() + i * n);
    }
    double prepare_s = 1e9, device_s = 1e9, post_s = 1e9;
    st.run(m, batch, max_lanes);  // warm (and, with graphs, captures this shape)
    std::vector<std::uint32_t> labels(probe);
    for (int r = 0; r < repeats; ++r) {
      auto t0 = clock_type::now();
      for (std::uint64_t id = 0; id < probe; ++id) benchmark::DoNotOptimize(prepare_as<Elem>(id, cfg));
      prepare_s = std::min(prepare_s, seconds_since(t0) / probe / static_cast<double>(workers));
      // The device's own rate: batches back to back on one stream, one wait at the end
      // (a wait per batch would add a host round trip that a pipeline hides).
      t0 = clock_type::now();
      for (int b = 0; b < batches; ++b) st.enqueue(m, batch, max_lanes);
      st.s.synchronize();
      device_s = std::min(device_s, seconds_since(t0) / (batches * static_cast<double>(batch)));
      t0 = clock_type::now();
      for (std::size_t i = 0; i < probe; ++i) labels[i] = static_cast<std::uint32_t>(i) ^ 1u;
      benchmark::DoNotOptimize(labels.data());
      post_s = std::min(post_s, seconds_since(t0) / probe);
    }
    return 1.0 / std::max({prepare_s, device_s, post_s});
  }

  // Counters every peer sets; false (and the benchmark skipped) when a label is wrong.
  // timed_s: the timed part of every iteration, as the framework's real time counts it;
  // compute_s (the loops; negative: not given): the device's classify time within it.
  bool finish(benchmark::State& state, double ideal, double timed_s,
              const std::vector<std::uint32_t>& got, double compute_s = -1) {
    const auto items = state.iterations() * static_cast<std::int64_t>(cfg.items);
    state.SetItemsProcessed(items);
    state.counters["ideal_items_per_second"] = ideal;
    if (timed_s > 0) state.counters["efficiency"] = static_cast<double>(items) / timed_s / ideal;
    if (timed_s > 0 && compute_s >= 0) state.counters["gpu_busy_fraction"] = compute_s / timed_s;
    std::size_t differ = 0;
    for (std::size_t i = 0; i < cfg.items; ++i) differ += got[i] != expected[i];
    state.counters["labels_differ"] = static_cast<double>(differ);
    if (differ != 0 && std::string_view(R::name) == "host") {
      state.SkipWithError("labels differ from the serial loop's on the host runtime");
      return false;
    }
    return true;
  }

  config cfg;
  cm::model_t<R> model;
  std::unique_ptr<cm::model_t<R>> graph_model;  // with cuda_graphs; made on first use
  device_step<R> step;
  std::unique_ptr<device_step<R, float>> float_step;  // made on first use
  std::vector<std::uint32_t> expected;
  std::vector<std::uint8_t> tmp;
};

// The loops stage through env.step's host buffers of kind `st`, and run the device step
// on lane max_lanes (a handle of its own). Their GPU busy fraction is the classify time
// the step's events measured over the timed wall time (one stream: no overlap to merge).
template <class R>
void serial(benchmark::State& state, bench_env<R>& env, staging st) {
  const config& c = env.cfg;
  const double ideal = env.ideal_items_per_second();
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
  env.finish(state, ideal, timed_s, got, env.step.compute_s);
}

template <class R>
void batched(benchmark::State& state, bench_env<R>& env, staging st) {
  const config& c = env.cfg;
  const double ideal = env.ideal_items_per_second();
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
  env.finish(state, ideal, timed_s, got, env.step.compute_s);
}

// The hand-written overlap: one producer thread, a bounded mutex + condvar queue.
template <class R>
void thread_queue(benchmark::State& state, bench_env<R>& env, staging st) {
  const config& c = env.cfg;
  const double ideal = env.ideal_items_per_second();
  std::vector<std::uint32_t> got(c.items);
  double timed_s = 0;
  env.step.compute_s = 0;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::vector<image>> q;
    bool done = false;
    constexpr std::size_t depth = 4;
    std::thread producer([&] {
      for (std::uint64_t first = 0; first < c.items; first += c.batch) {
        std::vector<image> b;
        for (std::uint64_t id = first; id < std::min<std::uint64_t>(first + c.batch, c.items); ++id)
          b.push_back(prepare(id, c));
        std::unique_lock lock{m};
        cv.wait(lock, [&] { return q.size() < depth; });
        q.push_back(std::move(b));
        cv.notify_all();
      }
      std::lock_guard lock{m};
      done = true;
      cv.notify_all();
    });
    for (;;) {
      std::vector<image> b;
      {
        std::unique_lock lock{m};
        cv.wait(lock, [&] { return done || !q.empty(); });
        if (q.empty()) break;
        b = std::move(q.front());
        q.pop_front();
        cv.notify_all();
      }
      for (std::size_t i = 0; i < b.size(); ++i)
        std::memcpy(env.step.host_in(st) + i * c.shape.input, b[i].px.data(), c.shape.input);
      env.step.run(env.model, b.size(), bench_env<R>::max_lanes, st);
      for (std::size_t i = 0; i < b.size(); ++i) got[b[i].id] = env.step.host_out(st)[i];
    }
    producer.join();
    timed_s += seconds_since(t0);
  }
  env.finish(state, ideal, timed_s, got, env.step.compute_s);
}

template <class R, class Elem>
void pipelined_as(benchmark::State& state, bench_env<R>& env, run_opts o) {
  using item_t = prepared<Elem>;
  const config& c = env.cfg;
  const std::size_t lanes = o.lanes;
  const std::size_t batch = o.batch != 0 ? o.batch : c.batch;
  const std::size_t workers = o.workers != 0 ? o.workers : c.workers;
  const double ideal = env.template ideal_items_per_second<Elem>(batch, workers, o.graphs);
  const std::size_t n = c.shape.input;
  auto& model = env.model_for(o.graphs);
  std::vector<std::uint32_t> got(c.items);
  double busy = 0.0, timed_s = 0;
  conveyor::report last;
  for (auto _ : state) {
    state.PauseTiming();  // construction makes streams (and on CUDA, cuBLAS handles)
    auto segment = conveyor::gpu<R, Elem, std::uint32_t>(
        {.lanes = lanes, .slots_per_lane = 2, .in_elems = batch * n, .out_elems = batch,
         .name = "mlp"},
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
        conveyor::source([i = std::uint64_t{0}, &c]() mutable -> std::optional<std::uint64_t> {
          if (i == c.items) return std::nullopt;
          return i++;
        }) |
        conveyor::map([&c](std::uint64_t id) { return prepare_as<Elem>(id, c); }).workers(workers).ordered().name("prepare") |
        conveyor::batch(batch) | std::move(segment) | conveyor::unbatch() |
        conveyor::sink([&got](label l) { got[l.id] = l.cls; }).name("postprocess")};
    state.ResumeTiming();
    const auto t0 = clock_type::now();
    last = p.run();
    timed_s += seconds_since(t0);
    busy += last.gpu_busy_fraction;
  }
  state.counters["gpu_busy_fraction"] = busy / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  // The last iteration's latency and transfer goodput.
  state.counters["latency_p50_ms"] = last.item_latency.p50_s * 1e3;
  state.counters["latency_p95_ms"] = last.item_latency.p95_s * 1e3;
  double h2d_bytes = 0, h2d_s = 0;
  for (const auto& l : last.lanes) {
    h2d_bytes += static_cast<double>(l.h2d_bytes);
    h2d_s += l.h2d_s;
  }
  if (h2d_s > 0) state.counters["h2d_bytes_per_second"] = h2d_bytes / h2d_s;
  env.finish(state, ideal, timed_s, got);
}

template <class R>
void pipelined(benchmark::State& state, bench_env<R>& env, run_opts o) {
  if (o.cpu_normalize)
    pipelined_as<R, float>(state, env, o);
  else
    pipelined_as<R, std::uint8_t>(state, env, o);
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
  using loop_fn = void (*)(benchmark::State&, bench_env<R>&, staging);
  const std::pair<const char*, loop_fn> loops[] = {
      {"/serial", serial<R>}, {"/batched", batched<R>}, {"/thread_queue", thread_queue<R>}};
  for (const staging st : {staging::pinned, staging::pageable})
    for (const auto& [name, fn] : loops)
      benchmark::RegisterBenchmark(
          (rt + name + (st == staging::pageable ? "/staging:pageable" : "")).c_str(),
          [get, fn, st](benchmark::State& s) { fn(s, get(), st); })
          ->UseRealTime()->Unit(benchmark::kMillisecond);
  auto conveyor_run = [get](const std::string& name, run_opts o) {
    benchmark::RegisterBenchmark(name.c_str(), [get, o](benchmark::State& s) { pipelined<R>(s, get(), o); })
        ->UseRealTime()->Unit(benchmark::kMillisecond);
  };
  for (std::size_t lanes = 1; lanes <= bench_env<R>::max_lanes; ++lanes)
    conveyor_run(rt + "/conveyor/lanes:" + std::to_string(lanes), {.lanes = lanes});
  for (const std::size_t b : sweep_batches)
    conveyor_run(rt + "/conveyor/batch:" + std::to_string(b), {.batch = b});
  for (const std::size_t w : {1, 2, 4})
    conveyor_run(rt + "/conveyor/workers:" + std::to_string(w), {.workers = w});
  if constexpr (!std::is_same_v<R, conveyor::host::runtime>)
    conveyor_run(rt + "/conveyor/graphs:on", {.graphs = true});
  conveyor_run(rt + "/conveyor/normalize:cpu", {.cpu_normalize = true});
  for (const staging st : {staging::pinned, staging::pageable})
    for (const bool h2d : {true, false})
      benchmark::RegisterBenchmark(
          (rt + "/bandwidth/" + (h2d ? "h2d:" : "d2h:") + (st == staging::pinned ? "pinned" : "pageable")).c_str(),
          [get, h2d, st](benchmark::State& s) { bandwidth<R>(s, get(), h2d, st); })
          ->UseRealTime()->Unit(benchmark::kMillisecond);
}

void add_context(const char* runtime, const config& c) {
  benchmark::AddCustomContext("runtime", runtime);
  benchmark::AddCustomContext(
      "workload", std::to_string(c.items) + " uint8 images of " + std::to_string(c.shape.input) +
                      " px per iteration; MLP " + std::to_string(c.shape.input) + "->" +
                      std::to_string(c.shape.hidden) + "x" + std::to_string(c.shape.layers - 1) + "->" +
                      std::to_string(c.shape.classes) + " fp32; batch " + std::to_string(c.batch) +
                      "; prepare workers " + std::to_string(c.workers) + ", blur rounds " +
                      std::to_string(c.prepare_rounds));
  double load[1] = {0};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load[0]) != 1) load[0] = -1;
    std::fclose(f);
  }
  benchmark::AddCustomContext("loadavg_1min_at_start", std::to_string(load[0]));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
#if CONVEYOR_HAS_CUDA
  if (conveyor::cuda::device_count() > 0) {
    const config c{.shape = {.input = 784, .hidden = 1024, .layers = 4, .classes = 10},
                   .batch = 256, .items = 32768, .workers = 4, .prepare_rounds = 8,
                   .copy_bytes = std::size_t{64} << 20};
    add_context("cuda (conveyor_models::mlp, cuBLAS)", c);
    register_all<conveyor::cuda::runtime>(c);
  } else
#endif
  {
    const config c{.shape = {.input = 256, .hidden = 128, .layers = 3, .classes = 10},
                   .batch = 32, .items = 4096, .workers = 2, .prepare_rounds = 8};
    add_context("host (no GPU: conveyor_models::cpu_mlp on host streams)", c);
    register_all<conveyor::host::runtime>(c);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
