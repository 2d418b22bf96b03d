// A service pipeline driven with submit(x, done) allocates nothing per item once warm;
// submit(x) allocates each future's shared state. This binary replaces the global
// operator new to count the allocations made, on every thread, while a window is open.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <new>
#include <thread>
#include <vector>

#include "conveyor/pipeline.hpp"

namespace {
std::atomic<bool> counting{false};
std::atomic<std::uint64_t> allocations{0};
}  // namespace

// g++ warns that free() releases what operator new returned: here that is what operator
// new does (malloc), which g++ cannot see once the replacement is inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

// relaxed: counters read by the test thread after the work they count has been waited
// for (the callbacks' count, or future::get(), orders it).
void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc{};
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace conveyor;

TEST_CASE("service: submit with a small callback allocates nothing per item; submit(x) does") {
#if !defined(__GLIBCXX__)
  SKIP("relies on libstdc++'s std::function keeping a 16-byte callable inline");
#endif
  pipeline svc{input<std::uint64_t>() | map([](std::uint64_t x) { return x + 1; }).workers(2) |
               map([](std::uint64_t x) { return 2 * x; })};
  svc.start();
  std::atomic<std::uint64_t> done{0}, sum{0};
  // Submits ids [first, first + n) and waits until every callback has run.
  auto submit_and_wait = [&](std::uint64_t first, std::uint64_t n) {
    for (std::uint64_t id = first; id < first + n; ++id)
      svc.submit(std::uint64_t{id}, [&done, &sum](outcome<std::uint64_t> r) noexcept {
        sum.fetch_add(r ? *r : 0);
        done.fetch_add(1);  // seq_cst: the waiting loop below sees sum's update with it
      });
    while (done.load() < first + n) std::this_thread::yield();
  };
  submit_and_wait(0, 2000);  // warm-up: threads started, every lazy structure touched

  constexpr std::uint64_t measured = 20000;
  counting.store(true);
  submit_and_wait(2000, measured);
  counting.store(false);
  const std::uint64_t with_callbacks = allocations.exchange(0);

  constexpr std::size_t futures = 1000;
  std::vector<std::future<std::uint64_t>> f;
  f.reserve(futures);
  counting.store(true);
  for (std::size_t i = 0; i < futures; ++i) f.push_back(svc.submit(std::uint64_t{i}));
  for (auto& x : f) (void)x.get();
  counting.store(false);
  const std::uint64_t with_futures = allocations.exchange(0);

  const auto c = svc.stop(stop_mode::drain);
  std::uint64_t expected = 0;
  for (std::uint64_t id = 0; id < 2000 + measured; ++id) expected += 2 * (id + 1);
  REQUIRE(sum.load() == expected);
  REQUIRE(c.completed == 2000 + measured + futures);
  CAPTURE(with_callbacks, with_futures);
  REQUIRE(with_callbacks == 0);
  REQUIRE(with_futures >= futures);  // the counter sees allocations on these threads
}
