// The latency-target batcher's controller (stage/detail/latency_controller.hpp) and its
// way back from the pipeline's end (batch_feedback.hpp), driven by synthetic traces: a
// discrete-event simulation of a batch stage in front of one server whose time per batch
// is a + b * n. Arrival times come from a seeded generator of our own (the same numbers
// on every platform), service times from the formula: no clock is read, so every run makes
// the same decisions and no assertion depends on how fast the machine is.
#include "conveyor/stage/detail/latency_controller.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "conveyor/stage/detail/batch_feedback.hpp"

using namespace conveyor;
using detail::batch_outcome;
using detail::latency_controller;

namespace {

constexpr std::int64_t ms = 1'000'000;

// splitmix64: a small generator whose sequence is the same everywhere.
struct splitmix {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
};

// Poisson arrivals whose rate (items per second) follows rate(t_ns), for `seconds`: the
// gaps are exponential at the rate of the moment they start.
std::vector<std::int64_t> poisson_trace(const std::function<double(std::int64_t)>& rate,
                                        double seconds, std::uint64_t seed) {
  std::vector<std::int64_t> t;
  splitmix g{seed};
  const auto end = static_cast<std::int64_t>(seconds * 1e9);
  for (std::int64_t now = 0;;) {
    now += static_cast<std::int64_t>(-std::log(g.uniform()) / rate(now) * 1e9);
    if (now >= end) break;
    t.push_back(now);
  }
  return t;
}

struct server_model {
  std::int64_t a_ns;      // per batch
  std::int64_t b_ns;      // per item
  double jitter = 0.0;    // each batch takes up to this fraction longer (deterministic)
  std::size_t lanes = 1;  // batches served at once
  // A stall: the first batch that starts at or after stall_at_ns takes stall_ns longer.
  std::int64_t stall_at_ns = -1;
  std::int64_t stall_ns = 0;
  // false: the batcher never reports a backlog (to show what the backlog rule prevents).
  bool backlog = true;
};

struct sim_result {
  std::vector<std::size_t> sizes;          // each batch's
  std::vector<std::int64_t> item_latency;  // by item, in arrival order
  std::vector<std::int64_t> arrival;
  std::vector<metrics::target_window> windows;  // the controller's, as they closed
  std::vector<double> slack_after;              // slack after each window
  metrics::target_miss_cause last_cause;
};

// CONVEYOR_TEST_DUMP=1: each window of a simulation on stderr (to study a rule change).
void dump(const sim_result& r) {
  if (std::getenv("CONVEYOR_TEST_DUMP") == nullptr) return;
  for (std::size_t w = 0; w < r.windows.size(); ++w) {
    const metrics::target_window& x = r.windows[w];
    std::fprintf(
        stderr, "%8.3f s  size %5.1f  largest %3zu  wait %6.2f ms  observed %6.2f ms  slack %.3f\n",
        static_cast<double>(x.start_ns) * 1e-9, x.mean_size(), x.largest, x.mean_wait_ns() * 1e-6,
        static_cast<double>(x.observed_ns) * 1e-6, r.slack_after[w]);
  }
}

// The batch stage of batch.hpp's run_to_target() against a server: items wait in the
// input ring until the batcher takes them; the batcher waits as the controller says,
// takes what is ready past the deadline, and holds while a batch it cut waits for the
// server (the backlog); a batch's first result comes back at its done time and reaches
// the controller when the batcher next starts a batch.
sim_result simulate(latency_controller& c, const std::vector<std::int64_t>& arrivals,
                    const server_model& m) {
  sim_result r;
  r.arrival = arrivals;
  r.item_latency.assign(arrivals.size(), 0);
  std::deque<batch_outcome> back;  // results not yet seen by the batcher
  std::vector<std::int64_t> lane_free(m.lanes, 0);
  splitmix jit{99};
  std::int64_t last_cut = 0;
  std::int64_t last_start = 0;  // when the last batch cut starts on the server
  bool stalled = false;
  std::size_t i = 0;
  while (i < arrivals.size()) {
    const std::size_t first = i;
    const std::int64_t first_at = std::max(arrivals[i], last_cut);
    while (!back.empty() && back.front().done_ns <= first_at) {
      if (c.completed(back.front())) {
        r.windows.push_back(c.last_window());
        r.slack_after.push_back(c.slack());
      }
      back.pop_front();
    }
    c.arrived(first_at, first_at - arrivals[i]);
    const std::int64_t budget = c.wait_ns(1);
    ++i;
    std::size_t size = 1;
    std::int64_t now = first_at;
    while (i < arrivals.size()) {
      // No batch is cut while this one fills: a backlog only ends.
      const bool backlog = m.backlog && last_start > now;
      const std::int64_t leave = c.deadline(first_at, size, backlog);
      if (leave < 0) break;
      if (arrivals[i] > now) {  // nothing ready: wait
        if (leave == latency_controller::hold) {
          now = std::min(arrivals[i], last_start);  // an item, or the backlog's end
          continue;
        }
        if (now >= leave || arrivals[i] > leave) {  // the deadline passes first
          now = std::max(now, leave);
          break;
        }
        now = arrivals[i];
      }
      c.arrived(now, -1);
      ++i;
      ++size;
    }
    const std::int64_t cut = now;
    last_cut = cut;
    c.cut(size, budget);
    r.sizes.push_back(size);
    // The lane free first takes it (FIFO across lanes).
    auto lane = std::min_element(lane_free.begin(), lane_free.end());
    const std::int64_t start = std::max(cut, *lane);
    last_start = start;
    auto svc = static_cast<std::int64_t>(
        static_cast<double>(m.a_ns + m.b_ns * static_cast<std::int64_t>(size)) *
        (1.0 + m.jitter * jit.uniform()));
    if (!stalled && m.stall_at_ns >= 0 && start >= m.stall_at_ns) {
      stalled = true;
      svc += m.stall_ns;
    }
    const std::int64_t done = start + svc;
    *lane = done;
    for (std::size_t k = first; k < i; ++k) r.item_latency[k] = done - arrivals[k];
    batch_outcome o{size, cut, done, done - arrivals[first], arrivals[i - 1] - arrivals[first]};
    // Results come back in done order.
    back.insert(std::upper_bound(back.begin(), back.end(), o,
                                 [](const batch_outcome& x, const batch_outcome& y) {
                                   return x.done_ns < y.done_ns;
                                 }),
                o);
  }
  r.last_cause = c.last_cause();
  dump(r);
  return r;
}

// The items' latency at quantile q per period of period_ns (by arrival), from `from_ns`:
// how many periods met the target, of how many.
struct period_score {
  std::size_t met = 0;
  std::size_t periods = 0;
  double fraction() const { return periods == 0 ? 0.0 : static_cast<double>(met) / periods; }
};
period_score score(const sim_result& r, double q, std::int64_t target, std::int64_t period_ns,
                   std::int64_t from_ns, std::int64_t to_ns = INT64_MAX) {
  period_score s;
  std::vector<std::int64_t> bucket;
  std::int64_t start = from_ns;
  const auto close = [&] {
    if (bucket.size() < 20) return;  // too few items for a percentile
    std::sort(bucket.begin(), bucket.end());
    const auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(bucket.size()))) - 1;
    ++s.periods;
    s.met += bucket[k] <= target ? 1 : 0;
  };
  for (std::size_t k = 0; k < r.arrival.size(); ++k) {
    if (r.arrival[k] < from_ns || r.arrival[k] >= to_ns) continue;
    while (r.arrival[k] >= start + period_ns) {
      close();
      bucket.clear();
      start += period_ns;
    }
    bucket.push_back(r.item_latency[k]);
  }
  close();
  return s;
}

