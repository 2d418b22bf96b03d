// error_policy and deadlines, end to end on the host runtime: faults injected at 1% of the
// items in every stage position (maps of one or several workers, ordered or not, a map
// over batches, the sink, the GPU segment's stage-in, compute and stage-out with jittery
// streams), in source pipelines and in services fed by several client threads. isolate:
// exactly the poisoned items (or the items of their batches) fail, each with its own
// stage_error, every other item completes with its value, in order where ordered, and the
// pipeline goes on. stop: every future is ready without stop() or wait(). Deadlines: an
// expired item never reaches the stages after the check, and the counts add up:
// produced == completed + failed + cancelled + expired.
#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <mutex>
#include <ranges>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;
using R = host::runtime;
using namespace std::chrono_literals;

namespace {

struct poison : std::runtime_error {
  explicit poison(std::uint64_t x) : std::runtime_error("poisoned item " + std::to_string(x)) {}
};

// 1 item in 100, spread by a hash (not every 100th: batches of 100 would all fail).
bool poisoned(std::uint64_t x) {
  std::uint64_t h = x * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return h % 100 == 0;
}

void require_conserved(const item_counts& c) {
  CAPTURE(c.produced, c.completed, c.failed, c.cancelled, c.expired);
  REQUIRE(c.produced == c.completed + c.failed + c.cancelled + c.expired);
}

// Where the fault is injected.
enum class where { map1, map3, map3_ordered, batch_map, sink, stage_in, compute, stage_out };
const char* name_of(where w) {
  switch (w) {
    case where::map1:
      return "map1";
    case where::map3:
      return "map3";
    case where::map3_ordered:
      return "map3_ordered";
    case where::batch_map:
      return "batch_map";
    case where::sink:
      return "sink";
    case where::stage_in:
      return "stage_in";
    case where::compute:
      return "compute";
    default:
      return "stage_out";
  }
}

// Which items a batch-level fault took with it, marked by the stage that threw.
struct doomed {
  explicit doomed(std::size_t n) : marks(n) {}
  std::vector<std::atomic<std::uint8_t>> marks;
  std::atomic<std::uint64_t> throws{0};
  template <class Items>
  void fail(const Items& items) {
    for (std::uint64_t x : items) marks[x].store(1, std::memory_order_relaxed);
    throws.fetch_add(1, std::memory_order_relaxed);
  }
  void fail_one(std::uint64_t x) {
    marks[x].store(1, std::memory_order_relaxed);
    throws.fetch_add(1, std::memory_order_relaxed);
  }
  bool is_doomed(std::uint64_t x) const { return marks[x].load(std::memory_order_relaxed) != 0; }
  std::uint64_t count() const {
    std::uint64_t n = 0;
    for (const auto& m : marks) n += m.load(std::memory_order_relaxed);
    return n;
  }
};

bool any_poisoned(const std::vector<std::uint64_t>& b) {
  return std::any_of(b.begin(), b.end(), poisoned);
}

// The GPU segment on the host runtime, jittery streams: item x -> x * 3. Throws in the
// phase `at` names for a batch holding a poisoned item.
auto make_segment(where at, doomed& d, std::string name = "faulty") {
  constexpr std::size_t max_batch = 16;
  auto stage_in = [at, &d](std::vector<std::uint64_t>& b, R::pinned_span<std::uint64_t> dst) {
    if (at == where::stage_in && any_poisoned(b)) {
      d.fail(b);
      throw poison(b.front());
    }
    for (std::size_t i = 0; i < b.size(); ++i) dst[i] = b[i];
    return b.size();
  };
  auto compute = [at, &d](lane_batch<R, std::uint64_t, std::uint64_t>& l) {
    if (at == where::compute) {
      // The batch's items are on the host side of the slot: read them before the copy.
      std::vector<std::uint64_t> items;
      l.stream.synchronize();
      for (std::size_t i = 0; i < l.items; ++i) items.push_back(l.in.unsafe_host()[i]);
      if (any_poisoned(items)) {
        d.fail(items);
        throw poison(items.front());
      }
    }
    const std::size_t n = l.items;
    l.stream.enqueue([in = l.in, out = l.out, n] {
      for (std::size_t i = 0; i < n; ++i) out.unsafe_host()[i] = in.unsafe_host()[i] * 3;
    });
    return n;
  };
  auto stage_out = [at, &d](std::vector<std::uint64_t>&& b, R::pinned_span<const std::uint64_t> r) {
    if (at == where::stage_out && any_poisoned(b)) {
      d.fail(b);
      throw poison(b.front());
    }
    std::vector<std::uint64_t> out(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) out[i] = r[i];
    return out;
  };
  auto g = gpu<R, std::uint64_t, std::uint64_t>({.lanes = 2,
                                                 .slots_per_lane = 2,
                                                 .in_elems = max_batch,
                                                 .out_elems = max_batch,
                                                 .name = std::move(name)},
                                                stage_in, compute, stage_out);
  g.streams([](std::size_t lane) {
    return host::stream{host::jitter{lane + 7, std::chrono::microseconds(20)}};
  });
  return g;
}

// x -> x * 3, throwing on poisoned items: the map of the map positions.
auto faulty_map(where at, doomed& d) {
  auto m = map([&d](std::uint64_t x) {
             if (poisoned(x)) {
               d.fail_one(x);
               throw poison(x);
             }
             return x * 3;
           }).name("faulty");
  if (at != where::map1) m.workers(3);
  if (at == where::map3_ordered) m.ordered();
  return m;
}

// Batches x -> x * 3, throwing on a batch that holds a poisoned item.
auto faulty_batch_map(doomed& d) {
  return map([&d](std::vector<std::uint64_t> b) {
           if (any_poisoned(b)) {
             d.fail(b);
             throw poison(b.front());
           }
           for (auto& x : b) x *= 3;
           return b;
         })
      .name("faulty");
}

}  // namespace

