// Error paths of the pipeline: an exception thrown at every stage position, with the rings
// empty (the first item throws) and with every ring full (a downstream stage is held on a
// gate until the whole pipeline is saturated, then the stage throws), ended by run(),
// stop(drain), stop(cancel) or by destroying the started pipeline. Each run must end (CTest's
// TIMEOUT catches a hang), rethrow stage_error naming the stage and the item with the
// original exception nested, conserve produced == completed + failed + cancelled, and
// destroy every item it made. Plus the service mode (futures of items in flight), an
// unbatch whose batch changed length, and destroying a healthy running pipeline.
//
// "Full" is exact, not a sleep: with every ring of capacity C and the stage after the
// thrower held on a gate, the thrower is called exactly `trigger` times before its output
// path is full, and the source has been called exactly `saturated` times once every ring
// upstream of it is full too (each ring holds C, each stage blocked in push holds what it
// was pushing). The thrower throws on call `trigger`, after waiting for `saturated`.
#include "conveyor/pipeline.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;
using t::counted;

namespace {

constexpr std::uint64_t C = 4;  // capacity of every ring in these tests
constexpr std::uint64_t B = 3;  // batch size
constexpr std::uint64_t none = ~std::uint64_t{0};

// The user's exception: must come back out of stage_error with its own type.
struct boom : std::runtime_error {
  std::uint64_t item;
  explicit boom(std::uint64_t i)
      : std::runtime_error("boom on item " + std::to_string(i)), item(i) {}
};

enum class where { source, map, batch_map, map_after_unbatch, sink };
enum class ending { run, stop_drain, stop_cancel, destroy };

const char* name_of(where w) {
  switch (w) {
    case where::source:
      return "src";
    case where::map:
      return "thrower";
    case where::batch_map:
      return "per-batch";
    case where::map_after_unbatch:
      return "after-unbatch";
    case where::sink:
      return "out";
  }
  return "?";
}

// What one scenario shares with the stages' functions.
struct plan {
  where at = where::map;
  std::size_t workers = 1;  // of the throwing stage
  bool ordered = false;
  bool full = false;
  std::uint64_t trigger = 0;    // the thrower's call (0-based, across its workers) that throws
  std::uint64_t saturated = 0;  // `fed` once every ring upstream of the thrower is full
  bool by_item = false;         // count items, not calls: item `trigger` throws (configure())
  std::atomic<std::uint64_t> fed{0};    // source calls, or submit() calls in service mode
  std::atomic<std::uint64_t> calls{0};  // calls of the thrower
  std::atomic<bool> thrown{false};
  std::atomic<std::uint64_t> failed_item{none};

  // Called by the stage under test with the sequence number of what it holds (for a
  // batch: its first item). Calls (or items, by_item) before `trigger` pass; call
  // `trigger` throws (when full, only once the pipeline is saturated); later calls, when
  // full, wait for the throw so that each worker holds one item and nothing else moves.
  void at_call(std::uint64_t seq) {
    const std::uint64_t call = calls.fetch_add(1);
    const std::uint64_t k = by_item ? seq : call;
    if (k < trigger) return;
    if (k > trigger) {
      gate();
      return;
    }
    if (full) {
      while (calls.load() < trigger + workers || fed.load() < saturated) std::this_thread::yield();
    }
    failed_item.store(seq);
    thrown.store(true);
    thrown.notify_all();
    throw boom(seq);
  }

  // The stage after the thrower, when full: holds its item until the throw.
  void gate() {
    if (full) thrown.wait(false);
  }

