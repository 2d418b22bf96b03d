// An add_subdirectory(conveyor) consumer: two producers and two consumers through an
// mpmc_ring; checks that every item arrived exactly once (count and sum).
#include <conveyor/ring/mpmc_ring.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

int main() {
  constexpr std::uint64_t per_producer = 5000;
  constexpr std::uint64_t n = 2 * per_producer;
  conveyor::mpmc_ring<std::uint64_t> ring{64};
  std::atomic<std::uint64_t> count{0}, sum{0};

  std::vector<std::thread> producers, consumers;
  for (std::uint64_t p = 0; p < 2; ++p)
    producers.emplace_back([&, p] {
      for (std::uint64_t i = 1; i <= per_producer; ++i) ring.push(p * per_producer + i);
    });
  for (int c = 0; c < 2; ++c)
    consumers.emplace_back([&] {
      while (auto v = ring.pop()) {
        count.fetch_add(1);
        sum.fetch_add(*v);
      }
    });
  for (auto& t : producers) t.join();
  ring.close();  // consumers drain what is left, then pop() returns nullopt
  for (auto& t : consumers) t.join();

  if (count.load() != n || sum.load() != n * (n + 1) / 2) {
    std::fprintf(stderr, "popped %llu items summing to %llu, expected %llu and %llu\n",
                 static_cast<unsigned long long>(count.load()),
                 static_cast<unsigned long long>(sum.load()), static_cast<unsigned long long>(n),
                 static_cast<unsigned long long>(n * (n + 1) / 2));
    return 1;
  }
  std::printf("add_subdirectory consumer: %llu items through an mpmc_ring\n",
              static_cast<unsigned long long>(n));
  return 0;
}
