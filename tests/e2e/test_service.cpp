// Service pipelines (input<T>(), submit, try_submit) end to end on the host: the input's
// capacity bounds what the service holds; futures and callbacks each settle once, with
// the result, a cancellation or the failure; stop(drain) completes and stop(cancel)
// accounts for every item; every item's latency is recorded; after a stage fails every
// accepted item is settled at once, without stop() or wait(), and a later submit() says
// why it refuses. (Error paths at every stage position: test_errors.cpp; allocation per
// item: test_service_alloc.cpp.)
#include "conveyor/pipeline.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <mutex>
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

// A service: x * 2 on 2 workers, batches of 4, + 1 each, unbatched: x gives 2x + 1.
auto doubling_service() {
  return pipeline{input<int>() | map([](int x) { return x * 2; }).workers(2) | batch(4) |
                  map([](std::vector<int> v) {
                    for (int& x : v) x += 1;
                    return v;
                  }) |
                  unbatch()};
}

// A service whose 2 workers hold each item until `release` is set, then pass it on.
auto gated_service(std::atomic<bool>& release) {
  return pipeline{input<int>() | map([&release](int x) {
                                   while (!release.load()) std::this_thread::yield();
                                   return x;
                                 }).workers(2)};
}

// Stops a gated service with cancel while another thread opens the gate 5 ms later, so
// the stop lands with items held, in flight and queued. Checks the accounting.
template <class Svc>
auto cancel_under_load(Svc& svc, std::atomic<bool>& release) {
  std::thread releaser{[&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    release.store(true);
  }};
  const auto c = svc.stop(stop_mode::cancel);
  releaser.join();
  require_conserved(c);
  return c;
}

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

