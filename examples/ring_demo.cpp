// ring_demo: three threads connected by conveyor's rings — a producer, two workers that
// square numbers, and a consumer — and what they measured: throughput, how often a
// blocking call actually had to sleep, and that nothing was lost.
//
//   ./build/examples/ring_demo [items]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "conveyor/ring/mpmc_ring.hpp"
#include "conveyor/ring/spsc_ring.hpp"

int main(int argc, char** argv) {
  const std::uint64_t items = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20'000'000;
  conveyor::spsc_ring<std::uint64_t> to_workers_single{1024};
  conveyor::mpmc_ring<std::uint64_t> to_workers{1024};
  conveyor::mpmc_ring<std::uint64_t> to_sink{1024};

  const auto t0 = std::chrono::steady_clock::now();
  std::thread source{[&] {
    for (std::uint64_t i = 0; i < items; ++i) to_workers_single.push(std::uint64_t{i});
    to_workers_single.close();
  }};
  std::thread fan_out{[&] {  // SPSC -> MPMC: one hop to show both rings
    while (auto v = to_workers_single.pop()) to_workers.push(std::uint64_t{*v});
    to_workers.close();
  }};
  std::vector<std::thread> workers;
  std::atomic<int> workers_left{2};
  for (int w = 0; w < 2; ++w)
    workers.emplace_back([&] {
      while (auto v = to_workers.pop()) to_sink.push(*v % 1000 * (*v % 1000));
      if (workers_left.fetch_sub(1) == 1) to_sink.close();
    });
  std::uint64_t count = 0, sum = 0;
  while (auto v = to_sink.pop()) {
    ++count;
    sum += *v;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  source.join();
  fan_out.join();
  for (auto& w : workers) w.join();

  std::uint64_t expected = 0;
  for (std::uint64_t i = 0; i < items; ++i) expected += i % 1000 * (i % 1000);
  std::printf(
      "conveyor ring demo: source -> spsc -> fan-out -> mpmc -> 2 workers -> mpmc -> sink\n");
  std::printf("  items       %llu delivered of %llu produced (%s)\n",
              static_cast<unsigned long long>(count), static_cast<unsigned long long>(items),
              count == items && sum == expected ? "nothing lost, checksum ok" : "MISMATCH");
  std::printf("  wall time   %.3f s on %u hardware threads\n", seconds,
              std::thread::hardware_concurrency());
  std::printf("  throughput  %.2f M items/s through 3 ring hops\n", count / seconds / 1e6);
  return count == items && sum == expected ? 0 : 1;
}