TEST_CASE("isolate: a source pipeline skips the items a stage throws on and run() returns") {
  const where at = GENERATE(where::map1, where::map3, where::map3_ordered, where::batch_map,
                            where::sink, where::stage_in, where::compute, where::stage_out);
  CAPTURE(name_of(at));
  const std::uint64_t n = t::scaled(20'000);
  doomed d{n};
  std::vector<std::uint64_t> got;
  std::mutex m;
  const auto collect = [&](std::uint64_t y) {
    const std::lock_guard lock{m};
    got.push_back(y / 3);
  };
  const pipeline_options iso{.ring_capacity = 64, .errors = error_policy::isolate};
  auto src = [n] { return from_range(std::views::iota(std::uint64_t{0}, n)); };
  report r;
  if (at == where::batch_map) {
    pipeline p{src() | batch(16).max_delay(200us) | faulty_batch_map(d) | unbatch() | sink(collect),
               iso};
    r = p.run();
  } else if (at == where::sink) {
    pipeline p{src() | map([](std::uint64_t x) { return x * 3; }) | sink([&](std::uint64_t y) {
                                                                      if (poisoned(y / 3)) {
                                                                        d.fail_one(y / 3);
                                                                        throw poison(y / 3);
                                                                      }
                                                                      collect(y);
                                                                    }).name("faulty"),
               iso};
    r = p.run();
  } else if (at >= where::stage_in) {
    pipeline p{src() | batch(16).max_delay(200us) | make_segment(at, d) | unbatch() | sink(collect),
               iso};
    r = p.run();
  } else {
    pipeline p{src() | faulty_map(at, d) | sink(collect), iso};
    r = p.run();
  }
  require_conserved(r.produced == 0
                        ? item_counts{}
                        : item_counts{r.produced, r.completed, r.failed, r.cancelled, r.expired});
  const std::uint64_t lost = d.count();
  CAPTURE(lost, d.throws.load());
  REQUIRE(d.throws.load() > 0);  // the run hit faults
  CHECK(r.produced == n);
  CHECK(r.failed == lost);
  CHECK(r.completed == n - lost);
  CHECK(r.cancelled == 0);
  // The failing stage counts them; the report keeps the first errors.
  const auto faulty = std::find_if(r.stages.begin(), r.stages.end(),
                                   [](const stage_report& s) { return s.name == "faulty"; });
  REQUIRE(faulty != r.stages.end());
  CHECK(faulty->failed == lost);
  CHECK(r.errors_total == d.throws.load());
  CHECK(r.errors.size() == std::min<std::uint64_t>(metrics::failure_log::kept, r.errors_total));
  for (const auto& e : r.errors) {
    CHECK(e.stage == "faulty");
    CHECK_THAT(e.message, Catch::Contains("poisoned item"));
  }
  // Every other item, once, in input order where the stage keeps it (all but map3).
  REQUIRE(got.size() == n - lost);
  if (at == where::map3) std::sort(got.begin(), got.end());
  bool right = true;
  std::uint64_t expect = 0;
  for (std::uint64_t x : got) {
    while (expect < n && d.is_doomed(expect)) ++expect;
    right = right && x == expect;
    ++expect;
  }
  CHECK(right);
}

TEST_CASE("isolate: a service fails exactly the poisoned requests and keeps serving") {
  const where at = GENERATE(where::map1, where::map3, where::map3_ordered, where::batch_map,
                            where::stage_in, where::compute, where::stage_out);
  const bool callbacks = GENERATE(false, true);
  CAPTURE(name_of(at), callbacks);
  constexpr int clients = 4;
  const std::uint64_t per_client = t::scaled(3'000);
  const std::uint64_t n = clients * per_client;
  doomed d{n + 1};
  const auto run_service = [&](auto&& svc) {
    svc.start();
    std::vector<std::optional<outcome<std::uint64_t>>> got(n);
    std::vector<std::future<std::uint64_t>> futures(n);
    std::atomic<std::uint64_t> settled{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        for (std::uint64_t i = 0; i < per_client; ++i) {
          const std::uint64_t x = i * clients + static_cast<std::uint64_t>(c);
          if (callbacks) {
            svc.submit(x, [&got, &settled, x](outcome<std::uint64_t>&& o) noexcept {
              got[x].emplace(std::move(o));
              settled.fetch_add(1, std::memory_order_release);
            });
          } else {
            futures[x] = svc.submit(x);
          }
        }
      });
    for (auto& th : threads) th.join();
    if (callbacks) {
      while (settled.load(std::memory_order_acquire) < n) std::this_thread::sleep_for(1ms);
    } else {
      for (std::uint64_t x = 0; x < n; ++x) {
        try {
          got[x].emplace(outcome<std::uint64_t>::success(futures[x].get()));
        } catch (...) {
          got[x].emplace(outcome<std::uint64_t>::failure(std::current_exception()));
        }
      }
    }
    // Still serving: a clean request after all the faults gets its result.
    CHECK(svc.submit(std::uint64_t{2}).get() == 6);
    const report r = svc.stop(stop_mode::drain);
    require_conserved({r.produced, r.completed, r.failed, r.cancelled, r.expired});
    const std::uint64_t lost = d.count();
    CAPTURE(lost);
    REQUIRE(d.throws.load() > 0);
    CHECK(r.produced == n + 1);
    CHECK(r.failed == lost);
    CHECK(r.completed == n + 1 - lost);
    std::uint64_t wrong = 0, bad_errors = 0;
    for (std::uint64_t x = 0; x < n; ++x) {
      REQUIRE(got[x].has_value());
      if (!d.is_doomed(x)) {
        wrong += got[x]->has_value() && got[x]->value() == 3 * x ? 0 : 1;
        continue;
      }
      // A failed request's own error: the stage_error naming the stage, nesting poison.
      try {
        (void)got[x]->value();
        ++bad_errors;
      } catch (const stage_error& e) {
        bool nested_poison = false;
        try {
          e.rethrow_nested();
        } catch (const poison&) {
          nested_poison = true;
        } catch (...) {
        }
        bad_errors += e.stage() == "faulty" && nested_poison ? 0 : 1;
      } catch (...) {
        ++bad_errors;
      }
    }
    CHECK(wrong == 0);
    CHECK(bad_errors == 0);
  };
  const pipeline_options opts{.ring_capacity = 64};  // automatic: isolate in a service
  const auto plus_nothing = map([](std::uint64_t x) { return x; }).name("pass");
  if (at == where::batch_map) {
    run_service(pipeline{
        input<std::uint64_t>() | batch(16).max_delay(200us) | faulty_batch_map(d) | unbatch(),
        opts});
  } else if (at >= where::stage_in) {
    run_service(pipeline{
        input<std::uint64_t>() | batch(16).max_delay(200us) | make_segment(at, d) | unbatch(),
        opts});
  } else {
    run_service(pipeline{input<std::uint64_t>() | faulty_map(at, d) | plus_nothing, opts});
  }
}

TEST_CASE("stop: a fault in the GPU segment settles every future without stop() or wait()") {
  const where at = GENERATE(where::stage_in, where::compute, where::stage_out);
  CAPTURE(name_of(at));
  const std::uint64_t n = t::scaled(4'000);
  doomed d{n};
  pipeline svc{
      input<std::uint64_t>() | batch(16).max_delay(200us) | make_segment(at, d) | unbatch(),
      pipeline_options{.ring_capacity = 64, .errors = error_policy::stop}};
  svc.start();
  std::vector<std::future<std::uint64_t>> futures;
  for (std::uint64_t x = 0; x < n; ++x) {
    try {
      futures.push_back(svc.submit(x));
    } catch (const closed_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("stage 'faulty' failed"));
      break;
    }
  }
  // Every future is ready on its own (no stop(), no wait()): a stranded one would hang.
  std::uint64_t ready = 0;
  for (auto& f : futures) ready += f.wait_for(60s) == std::future_status::ready ? 1 : 0;
  CHECK(ready == futures.size());
  REQUIRE_THROWS_AS(svc.wait(), stage_error);
}

TEST_CASE("deadlines: an expired request never reaches the stages after the check") {
  // The first request holds the first map until the rest are queued behind it; half of
  // those have a deadline that passes meanwhile.
  const bool callbacks = GENERATE(false, true);
  CAPTURE(callbacks);
  constexpr std::uint64_t k = 40;
  std::atomic<bool> gate{false};
  std::atomic<std::uint64_t> first_calls{0}, second_calls{0};
  std::vector<std::uint8_t> reached(2 * k + 1, 0);
  pipeline svc{input<std::uint64_t>() | map([&](std::uint64_t x) {
                                          if (x == 0) gate.wait(false);
                                          first_calls.fetch_add(1);
                                          return x;
                                        }).name("first") |
                   map([&](std::uint64_t x) {
                     reached[x] = 1;
                     second_calls.fetch_add(1);
                     return x + 1;
                   }).name("second"),
               pipeline_options{.ring_capacity = 128}};
  t::release_on_exit open{gate};
  svc.start();
  auto head = svc.submit(std::uint64_t{0});
  const auto soon = std::chrono::steady_clock::now() + 5ms;
  std::vector<std::future<std::uint64_t>> futures(2 * k + 1);
  std::vector<std::optional<outcome<std::uint64_t>>> got(2 * k + 1);
  std::atomic<std::uint64_t> settled{0};
  for (std::uint64_t x = 1; x <= 2 * k; ++x) {
    const bool tight = x % 2 == 1;
    if (callbacks) {
      auto done = [&got, &settled, x](outcome<std::uint64_t>&& o) noexcept {
        got[x].emplace(std::move(o));
        settled.fetch_add(1, std::memory_order_release);
      };
      if (tight)
        svc.submit(x, soon, done);
      else
        svc.submit(x, done);
    } else {
      futures[x] = tight ? svc.submit(x, soon) : svc.submit(x, 10min);
    }
  }
  while (std::chrono::steady_clock::now() < soon + 2ms) std::this_thread::sleep_for(1ms);
  gate.store(true);
  gate.notify_all();
  CHECK(head.get() == 1);
  std::uint64_t expired = 0, served = 0;
  // acquire: pairs with each callback's release increment; what it wrote is visible.
  if (callbacks)
    while (settled.load(std::memory_order_acquire) < 2 * k) std::this_thread::sleep_for(1ms);
  for (std::uint64_t x = 1; x <= 2 * k; ++x) {
    if (!callbacks) {
      try {
        got[x].emplace(outcome<std::uint64_t>::success(futures[x].get()));
      } catch (...) {
        got[x].emplace(outcome<std::uint64_t>::failure(std::current_exception()));
      }
    }
    if (x % 2 == 1) {
      REQUIRE_THROWS_AS(got[x]->value(), deadline_error);
      CHECK(reached[x] == 0);
      ++expired;
    } else {
      CHECK((got[x]->has_value() && got[x]->value() == x + 1));
      ++served;
    }
  }
  const report r = svc.stop(stop_mode::drain);
  require_conserved({r.produced, r.completed, r.failed, r.cancelled, r.expired});
  CHECK(r.expired == k);
  CHECK(expired == k);
  CHECK(served == k);
  CHECK(first_calls.load() == k + 1);  // the expired ones never ran in "first" either
  CHECK(second_calls.load() == k + 1);
  CHECK(r.stages[0].name == "first");  // a service's input is no stage of the report
  CHECK(r.stages[0].expired == k);
  CHECK(r.failed == 0);
}

TEST_CASE("deadlines: a batch drops its expired items before the GPU segment") {
  // One lane, one slot: the first batch's kernel waits on a gate, the second batch waits
  // for the slot, and the third (all with a deadline that passes meanwhile) waits in the
  // ring in front of the segment: the batcher let it go, the segment drops it.
  std::atomic<bool> gate{false};
  std::atomic<std::uint64_t> staged{0};
  auto stage_in = [&](std::vector<std::uint64_t>& b, R::pinned_span<std::uint64_t> dst) {
    staged.fetch_add(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) dst[i] = b[i];
    return b.size();
  };
  auto compute = [&](lane_batch<R, std::uint64_t, std::uint64_t>& l) {
    const std::size_t n = l.items;
    l.stream.enqueue([&gate, in = l.in, out = l.out, n] {
      gate.wait(false);
      for (std::size_t i = 0; i < n; ++i) out.unsafe_host()[i] = in.unsafe_host()[i] + 1;
    });
    return n;
  };
  auto stage_out = [](std::vector<std::uint64_t>&& b, R::pinned_span<const std::uint64_t> r) {
    return std::vector<std::uint64_t>(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(b.size()));
  };
  pipeline svc{
      input<std::uint64_t>() | batch(2) |
          gpu<R, std::uint64_t, std::uint64_t>(
              {.lanes = 1, .slots_per_lane = 1, .in_elems = 2, .out_elems = 2, .name = "segment"},
              stage_in, compute, stage_out) |
          unbatch(),
      pipeline_options{.ring_capacity = 16}};
  t::release_on_exit open{gate};
  svc.start();
  std::vector<std::future<std::uint64_t>> plain;
  for (std::uint64_t x = 0; x < 4; ++x) plain.push_back(svc.submit(x));
  // Items 0-3 make batches 1 and 2; give the segment time to take both (it stages
  // batch 1 and waits for the slot with batch 2 in hand).
  while (staged.load() < 2) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  const auto soon = std::chrono::steady_clock::now() + 5ms;
  auto late1 = svc.submit(std::uint64_t{10}, soon);
  auto late2 = svc.submit(std::uint64_t{11}, soon);
  while (std::chrono::steady_clock::now() < soon + 2ms) std::this_thread::sleep_for(1ms);
  gate.store(true);
  gate.notify_all();
  for (std::uint64_t x = 0; x < 4; ++x) CHECK(plain[x].get() == x + 1);
  CHECK_THROWS_AS(late1.get(), deadline_error);
  CHECK_THROWS_AS(late2.get(), deadline_error);
  const report r = svc.stop(stop_mode::drain);
  require_conserved({r.produced, r.completed, r.failed, r.cancelled, r.expired});
  CHECK(r.expired == 2);
  CHECK(staged.load() == 4);  // the late batch never reached stage-in
}

TEST_CASE("deadlines: submit() waits for room until the deadline at most") {
  std::atomic<bool> gate{false};
  pipeline svc{input<int>().capacity(2) | map([&](int x) {
                 gate.wait(false);
                 return x;
               })};
  t::release_on_exit open{gate};
  svc.start();
  auto a = svc.submit(1);
  auto b = svc.submit(2);  // both tickets out
  auto late = svc.submit(3, 20ms);
  REQUIRE(late.wait_for(0s) == std::future_status::ready);  // settled in the call
  CHECK_THROWS_AS(late.get(), deadline_error);
  bool called = false;
  svc.submit(4, std::chrono::steady_clock::now() + 5ms,
             [&called](outcome<int>&& o) noexcept { called = !o.has_value(); });
  CHECK(called);
  gate.store(true);
  gate.notify_all();
  CHECK(a.get() == 1);
  CHECK(b.get() == 2);
  const report r = svc.stop(stop_mode::drain);
  require_conserved({r.produced, r.completed, r.failed, r.cancelled, r.expired});
  CHECK(r.expired == 2);
  CHECK(r.completed == 2);
}