TEST_CASE("service: after a stage fails every accepted item is settled without stop() or wait()") {
  // With error_policy::stop: four clients submit ids 0, 1, 2, ... (each takes the next)
  // until refused; the map throws on id k. Every item accepted is settled exactly once — with its result, the
  // error that stopped the pipeline (the stage_error for id k, which id k's own item
  // gets too), or closed_error if the stopping pipeline refused it as it went in — and
  // all of them before anyone calls stop() or wait().
  const std::size_t workers = GENERATE(1u, 2u);
  const bool callbacks = GENERATE(false, true);
  CAPTURE(workers, callbacks);
  constexpr std::uint64_t k = 300;
  constexpr int clients = 4;
  constexpr std::uint64_t max_ids = 50000;  // a bound: clients stop once refused
  pipeline svc{input<std::uint64_t>() |
                   map([](std::uint64_t x) {
                     if (x == k) throw boom{x};
                     return 2 * x;
                   })
                       .workers(workers)
                       .name("thrower") |
                   map([](std::uint64_t x) { return x + 1; }).name("plus one"),
               pipeline_options{.errors = error_policy::stop}};
  svc.start();

  // What each id got, written by whichever thread settles it (callbacks) or read from
  // its future (futures). settles[id] counts the callback's calls.
  std::vector<std::optional<outcome<std::uint64_t>>> got(max_ids);
  std::vector<std::atomic<int>> settles(max_ids);
  std::atomic<std::uint64_t> settled{0};
  std::vector<std::future<std::uint64_t>> futures(max_ids);
  std::vector<std::uint8_t> accepted(max_ids, 0);  // each id written by one client
  std::vector<std::string> refusals(clients);
  std::atomic<std::uint64_t> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      for (;;) {
        const std::uint64_t id = next.fetch_add(1);
        if (id >= max_ids) return;
        try {
          if (callbacks) {
            svc.submit(std::uint64_t{id}, [&, id](outcome<std::uint64_t> r) noexcept {
              got[id] = std::move(r);
              settles[id].fetch_add(1);
              settled.fetch_add(1);  // after got[id]: the reader below waits for it
            });
          } else {
            futures[id] = svc.submit(std::uint64_t{id});
          }
          accepted[id] = 1;
        } catch (const closed_error& e) {
          refusals[static_cast<std::size_t>(c)] = e.what();
          return;
        }
      }
    });
  for (auto& th : threads) th.join();
  std::uint64_t n_accepted = 0;
  for (std::uint8_t a : accepted) n_accepted += a;
  REQUIRE(accepted[k] == 1);      // no refusal comes before id k has failed
  REQUIRE(n_accepted < max_ids);  // the failure stopped the clients

  // Every item is settled, and neither stop() nor wait() has been called.
  if (callbacks) {
    const auto deadline = std::chrono::steady_clock::now() + hang_guard;
    while (settled.load() < n_accepted && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    REQUIRE(settled.load() == n_accepted);
  } else {
    for (std::uint64_t id = 0; id < max_ids; ++id) {
      if (accepted[id] == 0) continue;
      CAPTURE(id);
      REQUIRE(futures[id].wait_for(hang_guard) == std::future_status::ready);
      try {
        got[id] = outcome<std::uint64_t>::success(futures[id].get());
      } catch (...) {
        got[id] = outcome<std::uint64_t>::failure(std::current_exception());
      }
    }
  }

  // What each item got.
  std::uint64_t values = 0, stage_errors = 0, closed = 0;
  std::set<std::uint64_t> failed_items;  // the item numbers the stage_errors name
  for (std::uint64_t id = 0; id < max_ids; ++id) {
    if (accepted[id] == 0) {
      REQUIRE_FALSE(got[id].has_value());  // refused: never settled
      continue;
    }
    CAPTURE(id);
    REQUIRE(got[id].has_value());
    try {
      const std::uint64_t v = got[id]->value();  // rethrows the item's error
      CHECK(v == 2 * id + 1);
      CHECK(id != k);
      ++values;
    } catch (const stage_error& e) {
      ++stage_errors;
      CHECK(e.stage() == "thrower");
      failed_items.insert(e.item());
      CHECK_THROWS_MATCHES(e.rethrow_nested(), boom,
                           Catch::Predicate<boom>([](const boom& b) { return b.item == k; }));
    } catch (const closed_error& e) {  // the stopping pipeline's input refused it
      ++closed;
      CHECK(id != k);  // id k was taken: it failed in the stage
      CHECK_THAT(e.what(), Contains("stopped before the item was accepted"));
    }
  }
  // Id k's own item got the stage's error, and every stage_error is that one.
  REQUIRE(got[k].has_value());
  REQUIRE_FALSE(got[k]->has_value());
  REQUIRE_THROWS_AS(got[k]->value(), stage_error);
  REQUIRE(failed_items.size() == 1);
  const std::uint64_t failed_item = *failed_items.begin();
  CHECK(failed_item < n_accepted);

  // Each client was refused with why the pipeline stopped, and so is a new call.
  const std::string why = "the pipeline stopped because stage 'thrower' failed on item " +
                          std::to_string(failed_item) + ": boom on " + std::to_string(k);
  for (const std::string& r : refusals) CHECK_THAT(r, Contains("submit() refused: " + why));
  REQUIRE_THROWS_AS(svc.submit(std::uint64_t{1}), closed_error);
  REQUIRE_THROWS_WITH(svc.submit(std::uint64_t{1}), Contains("submit() refused: " + why));
  REQUIRE_THROWS_WITH(svc.try_submit(std::uint64_t{1}), Contains("try_submit() refused: " + why));
  REQUIRE_THROWS_WITH(
      svc.submit(std::uint64_t{1},
                 [&](outcome<std::uint64_t>) noexcept { settled.fetch_add(1000000); }),
      Contains(why));

  // stop() rethrows the failure; the report accounts for every item; nothing was
  // settled twice (a refused call's callback never runs).
  REQUIRE_THROWS_AS(svc.stop(stop_mode::drain), stage_error);
  const conveyor::report r = svc.report();
  require_conserved(r);
  CHECK(r.produced == n_accepted);
  CHECK(r.failed == 1);
  CHECK(r.completed == values);
  CHECK(r.failed + r.cancelled == stage_errors + closed);
  if (callbacks) {
    REQUIRE(settled.load() == n_accepted);
    for (std::uint64_t id = 0; id < max_ids; ++id) REQUIRE(settles[id].load() == accepted[id]);
  }
}

TEST_CASE("service: every item's latency is recorded, tickets reused") {
  // More items than tickets (1024): each ticket carries several items in turn.
  pipeline svc{input<int>() | map([](int x) { return x + 1; }), pipeline_options{.metrics = true}};
  svc.start();
  std::vector<std::future<int>> futures;
  constexpr int n = 3000;
  for (int i = 0; i < n; ++i) {
    futures.push_back(svc.submit(int{i}));
    if (futures.size() == 512) {  // keep some tickets free: submit() never waits long
      for (auto& f : futures) (void)f.get();
      futures.clear();
    }
  }
  for (auto& f : futures) (void)f.get();
  const report r = svc.stop(stop_mode::drain);
  require_conserved(r);
  REQUIRE(r.completed == n);
  REQUIRE(r.item_latency.count == n);
  REQUIRE(r.item_latency.p50_s > 0.0);
  REQUIRE(r.item_latency.max_s <= r.wall_s);
}