  std::uint64_t items_failed() const {
    return at == where::source ? 0 : at == where::batch_map ? B : 1;
  }
};

// The map under test: calls pl.at_call() on every item, so it throws (or waits) where
// and when the plan says, with the plan's workers and ordering.
auto throwing_map(plan& pl) {
  return map([&pl](counted c) {
           pl.at_call(c.value);
           return c;
         })
      .workers(pl.workers)
      .ordered(pl.ordered);
}

// Where the thrower throws when the rings are to be full, and how many source calls
// saturate everything upstream of it (see each topology below).
void configure(plan& pl) {
  if (!pl.full) return;  // trigger 0: the first item throws, nothing waits
  const std::uint64_t w = pl.workers;
  switch (pl.at) {
    case where::source:  // src -> pass -> sink(gated)
      // Downstream: ring C + pass blocked in push 1 + ring C + the gated sink's item 1.
      pl.trigger = 2 * C + 2;
      break;
    case where::map:  // src -> thrower x w -> sink(gated)
      // Downstream: ring C + the sink's item. Upstream: the w items in calls, ring C,
      // the source blocked in push.
      pl.trigger = C + 1;
      pl.saturated = (pl.trigger + w) + C + 1;
      if (pl.ordered && w > 1) {
        // On lanes (one thread on either side): worker j takes items j, j + w, ... from
        // its own lane and pushes them to its own lane, the sink takes them in order.
        // Counted in calls, one worker could fill its output lane and block in push
        // while the worker with the item the sink waits for is slow to start: it never
        // calls again, and "each worker holds one" never comes. Counted in items, items
        // 0..trigger-1 pass (at most ceil(trigger / w) <= C per lane), each worker holds
        // one of trigger..trigger+w-1, and upstream each of the w lanes holds C.
        pl.by_item = true;
        pl.saturated = (pl.trigger + w) + w * C + 1;
      }
      break;
    case where::batch_map: {  // src -> batch(B) -> per-batch -> unbatch -> sink(gated)
      // Downstream in batches: unbatch has pushed items 0..C (sink 1 + ring C) and holds
      // the batch of item C+1; behind it a ring of C batches.
      pl.trigger = (C + 1) / B + 1 + C;
      // Upstream in items: the batches in calls, ring of C batches, batch blocked in push
      // with a full batch, ring C, source blocked.
      pl.saturated = (pl.trigger + 1) * B + C * B + B + C + 1;
      break;
    }
    case where::map_after_unbatch: {  // src -> batch -> pass -> unbatch -> thrower -> sink(gated)
      pl.trigger = C + 1;
      // Upstream in items: T taken by the thrower, ring C, the rest r of the batch unbatch
      // is blocked on, then (ring of C batches + a stage blocked with one batch) twice,
      // ring C, source blocked.
      const std::uint64_t taken = pl.trigger + 1;
      const std::uint64_t r = B - (taken + C) % B;
      pl.saturated = taken + C + r + 2 * (C * B + B) + C + 1;
      break;
    }
    case where::sink:  // src -> pass -> sink x w (thrower)
      // Upstream: w items in sink calls, ring C, pass blocked 1, ring C, source blocked 1.
      pl.trigger = 0;
      pl.saturated = w + 2 * C + 2;
      break;
  }
}

void require_conserved(const item_counts& c) {
  CAPTURE(c.produced, c.completed, c.failed, c.cancelled);
  REQUIRE(c.produced == c.completed + c.failed + c.cancelled);
}

// The error thrown by a waiting call: a stage_error naming the stage and the item, the
// user's exception nested with its own type, both ways of getting it back.
void require_stage_error(const std::exception_ptr& ep, const std::string& stage,
                         std::uint64_t item) {
  REQUIRE(ep);
  try {
    std::rethrow_exception(ep);
  } catch (const stage_error& e) {
    CAPTURE(e.what());
    CHECK(e.stage() == stage);
    CHECK(e.item() == item);
    CHECK_THROWS_AS(e.rethrow_nested(), boom);
    try {
      std::rethrow_if_nested(e);
      FAIL("std::rethrow_if_nested found nothing nested");
    } catch (const boom& b) {
      CHECK(b.item == item);
    }
  } catch (const std::exception& e) {
    FAIL("expected conveyor::stage_error, got: " << e.what());
  }
}

template <class Make>
void exercise(plan& pl, ending how, Make make) {
  const long live_before = counted::live.load();
  {
    auto p = make();
    std::exception_ptr ep;
    try {
      switch (how) {
        case ending::run:
          p.run();
          break;
        case ending::stop_drain:
        case ending::stop_cancel:
          p.start();
          pl.thrown.wait(false);
          p.stop(how == ending::stop_drain ? stop_mode::drain : stop_mode::cancel);
          break;
        case ending::destroy:
          p.start();
          pl.thrown.wait(false);
          break;  // the destructor stops and joins; no wait()
      }
    } catch (...) {
      ep = std::current_exception();
    }
    REQUIRE(pl.thrown.load());
    if (how != ending::destroy) {
      const std::uint64_t item = pl.failed_item.load();
      require_stage_error(ep, name_of(pl.at), item);
      if (pl.workers == 1 || pl.by_item) {
        // One worker sees items in source order: call k holds item k (batch k: item k*B).
        CHECK(item == pl.trigger * (pl.at == where::batch_map ? B : 1));
      }
      const item_counts c = p.counts();
      require_conserved(c);
      CHECK(c.failed == pl.items_failed());
      if (pl.at == where::source) CHECK(c.produced == pl.trigger);
    }
  }
  REQUIRE(counted::live.load() == live_before);  // nothing leaked, also without wait()
}

void run_scenario(plan& pl, ending how) {
  auto src = [&pl] {
    return source([&pl]() -> std::optional<counted> {
             const std::uint64_t k = pl.fed.fetch_add(1);
             if (pl.at == where::source) pl.at_call(k);
             return counted{k};
           })
        .name("src");
  };
  auto pass = [] { return map([](counted c) { return c; }).name("pass"); };
  auto out = [&pl] {
    return sink([&pl](counted c) {
             if (pl.at == where::sink)
               pl.at_call(c.value);
             else
               pl.gate();
           })
        .workers(pl.at == where::sink ? pl.workers : 1)
        .name("out");
  };
  auto thrower = [&pl] { return throwing_map(pl); };
  const pipeline_options small{.ring_capacity = C};
  switch (pl.at) {
    case where::source:
    case where::sink:
      exercise(pl, how, [&] { return pipeline{src() | pass() | out(), small}; });
      break;
    case where::map:
      exercise(pl, how, [&] { return pipeline{src() | thrower().name("thrower") | out(), small}; });
      break;
    case where::batch_map:
      exercise(pl, how, [&] {
        return pipeline{src() | batch(B).name("batch") | map([&pl](std::vector<counted> v) {
                                                           pl.at_call(v.front().value);
                                                           return v;
                                                         }).name("per-batch") |
                            unbatch() | out(),
                        small};
      });
      break;
    case where::map_after_unbatch:
      exercise(pl, how, [&] {
        return pipeline{src() | batch(B).name("batch") |
                            map([](std::vector<counted> v) { return v; }).name("pass-batch") |
                            unbatch() | thrower().name("after-unbatch") | out(),
                        small};
      });
      break;
  }
}

struct position {
  where at;
  std::size_t workers;
  bool ordered;
};

}  // namespace

