// Service pipelines (input<T>(), submit, try_submit) end to end on the host: the input's
// capacity bounds what the service holds.
// (Submitting, draining and cancelling in general: test_pipeline.cpp; error paths at
// every stage position: test_errors.cpp; allocation per item: test_service_alloc.cpp.)
#include "conveyor/pipeline.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;
using Catch::Matchers::Contains;

namespace {

template <class Counts>
void require_conserved(const Counts& c) {
  CAPTURE(c.produced, c.completed, c.failed, c.cancelled);
  REQUIRE(c.produced == c.completed + c.failed + c.cancelled);
}

// The user's exception: comes back nested in the stage_error.
struct boom : std::runtime_error {
  std::uint64_t item;
  explicit boom(std::uint64_t i) : std::runtime_error("boom on " + std::to_string(i)), item(i) {}
};

// A hang guard, not a speed limit: what the test waits for happens at once when the
// code is right, and never when it is wrong.
constexpr auto hang_guard = std::chrono::seconds(10);

}  // namespace

TEST_CASE("service: input<T>().capacity(n) is how many items try_submit and submit take") {
  const std::size_t capacity = GENERATE(2u, 4u, 1024u, 4096u);
  CAPTURE(capacity);
  std::atomic<bool> release{false};
  std::atomic<std::size_t> entered{0};  // calls of the map's function
  pipeline svc{input<std::string>().capacity(capacity) | map([&](std::string x) {
                 entered.fetch_add(1);
                 while (!release.load()) std::this_thread::yield();
                 return x.size();
               })};
  const t::release_on_exit open_gate{release};  // after svc: see test_support.hpp
  svc.start();
  // Exactly `capacity`: every accepted item holds a ticket from try_submit() until its
  // result is delivered, and the service has `capacity` of them. Held on the gate, the
  // map's one worker has one item in its hands and the input ring (one slot per ticket)
  // the other capacity - 1; nothing reaches the result node, so no ticket comes back.
  // What the stage threads hold is inside that bound, not on top of it.
  std::vector<std::future<std::size_t>> futures;
  std::atomic<int> right{0}, wrong{0};  // the callback form's results
  for (;;) {
    const std::size_t i = futures.size();
    std::string x(i % 5, 'x');
    if (i % 3 == 1) {  // the callback form shares the bound
      const bool taken =
          svc.try_submit(std::move(x), [&right, &wrong, i](outcome<std::size_t> r) noexcept {
            (r && *r == i % 5 ? right : wrong).fetch_add(1);
          });
      if (!taken) break;
      futures.emplace_back();  // a placeholder: this one answers through its callback
    } else {
      auto f = svc.try_submit(std::move(x));
      if (!f) break;
      futures.push_back(std::move(*f));
    }
    REQUIRE(futures.size() <= capacity + 64);  // a bound, or an ignored capacity never ends
  }
  REQUIRE(futures.size() == capacity);
  // Refused, both forms: the item is left as it was, the callback never called.
  std::string kept = "still here";
  REQUIRE_FALSE(svc.try_submit(std::move(kept)).has_value());
  REQUIRE(kept == "still here");
  REQUIRE_FALSE(svc.try_submit(std::move(kept),
                               [&wrong](outcome<std::size_t>) noexcept { wrong.fetch_add(1); }));
  REQUIRE(kept == "still here");
  // submit() waits for room: a client's submit returns only once the gate is open and a
  // result has freed a ticket (it reads the gate after returning).
  std::atomic<bool> about_to_submit{false}, returned_after_release{false};
  std::future<std::size_t> late;
  std::thread client{[&] {
    about_to_submit.store(true);
    late = svc.submit(std::string("late!"));
    returned_after_release.store(release.load());
  }};
  while (!about_to_submit.load() || entered.load() == 0) std::this_thread::yield();
  CHECK(entered.load() == 1);  // one item in the worker's hands, the rest queued
  release.store(true);
  client.join();
  CHECK(returned_after_release.load());
  const auto c = svc.stop(stop_mode::drain);
  require_conserved(c);
  REQUIRE(c.completed == capacity + 1);
  REQUIRE(late.get() == 5);
  int callbacks = 0;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    if (i % 3 == 1) {
      ++callbacks;
      continue;
    }
    REQUIRE(futures[i].get() == i % 5);
  }
  REQUIRE(right.load() == callbacks);
  REQUIRE(wrong.load() == 0);
}

TEST_CASE("service: a capacity that is not a power of two >= 2 fails at construction") {
  const std::size_t bad = GENERATE(0u, 1u, 3u, 5000u);
  const std::size_t suggested = bad == 5000 ? 8192 : bad == 3 ? 4 : 2;
  CAPTURE(bad);
  const auto make = [bad] {
    return pipeline{input<int>().capacity(bad) | map([](int x) { return x; })};
  };
  REQUIRE_THROWS_AS(make(), config_error);
  REQUIRE_THROWS_WITH(make(),
                      Contains("input<T>().capacity(n)") &&
                          Contains("power of two in [2, 2^30], got " + std::to_string(bad)) &&
                          Contains("pass " + std::to_string(suggested)));
  // The default and a valid one build.
  REQUIRE_NOTHROW(pipeline{input<int>() | map([](int x) { return x; })});
  REQUIRE_NOTHROW(pipeline{input<int>().capacity(8) | map([](int x) { return x; })});
}
