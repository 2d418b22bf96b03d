// mlp_inference: classify Fashion-MNIST's 10,000 test images with a trained MLP, first in
// the serial loop everyone writes, then through conveyor; print each path's test accuracy,
// both throughputs and their ratio over several runs, and conveyor's report.
//
//   serial loop, per batch: prepare (CPU) -> copy in -> MLP + argmax -> copy out -> postprocess
//   conveyor:               source | prepare x W workers | batch | gpu segment x 2 lanes | unbatch | sink
//
// prepare is the CPU preprocessing: an image's 784 bytes become normalized floats (as
// the model was trained: (x / 255 - mean) / stddev). The model is data/fashion_mlp.bin
// (784 -> 128 -> 128 -> 10, trained by src/models/train_mlp.cpp). With a GPU it runs as
// conveyor_models::mlp (cuBLAS, one handle per lane, only the argmax indices copied
// back). Without one (no device, or CUDA not built) the same program runs on conveyor's
// host runtime with conveyor_models::cpu_mlp, the CPU reference enqueued on host
// streams, and says so.
//
// A fair comparison: both paths make their streams, buffers and (CUDA) cuBLAS handles
// before their clocks start and run once untimed (kernels load, caches fill, the
// allocator settles); each timed run of each path then classifies the same images, at
// least --seconds of work for the faster path (whole passes over the test set), and the
// paths take turns going first. The ratio is printed as the median and range over --runs.
//
//   ./build/examples/mlp_inference [--data DIR] [--weights FILE] [--runs N] [--seconds S]
//                                  [--images N] [--precision fp32|tf32|fp16|bf16] [--graphs]
//                                  [--thrust] [--autotune]
//   ./build/examples/mlp_inference [images] [fp32|tf32|fp16|bf16] [graphs]     (the same)
//   defaults: --data /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist)
//             --weights data/fashion_mlp.bin --runs 5 --seconds 1
//
// Exit status 0 when every label of every run equals the serial loop's, in order (on a
// GPU, fp16/bf16 or batches of other sizes may flip a near-tie: not checked there) and,
// over the whole test set, the accuracy is at least 0.85; 1 otherwise; 2 on bad options.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>  // sysconf(_SC_CLK_TCK): /proc/stat's unit

#include "conveyor/pipeline.hpp"
#include "conveyor/pipeline/autotune.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor_models/fashion_mnist.hpp"
#include "conveyor_models/mlp_file.hpp"
#include "conveyor_models/model.hpp"
#include "conveyor_models/reference.hpp"

namespace {

namespace cm = conveyor_models;
using clock_type = std::chrono::steady_clock;

constexpr double min_accuracy = 0.85;  // what the shipped weights must reach (they get 0.887)

struct args {
  std::string data{cm::fashion_mnist_default_dir};
  std::string weights = cm::default_mlp_path();
  std::size_t runs = 5;
  double seconds = 1.0;
  std::size_t images = 0;  // 0: whole passes over the test set, >= seconds of work
  cm::precision prec = cm::precision::fp32;
  bool graphs = false;
  bool thrust = false;    // labels by Thrust on the lane's stream (CUDA), not the argmax kernel
  bool autotune = false;  // find workers, lanes, batch and rings by probes, print them, exit
};

struct image {
  std::uint64_t id;
  std::vector<float> x;  // normalized pixels
};
struct label {
  std::uint64_t id;
  std::uint32_t cls;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// CPU time of the whole machine (busy, not idle or iowait) and of this process, in
// seconds: their difference over a stretch of wall time is what other programs took of
// the CPUs meanwhile, which moves the ratio more than anything this program does. Linux
// (/proc/stat); elsewhere nothing is reported.
struct cpu_sample {
  double machine_busy_s = -1;
  double self_s = 0;
  clock_type::time_point at = clock_type::now();
};

cpu_sample sample_cpu() {
  cpu_sample c;
  c.self_s = static_cast<double>(std::clock()) / CLOCKS_PER_SEC;  // all this process's threads
  if (std::FILE* f = std::fopen("/proc/stat", "r")) {
    unsigned long long v[8] = {};
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                    &v[4], &v[5], &v[6], &v[7]) == 8) {
      const unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];  // less idle, iowait
      c.machine_busy_s = static_cast<double>(busy) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
    std::fclose(f);
  }
  return c;
}