TEST_CASE("service: submit returns futures, stop(drain) completes all") {
  auto svc = doubling_service();
  svc.start();
  std::vector<std::future<int>> futures;
  std::vector<std::thread> clients;
  std::mutex m;
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&, c] {
      for (int i = 0; i < 250; ++i) {
        auto f = svc.submit(c * 1000 + i);
        std::lock_guard lock{m};
        futures.push_back(std::move(f));
      }
    });
  for (auto& th : clients) th.join();
  const auto c = svc.stop(stop_mode::drain);
  require_conserved(c);
  REQUIRE(c.completed == 1000);
  long sum = 0;
  for (auto& f : futures) sum += f.get();
  long expected = 0;
  for (int c2 = 0; c2 < 4; ++c2)
    for (int i = 0; i < 250; ++i) expected += 2 * (c2 * 1000 + i) + 1;
  REQUIRE(sum == expected);
  REQUIRE_THROWS_AS(svc.submit(1), closed_error);
}

TEST_CASE("service: stop(cancel) under load accounts for every item") {
  std::atomic<bool> release{false};
  auto svc = gated_service(release);
  svc.start();
  std::vector<std::future<int>> futures;
  for (int i = 0; i < 100; ++i) futures.push_back(svc.submit(int{i}));
  const auto c = cancel_under_load(svc, release);
  REQUIRE(c.produced == 100);
  REQUIRE(c.cancelled >= 98 - c.completed);
  std::size_t ok = 0, cancelled = 0;
  for (auto& f : futures) {
    try {
      f.get();
      ++ok;
    } catch (const closed_error&) {
      ++cancelled;
    }
  }
  REQUIRE(ok == c.completed);
  REQUIRE(ok + cancelled == 100);
}

TEST_CASE("service: submit with a callback calls it once per item with its result") {
  auto svc = doubling_service();
  svc.start();
  constexpr int clients = 4, per_client = 500;
  std::atomic<long> sum{0};
  std::atomic<int> calls{0}, errors{0};
  std::vector<std::atomic<int>> seen(clients * per_client);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      for (int i = 0; i < per_client; ++i) {
        const int id = c * per_client + i;
        svc.submit(id, [&, id](outcome<int> r) noexcept {
          seen[static_cast<std::size_t>(id)].fetch_add(1);
          calls.fetch_add(1);
          if (!r) {
            errors.fetch_add(1);
            return;
          }
          if (*r != 2 * id + 1) errors.fetch_add(1);
          sum.fetch_add(*r);
        });
      }
    });
  for (auto& th : threads) th.join();
  const auto c = svc.stop(stop_mode::drain);
  require_conserved(c);
  REQUIRE(c.completed == clients * per_client);
  REQUIRE(calls.load() == clients * per_client);
  REQUIRE(errors.load() == 0);
  REQUIRE(std::all_of(seen.begin(), seen.end(), [](const auto& n) { return n.load() == 1; }));
  long expected = 0;
  for (int id = 0; id < clients * per_client; ++id) expected += 2 * id + 1;
  REQUIRE(sum.load() == expected);
  REQUIRE_THROWS_AS(svc.submit(1, [](outcome<int>) noexcept {}), closed_error);
  REQUIRE(calls.load() == clients * per_client);  // a refused call gets no callback
}

TEST_CASE("service: submit with a callback settles cancelled and failed items too") {
  SECTION("stop(cancel): every item gets its result or closed_error, exactly once") {
    std::atomic<bool> release{false};
    auto svc = gated_service(release);
    svc.start();
    std::atomic<int> ok{0}, cancelled{0}, other{0};
    for (int i = 0; i < 100; ++i)
      svc.submit(int{i}, [&](outcome<int> r) noexcept {
        if (r) {
          ok.fetch_add(1);
          return;
        }
        try {
          std::rethrow_exception(r.error());
        } catch (const closed_error&) {
          cancelled.fetch_add(1);
        } catch (...) {
          other.fetch_add(1);
        }
      });
    const auto c = cancel_under_load(svc, release);
    REQUIRE(c.produced == 100);
    REQUIRE(static_cast<std::uint64_t>(ok.load()) == c.completed);
    REQUIRE(ok.load() + cancelled.load() == 100);
    REQUIRE(other.load() == 0);
  }
  SECTION("a stage throws (error_policy::stop): the failed and the stranded items get it") {
    pipeline svc{input<int>() | map([](int x) {
                   if (x == 50) throw std::runtime_error("bad item");
                   return x;
                 }),
                 pipeline_options{.errors = error_policy::stop}};
    svc.start();
    std::atomic<int> ok{0}, failed{0}, calls{0};
    int submitted = 0;
    try {
      for (int i = 0; i < 1000; ++i) {
        svc.submit(int{i}, [&](outcome<int> r) noexcept {
          calls.fetch_add(1);
          if (r) {
            ok.fetch_add(1);
            return;
          }
          try {
            (void)r.value();  // rethrows
          } catch (const stage_error&) {
            failed.fetch_add(1);
          } catch (const closed_error&) {  // submitted as the pipeline stopped
            failed.fetch_add(1);
          }
        });
        ++submitted;
      }
    } catch (const closed_error&) {  // the pipeline stopped: submit refuses
    }
    REQUIRE_THROWS_AS(svc.wait(), stage_error);
    const auto c = svc.counts();
    require_conserved(c);
    REQUIRE(c.failed == 1);
    REQUIRE(calls.load() == submitted);
    REQUIRE(static_cast<std::uint64_t>(ok.load()) == c.completed);
    REQUIRE(ok.load() + failed.load() == submitted);
    REQUIRE(failed.load() >= 1);
  }
}