// How often slack went down after from_window: each is a window whose target was missed.
std::size_t decreases(const sim_result& r, std::size_t from_window) {
  std::size_t n = 0;
  for (std::size_t w = std::max<std::size_t>(from_window, 1); w < r.slack_after.size(); ++w)
    n += r.slack_after[w] < r.slack_after[w - 1] ? 1 : 0;
  return n;
}

// Sustainable items/s with batches of n on the model (its mean jitter included).
double capacity(const server_model& m, std::size_t n) {
  return static_cast<double>(m.lanes) * static_cast<double>(n) * 1e9 /
         (static_cast<double>(m.a_ns + m.b_ns * static_cast<std::int64_t>(n)) *
          (1.0 + m.jitter / 2));
}

}  // namespace

TEST_CASE("latency_controller: steady Poisson loads stay within the target, batches within max") {
  const server_model m{1 * ms, 50'000, 0.2};
  constexpr std::size_t max = 32;
  const double cap = capacity(m, max);
  const double load = GENERATE(0.3, 0.6, 0.9);
  const double q = GENERATE(0.99, 0.95);
  CAPTURE(load, q);
  latency_controller c{{10 * ms, q, max}};
  const auto trace = poisson_trace([&](std::int64_t) { return load * cap; }, 8.0, 42);
  const sim_result r = simulate(c, trace, m);
  REQUIRE(*std::max_element(r.sizes.begin(), r.sizes.end()) <= max);
  // After a second of learning: at least 95% of 100 ms periods meet the target.
  const period_score s = score(r, q, 10 * ms, 100 * ms, 1000 * ms);
  CAPTURE(s.met, s.periods, c.slack());
  REQUIRE(s.periods >= 60);
  REQUIRE(s.fraction() >= 0.95);
  // No oscillation: once settled, the budget is cut at most twice more.
  REQUIRE(decreases(r, r.windows.size() / 4) <= 2);
  // Batches grow with the load: the batcher uses the room the target leaves.
  const double mean = static_cast<double>(trace.size()) / static_cast<double>(r.sizes.size());
  CAPTURE(mean);
  REQUIRE(mean > 1.5);
}

TEST_CASE("latency_controller: a 10x step up and down in the rate settles within a second") {
  const server_model m{1 * ms, 50'000, 0.2};
  constexpr std::size_t max = 32;
  const double cap = capacity(m, max);
  // 8% of capacity, 80% from 3 s to 6 s, 8% again to 9 s.
  const auto rate = [&](std::int64_t t) {
    return (t >= 3000 * ms && t < 6000 * ms ? 0.8 : 0.08) * cap;
  };
  latency_controller c{{10 * ms, 0.99, max}};
  const sim_result r = simulate(c, poisson_trace(rate, 9.0, 7), m);
  REQUIRE(*std::max_element(r.sizes.begin(), r.sizes.end()) <= max);
  // Each phase, from 1 s after its step on, meets the target in at least 95% of periods.
  for (const auto& [from, to] : {std::pair{1000 * ms, 3000 * ms}, std::pair{4000 * ms, 6000 * ms},
                                 std::pair{7000 * ms, 9000 * ms}}) {
    const period_score s = score(r, 0.99, 10 * ms, 100 * ms, from, to);
    CAPTURE(from, to, s.met, s.periods);
    REQUIRE(s.periods >= 15);
    REQUIRE(s.fraction() >= 0.95);
  }
  // Over the whole trace, steps included.
  const period_score all = score(r, 0.99, 10 * ms, 100 * ms, 1000 * ms);
  CAPTURE(all.met, all.periods);
  REQUIRE(all.fraction() >= 0.9);
}

TEST_CASE("latency_controller: a ramp from 10% to 90% of capacity and back") {
  const server_model m{1 * ms, 50'000, 0.2, 2};
  constexpr std::size_t max = 32;
  const double cap = capacity(m, max);
  const auto rate = [&](std::int64_t t) {
    const double x = static_cast<double>(t) / (5000.0 * ms);  // 0..2 over 10 s
    return (0.1 + 0.8 * (x < 1 ? x : 2 - x)) * cap;
  };
  latency_controller c{{8 * ms, 0.99, max}};
  const sim_result r = simulate(c, poisson_trace(rate, 10.0, 11), m);
  REQUIRE(*std::max_element(r.sizes.begin(), r.sizes.end()) <= max);
  const period_score s = score(r, 0.99, 8 * ms, 100 * ms, 1000 * ms);
  CAPTURE(s.met, s.periods);
  REQUIRE(s.fraction() >= 0.95);
  REQUIRE(decreases(r, r.windows.size() / 4) <= 4);
}

TEST_CASE("latency_controller: after a stall the backlog rule brings the service back") {
  // A 300 ms stall of the server at 3 s, at 60% of capacity: the items of the stall are
  // late whatever the batcher does; what matters is what comes after. The measured
  // service times then include the queue, so the cut rule alone asks for small batches,
  // which cannot keep up: without the backlog rule the service never recovers.
  server_model m{1 * ms, 50'000, 0.2};
  m.stall_at_ns = 3000 * ms;
  m.stall_ns = 300 * ms;
  constexpr std::size_t max = 32;
  const auto trace = poisson_trace([&](std::int64_t) { return 0.6 * capacity(m, max); }, 8.0, 21);
  latency_controller with{{10 * ms, 0.99, max}};
  const sim_result r = simulate(with, trace, m);
  REQUIRE(*std::max_element(r.sizes.begin(), r.sizes.end()) <= max);
  const period_score before = score(r, 0.99, 10 * ms, 100 * ms, 1000 * ms, 3000 * ms);
  const period_score after = score(r, 0.99, 10 * ms, 100 * ms, 4500 * ms);
  CAPTURE(before.met, before.periods, after.met, after.periods);
  REQUIRE(before.fraction() >= 0.95);
  REQUIRE(after.periods >= 30);
  REQUIRE(after.fraction() >= 0.95);
  m.backlog = false;
  latency_controller without{{10 * ms, 0.99, max}};
  const sim_result collapsed = simulate(without, trace, m);
  const period_score gone = score(collapsed, 0.99, 10 * ms, 100 * ms, 4500 * ms);
  CAPTURE(gone.met, gone.periods);
  REQUIRE(gone.fraction() < 0.5);
}

TEST_CASE("latency_controller: the same trace gives the same decisions") {
  const server_model m{1 * ms, 50'000, 0.2};
  const auto trace = poisson_trace([](std::int64_t) { return 5000.0; }, 2.0, 3);
  latency_controller a{{5 * ms, 0.99, 16}}, b{{5 * ms, 0.99, 16}};
  const sim_result ra = simulate(a, trace, m), rb = simulate(b, trace, m);
  REQUIRE(ra.sizes == rb.sizes);
  REQUIRE(ra.slack_after == rb.slack_after);
}

TEST_CASE("latency_controller: a target the server alone cannot meet is reported as such") {
  // 12 ms per batch of 1 against a 10 ms target: batches of one, no wait, and the reason.
  // (Without the backlog rule, which would fill a batch while the one before waits for
  // the server: here every batch follows the cut rule.)
  server_model m{12 * ms, 50'000};
  m.backlog = false;
  latency_controller c{{10 * ms, 0.99, 32}};
  const sim_result r = simulate(c, poisson_trace([](std::int64_t) { return 40.0; }, 20.0, 5), m);
  REQUIRE(!r.windows.empty());
  REQUIRE(r.windows.back().windows_met == 0);
  REQUIRE(r.last_cause.kind == metrics::target_miss::infeasible);
  REQUIRE(r.last_cause.service_one_ns >= 12 * ms);
  // Once s(2) is known to exceed the budget, every batch leaves with its first item.
  REQUIRE(c.wait_ns(1) < 0);
  REQUIRE(std::all_of(r.sizes.end() - 50, r.sizes.end(), [](std::size_t n) { return n == 1; }));
}

TEST_CASE("latency_controller: the cut and the wait follow the measured service times") {
  latency_controller c{{10 * ms, 0.99, 64}};
  // Nothing measured: the whole budget times the initial slack, at any size below max.
  REQUIRE(c.wait_ns(1) == static_cast<std::int64_t>(latency_controller::initial_slack * 10 * ms));
  REQUIRE(c.wait_ns(64) < 0);  // full
  // Batches of 4 take 2 ms, of 16 take 8 ms: a batch of 32 is predicted at 16 ms (scaled
  // up from the largest measured), over the budget: a batch holding 31 leaves at once.
  for (int k = 0; k < 4; ++k) {
    (void)c.completed({4, 0, 2 * ms, 2 * ms});
    (void)c.completed({16, 0, 8 * ms, 8 * ms});
  }
  REQUIRE(c.service_ns(4) == 2 * ms);
  REQUIRE(c.service_ns(16) == 8 * ms);
  REQUIRE(c.service_ns(32) == 16 * ms);
  REQUIRE(c.service_ns(2) == 2 * ms);  // from the bucket above: no less than measured there
  REQUIRE(c.wait_ns(31) < 0);
  REQUIRE(c.wait_ns(15) >= 0);
  // The wait shrinks as the batch grows.
  REQUIRE(c.wait_ns(3) > c.wait_ns(15));
  // Items that take 3 ms to reach the batch leave less budget.
  const std::int64_t before = c.wait_ns(3);
  for (int k = 0; k < 64; ++k) c.arrived(k * ms, 3 * ms);
  REQUIRE(c.upstream_ns() == 3 * ms);
  REQUIRE(c.wait_ns(3) < before);
  REQUIRE(c.arrival_rate_per_s() == Approx(1000.0));
}

TEST_CASE("latency_controller: slack is cut on a missed window and raised on a comfortable one") {
  latency_controller c{{10 * ms, 0.99, 16}};
  const double s0 = c.slack();
  std::int64_t t = 0;
  const auto window = [&](std::int64_t latency) {
    bool closed = false;
    for (std::size_t k = 0; k < latency_controller::window_batches; ++k) {
      t += ms;
      closed = c.completed({4, t, t + ms, latency});
    }
    return closed;
  };
  REQUIRE(window(20 * ms));  // every batch late: a miss
  REQUIRE(c.slack() == Approx(s0 * latency_controller::decrease));
  REQUIRE(c.last_window().windows_met == 0);
  REQUIRE(c.last_cause().kind == metrics::target_miss::tail);
  REQUIRE(window(2 * ms));  // comfortable
  REQUIRE(c.slack() == Approx(s0 * latency_controller::decrease + latency_controller::increase));
  REQUIRE(window(9 * ms));  // met, in the dead band: unchanged
  REQUIRE(c.slack() == Approx(s0 * latency_controller::decrease + latency_controller::increase));
  REQUIRE(c.last_window().windows_met == 1);
}

TEST_CASE("latency_controller: a window's percentile weighs each batch by its items") {
  std::array<latency_controller::sample, 4> v{{{5, 1.0}, {1, 10.0}, {9, 1.0}, {2, 88.0}}};
  // 100 items: 10 at 1, 88 at 2, 1 at 5, 1 at 9.
  REQUIRE(latency_controller::weighted_quantile(v, 4, 0.5) == 2);
  REQUIRE(latency_controller::weighted_quantile(v, 4, 0.98) == 2);
  REQUIRE(latency_controller::weighted_quantile(v, 4, 0.99) == 5);
  REQUIRE(latency_controller::weighted_quantile(v, 4, 1.0) == 9);
  // A batch of 23 items over 8 points weighs 2.875 per point, not 2.
  std::array<latency_controller::sample, 2> w{{{1, 2.875}, {2, 1.0}}};
  REQUIRE(latency_controller::weighted_quantile(w, 2, 0.7) == 1);  // 2.875 of 3.875
}

TEST_CASE("latency_target_log: counts every window, keeps a bounded history") {
  metrics::latency_target_log log{5 * ms, 0.95};
  for (std::size_t k = 0; k < 3 * metrics::latency_target_log::max_history; ++k) {
    metrics::target_window w;
    w.start_ns = static_cast<std::int64_t>(k) * ms;
    w.end_ns = w.start_ns + ms;
    w.windows_met = k % 3 == 0 ? 0 : 1;
    w.miss = k % 3 == 0 ? metrics::target_miss::tail : metrics::target_miss::none;
    w.batches = 2;
    w.items = 8;
    w.observed_ns = static_cast<std::int64_t>(k);
    log.record(w, {w.miss, 0, 0, static_cast<std::int64_t>(k), 0, 0.0, 0.0});
  }
  const metrics::latency_target_counters c = log.snapshot();
  REQUIRE(c.windows == 3 * metrics::latency_target_log::max_history);
  REQUIRE(c.windows_met == 2 * metrics::latency_target_log::max_history);
  REQUIRE(c.history.size() <= metrics::latency_target_log::max_history);
  REQUIRE(c.history.front().start_ns == 0);
  REQUIRE(c.history.back().end_ns == static_cast<std::int64_t>(c.windows) * ms);
  std::uint64_t windows = 0, items = 0;
  for (const auto& w : c.history) {
    windows += w.windows;
    items += w.items;
  }
  REQUIRE(windows == c.windows);
  REQUIRE(items == 8 * c.windows);
  REQUIRE(c.last_miss.kind == metrics::target_miss::tail);
}

TEST_CASE("batch_feedback: a batch's first item is claimed once, others and stale keys miss") {
  detail::batch_feedback fb;
  fb.sent(100, {10, 4, 8});
  REQUIRE(!fb.claim(101));
  const auto b = fb.claim(100);
  REQUIRE(b);
  REQUIRE(b->cut_ns == 10);
  REQUIRE(b->t0_ns == 4);
  REQUIRE(b->size == 8);
  REQUIRE(!fb.claim(100));  // taken
  fb.returned(*b, 30);
  const auto o = fb.take();
  REQUIRE(o);
  REQUIRE(o->size == 8);
  REQUIRE(o->done_ns - o->cut_ns == 20);
  REQUIRE(o->latency_ns == 26);
  REQUIRE(!fb.take());
}

TEST_CASE("batch_feedback: one batcher, several claimers: each batch comes back at most once") {
  detail::batch_feedback fb;
  constexpr std::uint64_t batches = 20000, size = 4;
  std::atomic<std::uint64_t> published{0};  // batches sent so far
  std::atomic<std::uint64_t> next{0};       // the next item a claimer takes
  std::vector<std::atomic<std::uint32_t>> claims(batches);
  std::atomic<std::uint64_t> wrong{0}, returned{0};
  std::vector<std::thread> claimers;
  // Two claimers share the items in order (as a terminal stage's workers); each also
  // tries the first item of its item's batch again, so both race for the same keys.
  for (int w = 0; w < 2; ++w)
    claimers.emplace_back([&] {
      for (;;) {
        const std::uint64_t seq = next.fetch_add(1);
        if (seq >= batches * size) break;
        while (published.load(std::memory_order_acquire) <= seq / size) std::this_thread::yield();
        for (const std::uint64_t key : {seq, seq - seq % size}) {
          const auto b = fb.claim(key);
          if (!b) continue;
          if (key % size != 0 || b->cut_ns != static_cast<std::int64_t>(key) || b->size != size)
            wrong.fetch_add(1);
          claims[key / size].fetch_add(1);
          fb.returned(*b, b->cut_ns + 1);
          returned.fetch_add(1);
        }
      }
    });
  std::uint64_t taken = 0;
  for (std::uint64_t k = 0; k < batches; ++k) {
    // At most 256 batches ahead of the claimers (a pipeline holds a bounded number).
    while (k >= 256 && next.load() < (k - 256) * size) std::this_thread::yield();
    fb.sent(k * size, {static_cast<std::int64_t>(k * size), 0, size});
    published.store(k + 1, std::memory_order_release);
    while (fb.take()) ++taken;
  }
  for (auto& t : claimers) t.join();
  while (fb.take()) ++taken;
  REQUIRE(wrong.load() == 0);
  std::uint64_t claimed = 0;
  for (const auto& c : claims) {
    REQUIRE(c.load() <= 1);
    claimed += c.load();
  }
  REQUIRE(claimed == returned.load());
  // A slot reused before its claim, or a full return ring, loses a sample; most come back.
  REQUIRE(taken <= returned.load());
  REQUIRE(claimed >= batches / 2);
}