// CPUs' worth of other programs' work between two samples; negative: unknown.
double others_cpus(const cpu_sample& a, const cpu_sample& b) {
  if (a.machine_busy_s < 0 || b.machine_busy_s < 0) return -1;
  const double wall = std::chrono::duration<double>(b.at - a.at).count();
  return std::max(0.0, (b.machine_busy_s - a.machine_busy_s) - (b.self_s - a.self_s)) / wall;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class R>
class demo {
 public:
  demo(const args& a, const cm::image_set& test, const cm::trained_mlp& trained, std::size_t batch,
       std::size_t lanes, std::size_t workers)
      : a_(a),
        test_(test),
        batch_(batch),
        lanes_(lanes),
        workers_(workers),
        model_(options(trained, a, batch, lanes)),
        in_(batch * n_),
        d_in_(batch * n_),
        d_out_(batch),
        out_(batch) {}

  int run() {
    if (a_.autotune) return tune();
    const cm::mlp_shape& s = model_.options().shape;
    std::printf(
        "model: MLP %zu -> %zu x %zu -> %zu, trained (%s), %s%s%s; batches of %zu, "
        "conveyor: %zu prepare workers, %zu lanes\n\n",
        s.input, s.hidden, s.layers - 1, s.classes, a_.weights.c_str(),
        cm::to_string(a_.prec).data(), a_.graphs ? ", CUDA graphs" : "",
        a_.thrust && std::string_view(R::name) == "cuda" ? ", labels by Thrust" : "", batch_,
        workers_, lanes_);

    {  // what runs beside us now
      const cpu_sample a = sample_cpu();
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      const double others = others_cpus(a, sample_cpu());
      if (others >= 0)
        std::printf(
            "machine: %u CPUs; other programs used %.2f of them in the 0.25 s before the runs\n",
            std::thread::hardware_concurrency(), others);
    }

    // Warm-up, untimed: one pass over the test set each (or --images), which also sizes
    // the timed runs.
    const std::size_t pass = a_.images != 0 ? a_.images : test_.count;
    std::vector<std::uint32_t> serial_labels(pass), conveyor_labels(pass);
    const double serial_warm = pass / time_serial(serial_labels);
    const double conveyor_warm = pass / time_conveyor(conveyor_labels, nullptr);
    std::size_t items = pass;
    if (a_.images == 0) {  // whole passes, >= seconds of work for the faster path
      // 1.5x: a warm-up pass still runs below the steady state (the pipeline's threads are
      // placed on cores during its first milliseconds).
      const double want = 1.5 * a_.seconds * std::max(serial_warm, conveyor_warm);
      items =
          test_.count * std::max<std::size_t>(1, static_cast<std::size_t>(want / test_.count) + 1);
    }
    const double passes = static_cast<double>(items) / static_cast<double>(test_.count);
    std::printf(
        "each run classifies %zu images (%.3g pass%s over the %zu test images); "
        "both paths warmed up first\n",
        items, passes, passes == 1.0 ? "" : "es", test_.count);
    std::printf("  run   serial loop          conveyor             ratio\n");

    serial_labels.assign(items, ~0u);
    conveyor_labels.assign(items, ~0u);
    const cpu_sample runs_start = sample_cpu();
    std::vector<double> serial_rate, conveyor_rate, ratio;
    std::size_t mismatched_runs = 0;
    conveyor::report last;
    for (std::size_t r = 0; r < a_.runs; ++r) {
      double ts = 0, tc = 0;
      std::fill(conveyor_labels.begin(), conveyor_labels.end(), ~0u);
      if (r % 2 == 0) {  // take turns going first: drift on a shared machine hits both
        ts = time_serial(serial_labels);
        tc = time_conveyor(conveyor_labels, &last);
      } else {
        tc = time_conveyor(conveyor_labels, &last);
        ts = time_serial(serial_labels);
      }
      serial_rate.push_back(items / ts);
      conveyor_rate.push_back(items / tc);
      ratio.push_back(ts / tc);
      mismatched_runs += serial_labels != conveyor_labels;
      std::printf("  %-4zu  %8.0f items/s  %8.0f items/s  %5.2fx   (%.2f s, %.2f s)\n", r + 1,
                  serial_rate.back(), conveyor_rate.back(), ratio.back(), ts, tc);
    }
    const double others = others_cpus(runs_start, sample_cpu());
    const auto [rmin, rmax] = std::minmax_element(ratio.begin(), ratio.end());
    std::printf("\n  serial loop   %9.0f items/s  median of %zu runs\n", median(serial_rate),
                a_.runs);
    std::printf("  conveyor      %9.0f items/s  median of %zu runs\n", median(conveyor_rate),
                a_.runs);
    std::printf("  ratio         %9.2fx         median; range %.2fx - %.2fx over %zu runs\n",
                median(ratio), *rmin, *rmax, a_.runs);
    if (others >= 0)
      std::printf("  machine       other programs used %.2f of the %u CPUs during the runs%s\n",
                  others, std::thread::hardware_concurrency(),
                  others >= 0.25 ? ": the ratio moves with them; rerun on a quiet machine" : "");

    const double acc_serial = accuracy(serial_labels), acc_conveyor = accuracy(conveyor_labels);
    const std::size_t scored = std::min(items, test_.count);
    std::printf("  accuracy      serial loop %.4f, conveyor %.4f on %s%zu test images\n",
                acc_serial, acc_conveyor, scored == test_.count ? "all " : "the first ", scored);
    const auto same = static_cast<std::uint64_t>(std::count_if(
        serial_labels.begin(), serial_labels.end(),
        [&, i = std::size_t{0}](std::uint32_t c) mutable { return c == conveyor_labels[i++]; }));
    std::printf(
        "  results       %llu of %zu labels equal the serial loop's in the last run, in order; "
        "%zu of %zu runs differ\n",
        static_cast<unsigned long long>(same), items, mismatched_runs, a_.runs);
    std::printf("\nwhat conveyor measured (last run):\n");
    std::cout << last;
    if constexpr (requires { model_.graph_stats(); }) {  // the CUDA model's graph cache
      if (model_.options().cuda_graphs) {
        const auto g = model_.graph_stats();  // every run, both loops, all lanes
        std::printf(
            "CUDA graphs: %llu replays, %llu misses, %llu captured, %llu evicted, %llu held "
            "(at most %zu per lane; batches padded to powers of two)\n",
            static_cast<unsigned long long>(g.hits), static_cast<unsigned long long>(g.misses),
            static_cast<unsigned long long>(g.captures),
            static_cast<unsigned long long>(g.evictions), static_cast<unsigned long long>(g.cached),
            model_.options().graph_cache_capacity);
      }
    }

    // On the host runtime results are bit-identical. On a GPU a batch of another size may
    // take another cuBLAS kernel (another summation order) and flip a near-tie.
    const bool exact_expected = std::string_view(R::name) == "host";
    const bool labels_ok = mismatched_runs == 0 || !exact_expected;
    const bool accuracy_ok =
        scored < test_.count || std::min(acc_serial, acc_conveyor) >= min_accuracy;
    if (!accuracy_ok)
      std::fprintf(stderr,
                   "mlp_inference: accuracy below %.2f: are the weights the shipped ones?\n",
                   min_accuracy);
    return labels_ok && accuracy_ok && last.completed == items ? 0 : 1;
  }

 private:
  static cm::mlp_options options(const cm::trained_mlp& t, const args& a, std::size_t batch,
                                 std::size_t lanes) {
    cm::mlp_options o = t.options();
    o.prec = a.prec;
    o.cuda_graphs = a.graphs;
    o.labels = a.thrust ? cm::label_method::thrust : cm::label_method::kernel;
    o.lanes = lanes + 1;  // the pipeline's lanes, and one for the serial loop
    o.max_items = batch;
    return o;
  }

  // The CPU preprocessing: image id (the test set, round and round) -> normalized floats.
  void prepare_into(std::uint64_t id, float* out) const {
    cm::normalize_ref(test_.image(id % test_.count), std::span(out, n_), model_.options().norm);
  }

  double accuracy(const std::vector<std::uint32_t>& labels) const {
    const std::size_t n = std::min(labels.size(), test_.count);
    std::size_t right = 0;
    for (std::size_t i = 0; i < n; ++i) right += labels[i] == test_.labels[i];
    return static_cast<double>(right) / static_cast<double>(n);
  }

  // The serial loop over labels.size() images; its stream, buffers and model lane were
  // made (and, after the warm-up, used) before the clock starts. Returns seconds.
  double time_serial(std::vector<std::uint32_t>& labels) {
    const std::size_t items = labels.size();
    const auto t0 = clock_type::now();
    for (std::size_t first = 0; first < items; first += batch_) {
      const std::size_t b = std::min(batch_, items - first);
      // into pinned
      for (std::size_t i = 0; i < b; ++i) prepare_into(first + i, in_.data() + i * n_);
      copy_async(d_in_.span().subspan(0, b * n_), in_.span().subspan(0, b * n_), stream_);
      model_.classify(d_in_.span().subspan(0, b * n_), d_out_.span(), b, stream_, lanes_);
      copy_async(out_.span().subspan(0, b), d_out_.span().subspan(0, b), stream_);
      stream_.synchronize();
      std::copy_n(out_.data(), b, labels.begin() + static_cast<std::ptrdiff_t>(first));
    }
    return seconds_since(t0);
  }

  // --autotune: probes of the pipeline from 1 prepare worker, 1 lane and batches of 16,
  // each over three passes of the test set (at most the model's lanes and batch), then
  // the table.
  int tune() {
    std::printf(
        "autotune: probes of %zu images each, from 1 prepare worker, 1 lane, batches "
        "of 16 (at most %zu lanes, batches of %zu)\n\n",
        3 * test_.count, lanes_, batch_);
    conveyor::tune_knobs start;
    start.workers["prepare"] = 1;
    start.lanes = 1;
    start.batch = std::min<std::size_t>(16, batch_);
    conveyor::tune_budget budget;
    budget.max_lanes = lanes_;
    budget.max_batch = batch_;
    const conveyor::tune_result t = conveyor::autotune(
        [this](const conveyor::tune_knobs& k) {
          std::vector<std::uint32_t> labels(3 * test_.count);
          conveyor::report r;
          time_conveyor(labels, &r, &k);
          return r;
        },
        conveyor::tune_objective::throughput(), budget, start);
    std::cout << t;
    return 0;
  }

  // The same work through conveyor. The pipeline (rings, threads' state, the lanes'
  // streams and slots, on CUDA their cuBLAS handles) is built before the clock starts,
  // as an application builds it once; run() is timed. Returns seconds. With knobs (an
  // autotune probe): its workers, lanes (up to the model's), batch (up to the slots')
  // and ring capacity.
  double time_conveyor(std::vector<std::uint32_t>& labels, conveyor::report* report,
                       const conveyor::tune_knobs* knobs = nullptr) {
    const std::size_t items = labels.size(), n = n_;
    const std::size_t workers = knobs ? knobs->workers_of("prepare", workers_) : workers_;
    const std::size_t lanes = knobs ? std::min(knobs->lanes, lanes_) : lanes_;
    const std::size_t batch = knobs ? std::min(knobs->batch, batch_) : batch_;
    conveyor::pipeline_options options;
    if (knobs) options.ring_capacity = knobs->ring_capacity;
    bool in_order = true;
    std::uint64_t next_id = 0;
    auto segment = conveyor::gpu<R, float, std::uint32_t>(
        {.lanes = lanes,
         .slots_per_lane = 2,
         .in_elems = batch * n,
         .out_elems = batch,
         .name = "mlp"},
        [n](std::vector<image>& b, typename R::template pinned_span<float> dst) {
          for (std::size_t i = 0; i < b.size(); ++i)  // straight into the pinned slot
            dst.write_at(i * n, b[i].x);  // checked: throws rather than overrun the slot
          return b.size() * n;
        },
        [this](conveyor::lane_batch<R, float, std::uint32_t>& l) {  // enqueue only
          model_.classify(l.in, l.out, l.items, l.stream, l.lane);
          return l.items;
        },
        [](std::vector<image>&& b, typename R::template pinned_span<const std::uint32_t> cls) {
          std::vector<label> out;
          out.reserve(b.size());
          for (std::size_t i = 0; i < b.size(); ++i) out.push_back({b[i].id, cls[i]});
          return out;
        });
    segment.streams(cm::lane_streams<R>(model_));  // cuBLAS handles made now, not mid-run
    conveyor::pipeline p{
        conveyor::source([i = std::uint64_t{0}, items]() mutable -> std::optional<std::uint64_t> {
          if (i == items) return std::nullopt;
          return i++;
        }) |
            conveyor::map([this, n](std::uint64_t id) {
              image im{id, std::vector<float>(n)};
              prepare_into(id, im.x.data());
              return im;
            })
                .workers(workers)
                .ordered()
                .name("prepare") |
            conveyor::batch(batch).max_delay(std::chrono::milliseconds(2)) | std::move(segment) |
            conveyor::unbatch() | conveyor::sink([&](label l) {
                                    in_order &= l.id == next_id++;
                                    labels[l.id] = l.cls;
                                  }).name("postprocess"),
        options};
    const auto t0 = clock_type::now();
    conveyor::report r = p.run();
    const double s = seconds_since(t0);
    if (!in_order) std::fill(labels.begin(), labels.end(), ~0u);  // counted as a mismatch
    if (report != nullptr) *report = std::move(r);
    return s;
  }

  const args& a_;
  const cm::image_set& test_;
  std::size_t batch_, lanes_, workers_;
  std::size_t n_ = 784;
  cm::model_t<R> model_;
  typename R::stream stream_;  // the serial loop's
  typename R::template pinned_buffer<float> in_;
  typename R::template device_buffer<float> d_in_;
  typename R::template device_buffer<std::uint32_t> d_out_;
  typename R::template pinned_buffer<std::uint32_t> out_;
};

std::optional<cm::precision> parse_precision(std::string_view p) {
  if (p == "fp32") return cm::precision::fp32;
  if (p == "tf32") return cm::precision::tf32;
  if (p == "fp16") return cm::precision::fp16;
  if (p == "bf16") return cm::precision::bf16;
  return std::nullopt;
}

std::optional<args> parse(int argc, char** argv) {
  args a;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view k = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (k == "--graphs" || k == "graphs") {
      a.graphs = true;
    } else if (k == "--thrust") {
      a.thrust = true;
    } else if (k == "--autotune") {
      a.autotune = true;
    } else if (k == "--data" && (v = value())) {
      a.data = v;
    } else if (k == "--weights" && (v = value())) {
      a.weights = v;
    } else if (k == "--runs" && (v = value())) {
      a.runs = std::strtoull(v, nullptr, 10);
    } else if (k == "--seconds" && (v = value())) {
      a.seconds = std::strtod(v, nullptr);
    } else if (k == "--images" && (v = value())) {
      a.images = std::strtoull(v, nullptr, 10);
    } else if (k == "--precision" && (v = value()) && parse_precision(v)) {
      a.prec = *parse_precision(v);
    } else if (!k.starts_with("--") && positional == 0 &&
               std::isdigit(static_cast<unsigned char>(k[0]))) {
      a.images = std::strtoull(argv[i], nullptr, 10);  // the first form's [images]
      ++positional;
    } else if (!k.starts_with("--") && parse_precision(k)) {
      a.prec = *parse_precision(k);
    } else {
      return std::nullopt;
    }
  }
  if (a.runs == 0 || a.seconds < 0) return std::nullopt;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<args> a = parse(argc, argv);
  if (!a) {
    std::fprintf(stderr,
                 "usage: mlp_inference [--data DIR] [--weights FILE] [--runs N] [--seconds S] "
                 "[--images N] [--precision fp32|tf32|fp16|bf16] [--graphs] [--thrust] "
                 "[--autotune]\n");
    return 2;
  }
  try {
    const cm::trained_mlp trained = cm::load_mlp(a->weights);
    const cm::image_set test = cm::load_fashion_mnist(a->data, cm::split::test);
    std::printf("data: Fashion-MNIST, %zu test images of %zu x %zu from %s\n", test.count,
                test.rows, test.cols, a->data.c_str());
#if CONVEYOR_HAS_CUDA
    if (conveyor::cuda::device_count() > 0) {
      std::printf("mlp_inference: on the GPU (runtime: cuda)\n");
      return demo<conveyor::cuda::runtime>(*a, test, trained, 256, 2, 4).run();
    }
    std::printf("mlp_inference: no CUDA device answers: running on the host runtime\n");
#else
    std::printf("mlp_inference: built without CUDA: running on the host runtime\n");
#endif
    std::printf("  (streams are threads; the MLP is the CPU reference run on them)\n");
    return demo<conveyor::host::runtime>(*a, test, trained, 64, 2, 2).run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_inference: %s\n", e.what());
    return 1;
  }
}
