// A service pipeline driven with submit(x, done) allocates nothing per item once warm;
// submit(x) allocates each future's shared state; a submit whose allocation fails gives
// its ticket back. This binary replaces the global operator new (replace_new.hpp) to
// count the allocations made on every thread, and to fail the next one on request.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <new>
#include <thread>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "test_support.hpp"

// Counts every allocation in this binary, on every thread; fails one on request.
#include "replace_new.hpp"

namespace {
using conveyor::test::allocations;
using conveyor::test::fail_next_allocation;
}  // namespace

using namespace conveyor;

TEST_CASE("service: submit with a small callback allocates nothing per item, submit(x) does") {
#if !defined(__GLIBCXX__)
  SKIP("relies on libstdc++'s std::function keeping a 16-byte callable inline");
#endif
  // What is counted is the items' own path, without the threads that wake on a clock
  // and allocate: how many of their rounds fall in the measured window depends on how
  // fast the machine runs it (under ThreadSanitizer, the timeline's 100 ms reports
  // did). So no placer (placement os), no timeline recorder (metrics off), and no
  // ring growth (a ring's reserve is made once, when it first grows).
  pipeline svc{
      input<std::uint64_t>() | map([](std::uint64_t x) { return x + 1; }).workers(2) |
          map([](std::uint64_t x) { return 2 * x; }),
      pipeline_options{.ring_growth = 1, .metrics = false, .placement = thread_placement::os}};
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
  std::uint64_t before = allocations.load();
  submit_and_wait(2000, measured);
  const std::uint64_t with_callbacks = allocations.load() - before;

  constexpr std::size_t futures = 1000;
  std::vector<std::future<std::uint64_t>> f;
  f.reserve(futures);
  before = allocations.load();
  for (std::size_t i = 0; i < futures; ++i) f.push_back(svc.submit(std::uint64_t{i}));
  for (auto& x : f) (void)x.get();
  const std::uint64_t with_futures = allocations.load() - before;

  const auto c = svc.stop(stop_mode::drain);
  std::uint64_t expected = 0;
  for (std::uint64_t id = 0; id < 2000 + measured; ++id) expected += 2 * (id + 1);
  REQUIRE(sum.load() == expected);
  REQUIRE(c.completed == 2000 + measured + futures);
  CAPTURE(with_callbacks, with_futures);
  REQUIRE(with_callbacks == 0);
  REQUIRE(with_futures >= futures);  // the counter sees allocations on these threads
}

TEST_CASE("service: a submit whose callback cannot be stored gives its ticket back") {
  std::atomic<bool> release{false};
  // placement os: no placer thread, whose rounds allocate and could take the failure
  // meant for submit() (fail_next_allocation fails the next allocation on any thread).
  pipeline svc{input<int>() | map([&](int x) {
                 while (!release.load()) std::this_thread::yield();
                 return x;
               }),
               pipeline_options{.placement = thread_placement::os}};
  const conveyor::test::release_on_exit open_gate{release};  // after svc: see test_support.hpp
  svc.start();
  std::atomic<int> calls{0};
  // Too big for std::function's inline buffer: storing it allocates.
  struct big_callback {
    std::array<char, 64> state{};
    std::atomic<int>* calls;
    void operator()(outcome<int>) noexcept { calls->fetch_add(1); }
  };
  for (int k = 0; k < 5; ++k) {
    fail_next_allocation.store(true);
    REQUIRE_THROWS_AS(svc.submit(1, big_callback{{}, &calls}), std::bad_alloc);
  }
  fail_next_allocation.store(false);
  std::size_t accepted = 0;  // the stage holds every item: this counts the free tickets
  while (svc.try_submit(2, [&calls](outcome<int>) noexcept { calls.fetch_add(1); })) ++accepted;
  REQUIRE(accepted == 1024);  // none lost to the failed calls
  release.store(true);
  const auto c = svc.stop(stop_mode::drain);
  CAPTURE(c.produced, c.completed, c.failed, c.cancelled);
  REQUIRE(c.produced == accepted);  // the failed calls were never counted
  REQUIRE(c.completed == accepted);
  REQUIRE(static_cast<std::size_t>(calls.load()) == accepted);  // nor called back
}