TEST_CASE("errors: a throw at any stage position with rings empty or full stops and rethrows") {
  const position pos = GENERATE(values<position>({{where::source, 1, false},
                                                  {where::map, 1, false},
                                                  {where::map, 1, true},
                                                  {where::map, 3, false},
                                                  {where::map, 3, true},
                                                  {where::batch_map, 1, false},
                                                  {where::map_after_unbatch, 1, false},
                                                  {where::sink, 1, false},
                                                  {where::sink, 2, false}}));
  const bool full = GENERATE(false, true);
  const ending how =
      GENERATE(ending::run, ending::stop_drain, ending::stop_cancel, ending::destroy);
  plan pl;
  pl.at = pos.at;
  pl.workers = pos.workers;
  pl.ordered = pos.ordered;
  pl.full = full;
  configure(pl);
  CAPTURE(name_of(pos.at), pos.workers, pos.ordered, full, static_cast<int>(how), pl.trigger,
          pl.saturated);
  run_scenario(pl, how);
}

TEST_CASE("errors: a map between batch and unbatch that changes the batch length fails unbatch") {
  const bool grow = GENERATE(false, true);
  CAPTURE(grow);
  const long live_before = counted::live.load();
  {
    const std::uint64_t n = 40;
    pipeline p{source([i = std::uint64_t{0}]() mutable -> std::optional<counted> {
                 if (i == n) return std::nullopt;
                 return counted{i++};
               }) | batch(4).name("batch") |
                   map([grow](std::vector<counted> v) {
                     if (v.front().value == 8) {
                       if (grow)
                         v.emplace_back(99);
                       else
                         v.pop_back();
                     }
                     return v;
                   }).name("resize") |
                   unbatch().name("unb") | sink([](counted) {}).name("out"),
               pipeline_options{.ring_capacity = C}};
    try {
      p.run();
      FAIL("run() returned normally");
    } catch (const stage_error& e) {
      CAPTURE(e.what());
      CHECK(e.stage() == "unb");
      CHECK(e.item() == 8);  // the batch's first item
      CHECK_THAT(e.what(), Catch::Contains("one element per item"));
      try {
        e.rethrow_nested();
      } catch (const stage_error&) {
        FAIL("the nested exception is another stage_error");
      } catch (const error& inner) {
        CHECK_THAT(inner.what(), Catch::Contains("one element per item"));
      }
    }
    const item_counts c = p.counts();
    require_conserved(c);
    CHECK(c.failed == 4);  // the items of the batch that can no longer be told apart
    CHECK(c.produced <= n);
  }
  REQUIRE(counted::live.load() == live_before);
}