TEST_CASE("service: try_submit refuses when full and leaves the item intact") {
  std::atomic<bool> release{false};
  pipeline svc{input<std::string>() | map([&](std::string x) {
                 while (!release.load()) std::this_thread::yield();
                 return x.size();
               })};
  const conveyor::test::release_on_exit open_gate{release};  // after svc: see test_support.hpp
  svc.start();
  std::atomic<int> calls{0};
  std::size_t accepted = 0;
  std::vector<std::future<std::size_t>> futures;
  for (;;) {  // the stage holds everything: tickets run out
    std::string x(accepted % 7, 'x');
    if (accepted % 2 == 0) {
      if (!svc.try_submit(std::move(x),
                          [&calls](outcome<std::size_t>) noexcept { calls.fetch_add(1); }))
        break;
    } else {
      auto f = svc.try_submit(std::move(x));
      if (!f) break;
      futures.push_back(std::move(*f));
    }
    ++accepted;
    REQUIRE(accepted <= 4096);  // a bound, or the loop would never end
  }
  CHECK(accepted == 1024);  // the service's in-flight bound
  std::string kept = "still here";
  REQUIRE_FALSE(svc.try_submit(std::move(kept),
                               [&calls](outcome<std::size_t>) noexcept { calls.fetch_add(1); }));
  REQUIRE(kept == "still here");  // refused: not moved from
  REQUIRE_FALSE(svc.try_submit(std::move(kept)).has_value());
  REQUIRE(kept == "still here");
  release.store(true);
  const auto c = svc.stop(stop_mode::drain);
  require_conserved(c);
  REQUIRE(c.completed == accepted);
  REQUIRE(static_cast<std::size_t>(calls.load()) + futures.size() == accepted);
  for (std::size_t i = 0; i < futures.size(); ++i) REQUIRE(futures[i].get() == (2 * i + 1) % 7);
  REQUIRE_THROWS_AS(svc.try_submit(std::string{}), closed_error);
}

TEST_CASE("service: a callback submits the follow-up item with try_submit") {
  const auto inc = [](int x) { return x + 1; };
  using svc_t = decltype(pipeline{input<int>() | map(inc).workers(2)});
  svc_t svc{input<int>() | map(inc).workers(2)};
  svc.start();
  // Each chain counts from its start up to 100, one item per hop, each hop submitted by
  // the callback of the one before it.
  struct chain_state {
    svc_t* svc;
    std::atomic<int> finished{0}, refused{0};
    void hop(outcome<int> r) noexcept {
      if (!r) return;
      if (*r >= 100) {
        finished.fetch_add(1);
        return;
      }
      try {
        if (!svc->try_submit(int{*r}, [this](outcome<int> next) noexcept { hop(std::move(next)); }))
          refused.fetch_add(1);
      } catch (...) {  // stopped: not expected before every chain finished
        refused.fetch_add(1);
      }
    }
  } chains{&svc};
  constexpr int n_chains = 16;
  for (int c = 0; c < n_chains; ++c)
    svc.submit(c, [&chains](outcome<int> r) noexcept { chains.hop(std::move(r)); });
  while (chains.finished.load() + chains.refused.load() < n_chains) std::this_thread::yield();
  const auto c = svc.stop(stop_mode::drain);
  require_conserved(c);
  REQUIRE(chains.refused.load() == 0);  // 16 chains never fill 1024 tickets
  REQUIRE(chains.finished.load() == n_chains);
  long hops = 0;
  for (int s = 0; s < n_chains; ++s) hops += 100 - s;  // chain s: s -> s+1 -> ... -> 100
  REQUIRE(c.completed == static_cast<std::uint64_t>(hops));
}
