// cpu_pipeline: the inference loop everyone writes first, then the same work through
// conveyor, on the host runtime (runs on any machine: the "GPU" is emulated by host
// streams whose kernels take device time without burning a host core).
//
//   serial loop, per batch:  prepare (CPU) -> copy in -> model (device) -> copy out -> postprocess (CPU)
//   conveyor:                source | prepare x2 workers | batch | gpu segment x2 lanes | unbatch | sink
//
//   ./build/examples/cpu_pipeline [items]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"

namespace {

using R = conveyor::host::runtime;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t pixels = 256, classes = 10, batch_size = 32;
constexpr auto model_fixed = std::chrono::microseconds(600);    // per launch: device time
constexpr auto model_per_item = std::chrono::microseconds(10);  // per item: device time

struct image {
  std::uint64_t id;
  std::vector<std::uint8_t> px;
};
struct tensor {
  std::uint64_t id;
  std::vector<float> x;
};
struct label {
  std::uint64_t id;
  std::uint32_t cls;
};

image make_image(std::uint64_t id) {
  image im{id, std::vector<std::uint8_t>(pixels)};
  for (std::size_t i = 0; i < pixels; ++i) im.px[i] = static_cast<std::uint8_t>(id * 131 + i * 7);
  return im;
}

// CPU preprocessing: decode + normalize, ~40 us of real work per image.
tensor prepare(image im) {
  tensor t{im.id, std::vector<float>(pixels)};
  for (int round = 0; round < 12; ++round)
    for (std::size_t i = 0; i < pixels; ++i)
      t.x[i] = (static_cast<float>(im.px[i]) / 255.f - 0.5f) * 2.f + t.x[i] * 1e-3f;
  return t;
}

// The "model": a device kernel. On the host runtime it runs on the lane's stream thread;
// it waits out the device time (a GPU would be busy, the host idle) and scores classes.
void model(const float* x, float* scores, std::size_t items) {
  std::this_thread::sleep_for(model_fixed + model_per_item * items);
  for (std::size_t i = 0; i < items; ++i)
    for (std::size_t c = 0; c < classes; ++c) {
      float s = 0;
      for (std::size_t p = c; p < pixels; p += classes) s += x[i * pixels + p];
      scores[i * classes + c] = s;
    }
}

std::uint32_t argmax(const float* s) {
  return static_cast<std::uint32_t>(std::max_element(s, s + classes) - s);
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t items = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20000;
  std::printf(
      "conveyor demo: %llu images, batches of %zu, model = %lld us + %lld us/item of device time\n",
      static_cast<unsigned long long>(items), batch_size,
      static_cast<long long>(model_fixed.count()), static_cast<long long>(model_per_item.count()));
  std::printf("runtime: host (no GPU needed; streams are threads, kernels their work)\n\n");

  // 1. The serial loop: prepare -> copy -> model -> copy back -> postprocess, one after another.
  std::uint64_t serial_sum = 0;
  const auto t0 = clock_type::now();
  {
    std::vector<float> in(batch_size * pixels), out(batch_size * classes);
    for (std::uint64_t first = 0; first < items; first += batch_size) {
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(batch_size, items - first));
      for (std::size_t i = 0; i < n; ++i) {
        tensor t = prepare(make_image(first + i));
        std::copy(t.x.begin(), t.x.end(), in.begin() + static_cast<std::ptrdiff_t>(i * pixels));
      }
      model(in.data(), out.data(), n);
      for (std::size_t i = 0; i < n; ++i) serial_sum += argmax(out.data() + i * classes);
    }
  }
  const double serial_s = std::chrono::duration<double>(clock_type::now() - t0).count();

  // 2. The same work through conveyor.
  std::uint64_t pipelined_sum = 0, next_id = 0;
  bool in_order = true;
  auto segment = conveyor::gpu<R, float, float>(
      {.lanes = 2,
       .slots_per_lane = 2,
       .in_elems = batch_size * pixels,
       .out_elems = batch_size * classes},
      [](std::vector<tensor>& b, R::pinned_span<float> dst) {  // stage-in: straight into pinned
        for (std::size_t i = 0; i < b.size(); ++i)
          dst.write_at(i * pixels, b[i].x);  // checked: throws rather than overrun the slot
        return b.size() * pixels;
      },
      [](conveyor::lane_batch<R, float, float>& l) {  // compute: enqueue on the lane's stream
        l.stream.enqueue([in = l.in, out = l.out, n = l.items] {
          model(in.unsafe_host().data(), out.unsafe_host().data(), n);
        });
        return l.items * classes;
      },
      [](std::vector<tensor>&& b, R::pinned_span<const float> scores) {  // stage-out
        std::vector<label> labels;
        labels.reserve(b.size());
        for (std::size_t i = 0; i < b.size(); ++i)
          labels.push_back({b[i].id, argmax(&scores[i * classes])});
        return labels;
      });
  conveyor::pipeline p{
      conveyor::source([i = std::uint64_t{0}, items]() mutable -> std::optional<image> {
        if (i == items) return std::nullopt;
        return make_image(i++);
      }) |
      conveyor::map(prepare).workers(2).ordered().name("prepare") |
      conveyor::batch(batch_size).max_delay(std::chrono::milliseconds(2)) | std::move(segment) |
      conveyor::unbatch() | conveyor::sink([&](label l) {
                              in_order &= l.id == next_id++;
                              pipelined_sum += l.cls;
                            }).name("postprocess")};
  const auto t1 = clock_type::now();
  const conveyor::report c = p.run();
  const double pipelined_s = std::chrono::duration<double>(clock_type::now() - t1).count();

  const bool same = pipelined_sum == serial_sum && in_order && c.completed == items;
  std::printf("  serial loop   %8.0f items/s  (%.2f s)\n", items / serial_s, serial_s);
  std::printf("  conveyor      %8.0f items/s  (%.2f s)   %.2fx\n", items / pipelined_s, pipelined_s,
              serial_s / pipelined_s);
  std::printf(
      "  results       %s; produced %llu = completed %llu + failed %llu + cancelled %llu\n",
      same ? "identical to the serial loop, in order" : "DIFFERENT from the serial loop",
      static_cast<unsigned long long>(c.produced), static_cast<unsigned long long>(c.completed),
      static_cast<unsigned long long>(c.failed), static_cast<unsigned long long>(c.cancelled));
  std::printf("\nwhat conveyor measured:\n");
  std::cout << c;
  return same ? 0 : 1;
}
