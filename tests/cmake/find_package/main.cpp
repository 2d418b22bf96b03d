// A find_package(conveyor) consumer: pushes through an spsc_ring and checks what comes
// out, and that the installed version header matches the package version.
#include <conveyor/base/config.hpp>
#include <conveyor/ring/spsc_ring.hpp>
#include <conveyor/version.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

static_assert(CONVEYOR_HAS_CUDA == 0, "conveyor::conveyor alone must not define CONVEYOR_HAS_CUDA");

int main() {
  if (std::strcmp(CONVEYOR_VERSION_STRING, CONSUMER_EXPECTED_VERSION) != 0) {
    std::fprintf(stderr, "version.hpp says %s, the package %s\n", CONVEYOR_VERSION_STRING,
                 CONSUMER_EXPECTED_VERSION);
    return 1;
  }
  constexpr std::uint64_t n = 10000;
  conveyor::spsc_ring<std::uint64_t> ring{64};
  std::thread producer{[&] {
    for (std::uint64_t i = 1; i <= n; ++i) ring.push(i);
    ring.close();
  }};
  std::uint64_t count = 0, sum = 0;
  while (auto v = ring.pop()) {
    ++count;
    sum += *v;
  }
  producer.join();
  if (count != n || sum != n * (n + 1) / 2) {
    std::fprintf(stderr, "popped %llu items summing to %llu\n",
                 static_cast<unsigned long long>(count), static_cast<unsigned long long>(sum));
    return 1;
  }
  std::printf("conveyor %s: %llu items through an spsc_ring\n", CONVEYOR_VERSION_STRING,
              static_cast<unsigned long long>(count));
  return 0;
}