namespace {

enum class svc_end { stop_drain, stop_cancel, wait };

template <class Make>
void exercise_service(plan& pl, svc_end end, std::uint64_t n, Make make) {
  const long live_before = counted::live.load();
  {
    std::vector<std::future<counted>> futures;
    auto p = make();
    p.start();
    for (std::uint64_t i = 0; i < n; ++i) {
      try {
        futures.push_back(p.submit(counted{i}));
      } catch (const closed_error&) {
        break;  // the failure closed the input before this submit got a ticket
      }
      pl.fed.fetch_add(1);
    }
    pl.thrown.wait(false);
    std::exception_ptr ep;
    try {
      if (end == svc_end::wait)
        p.wait();
      else
        p.stop(end == svc_end::stop_drain ? stop_mode::drain : stop_mode::cancel);
    } catch (...) {
      ep = std::current_exception();
    }
    const std::uint64_t failed_item = pl.failed_item.load();
    require_stage_error(ep, name_of(pl.at), failed_item);
    const item_counts c = p.counts();
    require_conserved(c);
    CHECK(c.produced == futures.size());
    CHECK(c.failed == pl.items_failed());

    std::uint64_t values = 0, stage_errors = 0, closed = 0;
    for (std::size_t i = 0; i < futures.size(); ++i) {
      CAPTURE(i);
      // After the waiting call every promise is settled: no future can hang.
      REQUIRE(futures[i].wait_for(std::chrono::seconds(0)) == std::future_status::ready);
      try {
        const counted v = futures[i].get();  // outside CHECK: CHECK would swallow a throw
        CHECK(v.value == i);
        ++values;
      } catch (const stage_error& e) {
        ++stage_errors;
        CHECK(e.stage() == name_of(pl.at));
        if (i == failed_item) CHECK_THROWS_AS(e.rethrow_nested(), boom);
      } catch (const closed_error&) {
        ++closed;
        CHECK(i != failed_item);
      }
    }
    CHECK(values == c.completed);
    CHECK(stage_errors >= pl.items_failed());
    CHECK(values + stage_errors + closed == futures.size());
  }
  REQUIRE(counted::live.load() == live_before);
}

}  // namespace

TEST_CASE("errors: service mode: the futures of items in flight get the error and none hangs") {
  const position pos = GENERATE(values<position>({{where::map, 1, false},
                                                  {where::map, 3, false},
                                                  {where::map, 2, true},
                                                  {where::batch_map, 1, false},
                                                  {where::map_after_unbatch, 1, false}}));
  const bool in_flight = GENERATE(false, true);
  const svc_end end = GENERATE(svc_end::stop_drain, svc_end::stop_cancel, svc_end::wait);
  const std::uint64_t n = 10 * B;  // a multiple of the batch size: every batch is full
  plan pl;
  pl.at = pos.at;
  pl.workers = pos.workers;
  pl.ordered = pos.ordered;
  // in flight: the first call waits until all n are submitted (and each other worker
  // holds one), so the rest sit in rings and stages when it throws.
  pl.full = in_flight;
  pl.trigger = 0;
  pl.saturated = n;
  CAPTURE(name_of(pos.at), pos.workers, pos.ordered, in_flight, static_cast<int>(end));
  auto thrower = [&pl] { return throwing_map(pl); };
  switch (pos.at) {
    case where::map:
      exercise_service(pl, end, n, [&] {
        return pipeline{input<counted>() | thrower().name("thrower"),
                        pipeline_options{.ring_capacity = C, .errors = error_policy::stop}};
      });
      break;
    case where::batch_map:
      exercise_service(pl, end, n, [&] {
        return pipeline{input<counted>() | batch(B).name("batch") |
                            map([&pl](std::vector<counted> v) {
                              pl.at_call(v.front().value);
                              return v;
                            }).name("per-batch") |
                            unbatch(),
                        pipeline_options{.ring_capacity = C, .errors = error_policy::stop}};
      });
      break;
    case where::map_after_unbatch:
      exercise_service(pl, end, n, [&] {
        return pipeline{input<counted>() | batch(B).name("batch") |
                            map([](std::vector<counted> v) { return v; }).name("pass-batch") |
                            unbatch() | thrower().name("after-unbatch"),
                        pipeline_options{.ring_capacity = C, .errors = error_policy::stop}};
      });
      break;
    default:
      FAIL("no service variant for this position");
  }
}

