// mlp_inference: classify images with an MLP, first in the serial loop everyone writes,
// then through conveyor, and print both throughputs and conveyor's report.
//
//   serial loop, per batch: prepare (CPU) -> copy in -> normalize + MLP + argmax -> copy out -> postprocess
//   conveyor:               source | prepare x2 workers | batch | gpu segment x2 lanes | unbatch | sink
//
// With a GPU the model is conveyor_models::mlp (cuBLAS, one handle per lane, the uint8
// images normalized on the device, only the argmax indices copied back). Without one
// (no device, or CUDA not built) the same program runs on conveyor's host runtime with
// conveyor_models::cpu_mlp, the CPU reference enqueued on host streams, and says so.
//
//   ./build/examples/mlp_inference [items] [fp32|tf32|fp16|bf16] [graphs]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string_view>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor_models/model.hpp"
#include "conveyor_models/reference.hpp"

namespace {

namespace cm = conveyor_models;
using clock_type = std::chrono::steady_clock;

struct image {
  std::uint64_t id;
  std::vector<std::uint8_t> px;
};
struct label {
  std::uint64_t id;
  std::uint32_t cls;
};

// CPU preprocessing: "decode" an image (deterministic pixels), then a 3-tap blur along
// rows, a few times: real work, a few microseconds per image.
image prepare(std::uint64_t id, std::size_t n) {
  image im{id, std::vector<std::uint8_t>(n)};
  cm::make_pixels(id, im.px);
  std::vector<std::uint8_t> tmp(n);
  for (int round = 0; round < 4; ++round) {
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned l = im.px[i == 0 ? 0 : i - 1], c = im.px[i], r = im.px[i + 1 == n ? i : i + 1];
      tmp[i] = static_cast<std::uint8_t>((l + 2 * c + r) / 4);
    }
    im.px.swap(tmp);
  }
  return im;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

template <class R>
int run(std::uint64_t items, cm::mlp_options o, std::size_t batch_size, std::size_t lanes) {
  const std::size_t n = o.shape.input;
  o.lanes = lanes + 1;  // lanes for the pipeline, and one for the serial loop
  o.max_items = batch_size;
  cm::model_t<R> model{o};
  std::printf("model: MLP %zu -> %zu x %zu -> %zu classes, %s, batches of %zu%s\n\n", n,
              o.shape.hidden, o.shape.layers - 1, o.shape.classes, cm::to_string(o.prec).data(),
              batch_size, o.cuda_graphs ? ", CUDA graphs" : "");

  // 1. The serial loop: prepare -> copy -> model -> copy back -> postprocess, one after another.
  std::vector<std::uint32_t> serial(items);
  const auto t0 = clock_type::now();
  {
    typename R::stream s;
    typename R::template pinned_buffer<std::uint8_t> in{batch_size * n};
    typename R::template device_buffer<std::uint8_t> d_in{batch_size * n};
    typename R::template device_buffer<std::uint32_t> d_out{batch_size};
    typename R::template pinned_buffer<std::uint32_t> out{batch_size};
    for (std::uint64_t first = 0; first < items; first += batch_size) {
      const std::size_t b = static_cast<std::size_t>(std::min<std::uint64_t>(batch_size, items - first));
      for (std::size_t i = 0; i < b; ++i) {
        const image im = prepare(first + i, n);
        std::memcpy(in.data() + i * n, im.px.data(), n);
      }
      copy_async(d_in.span().subspan(0, b * n), in.span().subspan(0, b * n), s);
      model.classify(d_in.span().subspan(0, b * n), d_out.span(), b, s, lanes);
      copy_async(out.span().subspan(0, b), d_out.span().subspan(0, b), s);
      s.synchronize();
      for (std::size_t i = 0; i < b; ++i) serial[first + i] = out.data()[i];
    }
  }
  const double serial_s = seconds_since(t0);

  // 2. The same work through conveyor.
  std::vector<std::uint32_t> pipelined(items, ~0u);
  bool in_order = true;
  std::uint64_t next_id = 0;
  auto segment = conveyor::gpu<R, std::uint8_t, std::uint32_t>(
      {.lanes = lanes, .slots_per_lane = 2, .in_elems = batch_size * n, .out_elems = batch_size,
       .name = "mlp"},
      [n](std::vector<image>& b, typename R::template pinned_span<std::uint8_t> dst) {
        for (std::size_t i = 0; i < b.size(); ++i)  // straight into the pinned slot
          std::memcpy(dst.data() + i * n, b[i].px.data(), n);
        return b.size() * n;
      },
      [&model](conveyor::lane_batch<R, std::uint8_t, std::uint32_t>& l) {  // enqueue only
        model.classify(l.in, l.out, l.items, l.stream, l.lane);
        return l.items;
      },
      [](std::vector<image>&& b, typename R::template pinned_span<const std::uint32_t> cls) {
        std::vector<label> labels;
        labels.reserve(b.size());
        for (std::size_t i = 0; i < b.size(); ++i) labels.push_back({b[i].id, cls[i]});
        return labels;
      });
  segment.streams(cm::lane_streams<R>(model));  // cuBLAS handles made now, not mid-run
  conveyor::pipeline p{
      conveyor::source([i = std::uint64_t{0}, items]() mutable -> std::optional<std::uint64_t> {
        if (i == items) return std::nullopt;
        return i++;
      }) |
      conveyor::map([n](std::uint64_t id) { return prepare(id, n); }).workers(2).ordered().name("prepare") |
      conveyor::batch(batch_size).max_delay(std::chrono::milliseconds(2)) | std::move(segment) |
      conveyor::unbatch() |
      conveyor::sink([&](label l) {
        in_order &= l.id == next_id++;
        pipelined[l.id] = l.cls;
      }).name("postprocess")};
  const auto t1 = clock_type::now();
  const conveyor::report r = p.run();
  const double pipelined_s = seconds_since(t1);

  const auto same = static_cast<std::uint64_t>(
      std::count_if(serial.begin(), serial.end(),
                    [&, i = std::size_t{0}](std::uint32_t c) mutable { return c == pipelined[i++]; }));
  std::printf("  serial loop   %9.0f items/s  (%.2f s)\n", static_cast<double>(items) / serial_s, serial_s);
  std::printf("  conveyor      %9.0f items/s  (%.2f s)   %.2fx\n", static_cast<double>(items) / pipelined_s,
              pipelined_s, serial_s / pipelined_s);
  std::printf("  results       %llu of %llu labels equal the serial loop's%s\n",
              static_cast<unsigned long long>(same), static_cast<unsigned long long>(items),
              in_order ? ", in order" : ", OUT OF ORDER");
  std::printf("\nwhat conveyor measured:\n");
  std::cout << r;
  // On the host runtime results are bit-identical. On a GPU a batch of another size may
  // take another cuBLAS kernel (another summation order) and flip a near-tie.
  const bool exact_expected = std::string_view(R::name) == "host";
  return in_order && r.completed == items && (same == items || !exact_expected) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::uint64_t items = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20000;
    cm::mlp_options o;
    if (argc > 2) {
      const std::string_view p = argv[2];
      o.prec = p == "tf32" ? cm::precision::tf32 : p == "fp16" ? cm::precision::fp16
             : p == "bf16" ? cm::precision::bf16 : cm::precision::fp32;
    }
    o.cuda_graphs = argc > 3 && std::string_view(argv[3]) == "graphs";
#if CONVEYOR_HAS_CUDA
    if (conveyor::cuda::device_count() > 0) {
      std::printf("mlp_inference: %llu images on the GPU (runtime: cuda)\n",
                  static_cast<unsigned long long>(items));
      o.shape = {.input = 784, .hidden = 1024, .layers = 4, .classes = 10};
      return run<conveyor::cuda::runtime>(items, o, 256, 2);
    }
    std::printf("mlp_inference: no CUDA device answers: running on the host runtime\n");
#else
    std::printf("mlp_inference: built without CUDA: running on the host runtime\n");
#endif
    std::printf("  (streams are threads; the MLP is the CPU reference run on them)\n");
    std::printf("mlp_inference: %llu images\n", static_cast<unsigned long long>(items));
    o.shape = {.input = 256, .hidden = 128, .layers = 3, .classes = 10};
    return run<conveyor::host::runtime>(items, o, 64, 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_inference: %s\n", e.what());
    return 1;
  }
}