TEST_CASE("errors: service mode: submit() after a stage failed then stop() settles every future") {
  // A client that keeps submitting after the failure: each later submit either gets a
  // future that is already settled (the closed input refused the item) or closed_error.
  // stop() must still rethrow the stage's error, not a promise error.
  const svc_end end = GENERATE(svc_end::stop_drain, svc_end::stop_cancel, svc_end::wait);
  CAPTURE(static_cast<int>(end));
  const long live_before = counted::live.load();
  {
    plan pl;
    pl.at = where::map;
    pipeline p{input<counted>() | map([&pl](counted c) {
                                    pl.at_call(c.value);
                                    return c;
                                  }).name("thrower"),
               pipeline_options{.ring_capacity = C, .errors = error_policy::stop}};
    p.start();
    std::vector<std::future<counted>> futures;
    futures.push_back(p.submit(counted{0}));  // throws in the map
    pl.thrown.wait(false);
    bool refused = false;
    for (std::uint64_t i = 1; !refused; ++i) {
      try {
        futures.push_back(p.submit(counted{i}));
        // A future settled at once: the input ring was closed by the failure.
        refused = futures.back().wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      } catch (const closed_error&) {
        refused = true;
      }
    }
    std::exception_ptr ep;
    try {
      if (end == svc_end::wait)
        p.wait();
      else
        p.stop(end == svc_end::stop_drain ? stop_mode::drain : stop_mode::cancel);
    } catch (...) {
      ep = std::current_exception();
    }
    require_stage_error(ep, "thrower", 0);
    const item_counts c = p.counts();
    require_conserved(c);
    CHECK(c.produced == futures.size());
    CHECK(c.failed == 1);
    for (auto& f : futures) {
      REQUIRE(f.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
      CHECK_THROWS_AS(f.get(), error);  // stage_error, or closed_error once refused
    }
  }
  REQUIRE(counted::live.load() == live_before);
}

TEST_CASE("errors: destroying a healthy started pipeline stops it and joins and frees everything") {
  const long live_before = counted::live.load();
  SECTION("source pipeline, never waited for") {
    std::atomic<std::uint64_t> seen{0};
    {
      pipeline p{source([i = std::uint64_t{0}]() mutable -> std::optional<counted> {
                   return counted{i++};
                 }) |  // endless
                     map([](counted c) { return c; }).workers(2).ordered() |
                     batch(B) | unbatch() | sink([&](counted) { seen.fetch_add(1); }),
                 pipeline_options{.ring_capacity = C}};
      p.start();
      while (seen.load() < 100) std::this_thread::yield();
    }
    CHECK(seen.load() >= 100);
  }
  SECTION("service pipeline with futures outstanding") {
    std::vector<std::future<counted>> futures;
    {
      pipeline svc{
          input<counted>() | map([](counted c) { return c; }).workers(2) | batch(B) | unbatch(),
          pipeline_options{.ring_capacity = C}};
      svc.start();
      for (std::uint64_t i = 0; i < 30; ++i) futures.push_back(svc.submit(counted{i}));
    }
    for (std::size_t i = 0; i < futures.size(); ++i) {
      CAPTURE(i);
      REQUIRE(futures[i].wait_for(std::chrono::seconds(0)) == std::future_status::ready);
      try {
        const counted v = futures[i].get();  // completed before the destructor stopped it
        CHECK(v.value == i);
      } catch (const closed_error&) {
        // cancelled by the destructor
      }
    }
  }
  REQUIRE(counted::live.load() == live_before);
}
