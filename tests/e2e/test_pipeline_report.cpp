// The metrics wired into a running pipeline (host runtime, with a GPU segment): the
// trace exports as Chrome JSON with one track per stage worker and three per lane,
// well-nested spans and ring-occupancy counters, stays within its bound over a long run
// and can be exported while the stages run; the progress line refreshes and ends its
// line when the pipeline stops; metrics off keeps the accounting and says it measured
// nothing.
#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <streambuf>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;
using nlohmann::json;
using R = host::runtime;

namespace {

using batch_t = std::vector<std::uint64_t>;

// A GPU segment whose kernel adds one to each item on the lane's stream.
auto plus_one_segment(std::size_t lanes, std::size_t max_batch) {
  return gpu<R, std::uint64_t, std::uint64_t>(
      {.lanes = lanes, .slots_per_lane = 2, .in_elems = max_batch, .out_elems = max_batch},
      [](batch_t& b, R::pinned_span<std::uint64_t> dst) {
        for (std::size_t i = 0; i < b.size(); ++i) dst[i] = b[i];
        return b.size();
      },
      [](lane_batch<R, std::uint64_t, std::uint64_t>& l) {
        l.stream.enqueue([in = l.in, out = l.out, n = l.items] {
          for (std::size_t i = 0; i < n; ++i) out.unsafe_host()[i] = in.unsafe_host()[i] + 1;
        });
        return l.items;
      },
      [](batch_t&& b, R::pinned_span<const std::uint64_t> r) {
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = r[i];
        return std::move(b);
      });
}

std::int64_t us_to_ns(const json& v) { return std::llround(v.get<double>() * 1000.0); }

struct track_events {
  std::string name;
  std::size_t spans = 0, counters = 0;
  std::set<std::string> span_names, counter_names;
};

// tid -> what the track holds; fails the test on a span that is out of order or that
// overlaps the end of the span it starts in (spans of a track must nest or follow).
std::map<std::int64_t, track_events> check_tracks(const json& doc) {
  std::map<std::int64_t, track_events> tracks;
  std::map<std::int64_t, std::vector<std::int64_t>> open_ends;  // tid -> stack of span ends
  std::map<std::int64_t, std::int64_t> last_start;
  for (const auto& e : doc.at("traceEvents")) {
    REQUIRE(e.at("pid") == 1);
    const std::int64_t tid = e.at("tid").get<std::int64_t>();
    if (e.at("ph") == "M") {
      if (e.at("name") == "thread_name") tracks[tid].name = e.at("args").at("name");
      continue;
    }
    auto& tr = tracks[tid];
    if (e.at("ph") == "C") {
      ++tr.counters;
      tr.counter_names.insert(e.at("name").get<std::string>());
      REQUIRE(e.at("args").at("value").get<double>() >= 0.0);
      continue;
    }
    REQUIRE(e.at("ph") == "X");
    ++tr.spans;
    tr.span_names.insert(e.at("name").get<std::string>());
    const std::int64_t start = us_to_ns(e.at("ts"));
    const std::int64_t end = start + us_to_ns(e.at("dur"));
    CAPTURE(tr.name, e.dump());
    REQUIRE(start >= 0);
    if (last_start.count(tid)) REQUIRE(start >= last_start[tid]);
    last_start[tid] = start;
    auto& ends = open_ends[tid];
    while (!ends.empty() && ends.back() <= start) ends.pop_back();
    if (!ends.empty()) REQUIRE(end <= ends.back());  // nested inside the open span
    ends.push_back(end);
  }
  return tracks;
}

const track_events* find_track(const std::map<std::int64_t, track_events>& tracks,
                               const std::string& name) {
  for (const auto& [tid, tr] : tracks)
    if (tr.name == name) return &tr;
  return nullptr;
}

// A thread-safe sink for the progress line: counts refreshes ('\r') as they are written.
class counting_buf : public std::streambuf {
 public:
  std::string text() const {
    std::lock_guard<std::mutex> lock{mutex_};
    return text_;
  }
  std::size_t refreshes() const { return refreshes_.load(std::memory_order_acquire); }

 protected:
  int_type overflow(int_type ch) override {
    if (ch == traits_type::eof()) return traits_type::not_eof(ch);
    std::lock_guard<std::mutex> lock{mutex_};
    text_.push_back(traits_type::to_char_type(ch));
    // release: pairs with the acquire in refreshes(); the text before it is written.
    if (ch == '\r') refreshes_.fetch_add(1, std::memory_order_release);
    return ch;
  }

 private:
  mutable std::mutex mutex_;
  std::string text_;
  std::atomic<std::size_t> refreshes_{0};
};

}  // namespace

TEST_CASE("pipeline trace: every track, nested spans, ring counters, within its bound") {
  const std::uint64_t n = t::scaled(40'000);
  constexpr std::size_t bound = 512;
  CAPTURE(n);
  std::uint64_t sum = 0;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
                 map([](std::uint64_t x) { return 2 * x; }).workers(2).name("double") | batch(16) |
                 plus_one_segment(2, 16) | unbatch() |
                 sink([&](std::uint64_t x) { sum += x; }).name("sum"),
             pipeline_options{.ring_capacity = 64, .trace_events = bound}};
  REQUIRE(p.tracing());
  const report r = p.run();
  REQUIRE(r.completed == n);
  REQUIRE(sum == n * (n - 1) + n);  // sum of 2x + 1

  const std::string text = p.trace_json();
  const json doc = json::parse(text);  // throws (fails the test) on invalid JSON
  REQUIRE(doc.at("displayTimeUnit") == "ms");
  const auto tracks = check_tracks(doc);

  std::set<std::string> names;
  for (const auto& [tid, tr] : tracks) {
    CAPTURE(tr.name);
    names.insert(tr.name);
    REQUIRE(tr.spans + tr.counters <= bound);  // the ring of the last N events per track
  }
  const std::set<std::string> expected{"source",
                                       "double #1",
                                       "double #2",
                                       "batch",
                                       "gpu lane 0",
                                       "gpu lane 0 enqueue",
                                       "gpu lane 0 complete",
                                       "gpu lane 1",
                                       "gpu lane 1 enqueue",
                                       "gpu lane 1 complete",
                                       "unbatch",
                                       "sum"};
  REQUIRE(names == expected);

  // Stage workers: busy spans named after the stage, and their input ring's occupancy.
  const auto* source = find_track(tracks, "source");
  REQUIRE(source->span_names == std::set<std::string>{"source"});
  REQUIRE(source->spans == bound);  // n items ran through: only the last `bound` are kept
  for (const char* w : {"double #1", "double #2"}) {
    const auto* tr = find_track(tracks, w);
    REQUIRE(tr->span_names == std::set<std::string>{"double"});
    REQUIRE(tr->counter_names == std::set<std::string>{"ring double"});
  }
  REQUIRE(find_track(tracks, "sum")->counter_names == std::set<std::string>{"ring sum"});
  // Lanes: batch > H2D, compute, D2H in device time; the threads' stage-in / enqueue /
  // stage-out.
  std::size_t lane_spans = 0;
  for (const char* lane : {"gpu lane 0", "gpu lane 1"}) {
    const auto* tr = find_track(tracks, lane);
    CAPTURE(lane);
    lane_spans += tr->spans;
    if (tr->spans != 0)
      REQUIRE(tr->span_names == std::set<std::string>{"batch", "H2D", "compute", "D2H"});
    REQUIRE(tr->spans % 4 == 0);  // whole batches
  }
  REQUIRE(lane_spans > 0);
  for (const char* lane : {"gpu lane 0 enqueue", "gpu lane 1 enqueue"}) {
    const auto* tr = find_track(tracks, lane);
    if (tr->spans != 0) REQUIRE(tr->span_names == std::set<std::string>{"stage-in", "enqueue"});
    if (tr->counters != 0) REQUIRE(tr->counter_names == std::set<std::string>{"ring gpu"});
  }
  for (const char* lane : {"gpu lane 0 complete", "gpu lane 1 complete"}) {
    const auto* tr = find_track(tracks, lane);
    if (tr->spans != 0) REQUIRE(tr->span_names == std::set<std::string>{"stage-out"});
  }

  // The same JSON through write_trace(ostream) and a file.
  std::ostringstream again;
  p.write_trace(again);
  REQUIRE(again.str() == text);
}

TEST_CASE("pipeline trace: exported while the stages run, and bounded by it") {
  constexpr std::size_t bound = 64;
  pipeline p{input<std::uint64_t>() | batch(8).max_delay(std::chrono::microseconds(200)) |
                 plus_one_segment(1, 8) | unbatch(),
             pipeline_options{.trace_events = bound}};
  p.start();
  const std::uint64_t rounds = t::scaled(20);
  std::uint64_t exports = 0;
  for (std::uint64_t round = 0; round < rounds; ++round) {
    std::vector<std::future<std::uint64_t>> results;
    for (std::uint64_t i = 0; i < 100; ++i) results.push_back(p.submit(i));
    // Mid-run: the stages still hold this round's items while the trace is read.
    const json doc = json::parse(p.trace_json());
    for (const auto& [tid, tr] : check_tracks(doc)) REQUIRE(tr.spans + tr.counters <= bound);
    ++exports;
    for (std::uint64_t i = 0; i < 100; ++i) REQUIRE(results[i].get() == i + 1);
  }
  const report r = p.stop(stop_mode::drain);
  REQUIRE(exports == rounds);
  REQUIRE(r.completed == 100 * rounds);
  const auto tracks = check_tracks(json::parse(p.trace_json()));
  REQUIRE(find_track(tracks, "results") != nullptr);
  REQUIRE(find_track(tracks, "gpu lane 0") != nullptr);
}

TEST_CASE("pipeline trace: off by default, needs metrics, bad sizes refused") {
  pipeline p{from_range(std::views::iota(0, 10)) | sink([](int) {})};
  REQUIRE_FALSE(p.tracing());
  p.run();
  REQUIRE_THROWS_WITH(p.trace_json(), Catch::Contains("trace_events"));
  auto make = [](pipeline_options o) {
    return pipeline(from_range(std::views::iota(0, 10)) | sink([](int) {}), o);
  };
  REQUIRE_THROWS_AS(make({.metrics = false, .trace_events = 16}), config_error);
  REQUIRE_THROWS_AS(make({.trace_events = (std::size_t{1} << 26) + 1}), config_error);
  REQUIRE_THROWS_AS(make({.progress = true, .progress_period = std::chrono::milliseconds(10)}),
                    config_error);
  REQUIRE_THROWS_AS(make({.metrics = false, .progress = true}), config_error);
}

TEST_CASE("pipeline metrics: waits too short to be timed are still charged as waiting") {
  // The source spends ~2 us per item; the map and the sink do nothing, so they wait
  // for nearly all of the run, in gaps of about 2 us: short enough to end within the
  // ring's spin, which reads no clock. Their time must still come out as waiting,
  // not busy, and the phases must still tile each worker's time.
  const std::uint64_t n = t::scaled(200'000) / 4 + 1000;
  const auto spin_2us = [] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(2);
    while (std::chrono::steady_clock::now() < until) {
    }
  };
  pipeline p{source([&, i = std::uint64_t{0}]() mutable -> std::optional<std::uint64_t> {
               if (i == n) return std::nullopt;
               spin_2us();
               return i++;
             }) | map([](std::uint64_t x) { return x + 1; }).name("inc") |
                 sink([](std::uint64_t) {}).name("out"),
             pipeline_options{.ring_capacity = 64}};
  const report r = p.run();
  REQUIRE(r.completed == n);
  for (const std::string name : {"inc", "out"}) {
    const auto s = std::find_if(r.stages.begin(), r.stages.end(),
                                [&](const stage_report& x) { return x.name == name; });
    REQUIRE(s != r.stages.end());
    const double busy = busy_fraction(*s, r.wall_s), starved = starved_fraction(*s, r.wall_s),
                 blocked = blocked_fraction(*s, r.wall_s);
    CAPTURE(name, busy, starved, blocked, r);
#if !defined(CONVEYOR_TEST_SANITIZED)
    // Starved or blocked: with three threads on a loaded machine the sink is sometimes
    // descheduled, and then 'inc' waits for room instead of for input. (Under a sanitizer
    // a pop and a push cost about as much as the source's 2 us, so the stages no longer
    // mostly wait: 'inc' measured busy 0.43-0.66 under ThreadSanitizer and 0.50 under
    // AddressSanitizer in CI. Only the tiling is checked; the scripted_ring tests below
    // check the accounting of waits itself, deterministically.)
    CHECK(starved + blocked > 0.5);
    CHECK(busy < 0.4);
#endif
    CHECK(busy + starved + blocked < 1.05);
  }
}

namespace {
// A ring that never has an item ready for try_pop and whose blocking pop says what its
// wait cost (as spsc_ring's does through detail::wait_timing) after taking `stall`:
// drives worker_probe's accounting of waits deterministically. The same for push.
struct scripted_ring {
  using value_type = int;
  detail::wait_timing cost{};  // end_ns != 0: the wait reached the slow path (now, then)
  std::chrono::milliseconds stall{0};
  int plain_waits = 0, measured_waits = 0;

  std::optional<int> try_pop(std::size_t* = nullptr) { return std::nullopt; }
  std::optional<int> pop(std::size_t* = nullptr) {
    ++plain_waits;
    std::this_thread::sleep_for(stall);
    return 1;
  }
  std::optional<int> pop(std::size_t*, detail::wait_timing* t) {
    ++measured_waits;
    report(*t);
    return 1;
  }
  bool try_push(int&&) { return false; }
  bool push(int) {
    ++plain_waits;
    std::this_thread::sleep_for(stall);
    return true;
  }
  bool push(int&&, detail::wait_timing* t) {
    ++measured_waits;
    report(*t);
    return true;
  }

 private:
  void report(detail::wait_timing& t) const {
    std::this_thread::sleep_for(stall);
    t.rounds += cost.rounds;
    t.slow_ns += cost.slow_ns;
    if (cost.end_ns != 0) t.end_ns = conveyor::now_ns();
  }
};

using probe_t = detail::worker_probe;
}  // namespace

TEST_CASE("worker_probe: waits are the ring's own, timed with metrics on only") {
  for (const bool on : {true, false}) {
    CAPTURE(on);
    detail::control ctl{on};
    metrics::stage_stats stats{1};
    {
      detail::worker_probe probe{ctl, stats, 0, nullptr, "s", nullptr};
      scripted_ring r{.cost = {.rounds = 3}};
      for (std::uint32_t i = 0; i < 2 * probe_t::round_sample_period; ++i) {
        REQUIRE(probe.pop(r) == std::optional<int>{1});
        REQUIRE(probe.push(r, 7));
      }
      // Every wait is the ring's blocking call with a wait_timing, on or off: the rounds
      // it spun are counted for placement by load either way.
      const int waits = 4 * static_cast<int>(probe_t::round_sample_period);
      CHECK(r.measured_waits == waits);
      CHECK(r.plain_waits == 0);
      CHECK(stats.worker(0).spin_rounds() == 3u * static_cast<std::uint64_t>(waits));
    }
    // Off, nothing is timed: no busy, starved or blocked time.
    const metrics::stage_counters c = stats.snapshot();
    CHECK((c.busy_ns + c.starved_ns + c.blocked_ns > 0) == on);
  }
}

TEST_CASE("worker_probe: spin rounds are charged at the learned cost of a round") {
  using namespace std::chrono_literals;
  detail::control ctl{true};
  metrics::stage_stats stats{1};
  detail::worker_probe probe{ctl, stats, 0, nullptr, "s", nullptr};
  // The first wait is the sampled one: timed with the clock around it, 1 ms over 1000
  // rounds (more if the sleep overslept): a round costs 1-2 us (the bound on a round).
  scripted_ring sampled{.cost = {.rounds = 1000}, .stall = 1ms};
  REQUIRE(probe.pop(sampled));
  const metrics::stage_counters after_sampled = stats.snapshot();
  CHECK(after_sampled.starved_ns >= 1'000'000);  // charged when it ended
  // The next ones are not timed: 100 rounds each, waiting for their input (pop) or for
  // room (push), charged at the next mark.
  scripted_ring spin{.cost = {.rounds = 100}};
  REQUIRE(probe.pop(spin));
  REQUIRE(probe.push(spin, 1));
  CHECK(stats.snapshot().starved_ns == after_sampled.starved_ns);
  std::this_thread::sleep_for(1ms);  // "work"
  probe.busy();
  const metrics::stage_counters c = stats.snapshot();
  const std::int64_t starved = c.starved_ns - after_sampled.starved_ns;
  const std::int64_t blocked = c.blocked_ns;
  CAPTURE(starved, blocked, c.busy_ns);
  CHECK(starved >= 100 * 1000);
  CHECK(starved <= 100 * 2000);
  CHECK(blocked == starved);
  CHECK(c.busy_ns >= 1'000'000 - 2 * 100 * 2000);
}

TEST_CASE(
    "worker_probe: a sampled wait preempted in the middle is charged once, not to every later "
    "one") {
  using namespace std::chrono_literals;
  detail::control ctl{true};
  metrics::stage_stats stats{1};
  {
    detail::worker_probe probe{ctl, stats, 0, nullptr, "s", nullptr};
    // The first wait is sampled; 10 rounds of spin stalled 20 ms (preempted).
    scripted_ring first{.cost = {.rounds = 10}, .stall = 20ms};
    REQUIRE(probe.pop(first));
    // 63 more of 11 rounds each, charged at the learned cost of a round.
    scripted_ring r{.cost = {.rounds = 11}};
    for (std::uint32_t i = 1; i < probe_t::round_sample_period; ++i) REQUIRE(probe.pop(r));
    std::this_thread::sleep_for(30ms);  // "work"
    probe.busy();
  }
  const metrics::stage_counters c = stats.snapshot();
  CAPTURE(c.starved_ns, c.busy_ns);
  // The stall was waiting: starved gets its 20 ms (more if the sleep overslept); the
  // 63 x 11 estimated rounds add at most 2 us each (the bound on a round), which is all
  // the 30 ms of work can lose to them. Unbounded, the work was all "starved".
  constexpr std::int64_t estimated_max = 63 * 11 * 2'000;
  CHECK(c.starved_ns >= 20'000'000);
  CHECK(c.busy_ns >= 30'000'000 - estimated_max);
}

TEST_CASE("worker_probe: a wait that reached the ring's slow path is charged when it ends") {
  using namespace std::chrono_literals;
  detail::control ctl{true};
  metrics::stage_stats stats{1};
  const std::int64_t t0 = conveyor::now_ns();
  detail::worker_probe probe{ctl, stats, 0, nullptr, "s", nullptr};
  scripted_ring sampled;  // the first wait is the sampled one
  REQUIRE(probe.pop(sampled));
  const metrics::stage_counters before = stats.snapshot();
  // 5 ms asleep in the ring: no clock read by the probe, yet a running report sees it
  // as soon as the wait is over, without waiting for the stage's next mark.
  scripted_ring asleep{.cost = {.rounds = 0, .slow_ns = 5'000'000, .end_ns = 1}, .stall = 5ms};
  REQUIRE(probe.pop(asleep));
  REQUIRE(probe.push(asleep, 1));
  const metrics::stage_counters c = stats.snapshot();
  CAPTURE(c.starved_ns, c.blocked_ns, c.busy_ns);
  CHECK(c.starved_ns - before.starved_ns == 5'000'000);
  CHECK(c.blocked_ns - before.blocked_ns == 5'000'000);
  // The phases still tile the worker's time: nothing charged beyond its clock.
  CHECK(c.busy_ns + c.starved_ns + c.blocked_ns <= probe.mark_ns() - t0);
}

namespace {
// An SPSC link's consumer side as worker_probe::drain() sees it: `held` items there, and
// the most each burst was allowed to take.
struct counted_link {
  std::size_t held = 1000;
  std::vector<std::size_t> asked;
  std::size_t size_approx() const noexcept { return held; }
  template <class F>
  std::size_t drain(F& f, std::size_t most) {
    asked.push_back(most);
    std::size_t n = 0;
    while (n < most && held > 0) {
      --held;
      ++n;
      if (!f(1)) break;
    }
    return n;
  }
};
}  // namespace

TEST_CASE("worker_probe: a burst ends at the next clock mark, so it delays no count") {
  using namespace std::chrono_literals;
  // One burst as a stage takes it, each item's work lasting `work`.
  const auto take = [](probe_t& probe, counted_link& in, std::chrono::microseconds work = 0us) {
    auto f = [work](int) {
      if (work.count() > 0) std::this_thread::sleep_for(work);
      return true;
    };
    const std::size_t n = probe.drain(in, f);
    probe.done(static_cast<std::uint32_t>(n), n);
    return n;
  };
  metrics::stage_stats stats{1};
  SECTION("metrics off: whole bursts") {
    detail::control ctl{false};
    probe_t probe{ctl, stats, 0, nullptr, "s", nullptr};
    counted_link in;
    for (int i = 0; i < 3; ++i) CHECK(take(probe, in) == probe_t::burst);
    CHECK(stats.snapshot().items == 3 * probe_t::burst);
  }
  SECTION("a trace track: one item per burst, each its own span") {
    detail::control ctl{true};
    metrics::trace_buffer trace{1024};
    probe_t probe{ctl, stats, 0, &trace.add_track("s"), "s", nullptr};
    counted_link in;
    CHECK(take(probe, in) == 1);
    CHECK(take(probe, in) == 1);
  }
  SECTION("metrics on, before the first mark: whole bursts") {
    detail::control ctl{true};
    probe_t probe{ctl, stats, 0, nullptr, "s", nullptr};
    counted_link in;
    // Before the first mark the period is 64 items: two whole bursts reach it (then the
    // items' cost sets it: thousands of items here, unless the thread was preempted).
    CHECK(take(probe, in) == probe_t::burst);
    CHECK(take(probe, in) == probe_t::burst);
    CHECK(in.asked == std::vector<std::size_t>(2, probe_t::burst));
  }
  SECTION("metrics on, items dearer than a mark interval: one by one") {
    detail::control ctl{true};
    probe_t probe{ctl, stats, 0, nullptr, "s", nullptr};
    counted_link in;
    // 250 us per item (more if the sleeps overslept): more than mark_interval_ns, so
    // at the first mark the period, and with it the burst, drops to one item.
    CHECK(take(probe, in, 250us) == probe_t::burst);
    CHECK(take(probe, in, 250us) == probe_t::burst);
    const metrics::stage_counters before = stats.snapshot();
    CHECK(take(probe, in, 1000us) == 1);
    CHECK(take(probe, in, 1000us) == 1);
    // Each one-item burst is marked as soon as it is done: a running report has its work.
    const metrics::stage_counters c = stats.snapshot();
    CHECK(c.items == before.items + 2);
    CHECK(c.busy_ns - before.busy_ns >= 2'000'000);
  }
}

TEST_CASE("pipeline metrics off: accounting kept, nothing timed, verdict unmeasured") {
  const std::uint64_t n = t::scaled(20'000);
  std::uint64_t sum = 0;
  pipeline p{from_range(std::views::iota(std::uint64_t{0}, n)) |
                 map([](std::uint64_t x) { return x; }).workers(2).ordered() | batch(16) |
                 plus_one_segment(2, 16) | unbatch() | sink([&](std::uint64_t x) { sum += x; }),
             pipeline_options{.metrics = false}};
  const report r = p.run();
  REQUIRE(r.produced == n);
  REQUIRE(r.completed == n);
  REQUIRE(sum == n * (n - 1) / 2 + n);
  REQUIRE(r.verdict.kind == verdict_kind::unmeasured);
  REQUIRE_THAT(r.verdict.summary, Catch::Contains("metrics = false"));
  for (const auto& s : r.stages) {
    CAPTURE(s.name);
    REQUIRE(s.busy_s == 0.0);
    REQUIRE(s.starved_s == 0.0);
    REQUIRE(s.blocked_s == 0.0);
    REQUIRE(s.items == n);  // item counts are still kept
  }
  REQUIRE(r.item_latency.count == 0);
  for (const auto& l : r.lanes) REQUIRE(l.batches == 0);
  std::ostringstream table;
  table << r;
  REQUIRE_THAT(table.str(), Catch::Contains("verdict: unmeasured"));
}

TEST_CASE("pipeline progress: refreshes while running, ends its line at stop") {
  counting_buf buf;
  std::ostream out{&buf};
  pipeline p{input<std::uint64_t>() | batch(8).max_delay(std::chrono::microseconds(200)) |
                 plus_one_segment(1, 8) | unbatch(),
             pipeline_options{.progress = true,
                              .progress_period = std::chrono::milliseconds(250),
                              .progress_out = &out}};
  p.start();
  // Feed it until the line has been refreshed twice (a gate, not a sleep: the CTest
  // TIMEOUT catches a line that never comes).
  std::uint64_t submitted = 0;
  while (buf.refreshes() < 2) {
    std::vector<std::future<std::uint64_t>> results;
    for (int i = 0; i < 50; ++i) results.push_back(p.submit(submitted++));
    for (auto& f : results) f.get();
  }
  const report r = p.stop(stop_mode::drain);
  REQUIRE(r.completed == submitted);
  const std::string text = buf.text();
  const std::size_t refreshes = buf.refreshes();
  REQUIRE(refreshes >= 2);
  // The newline is written only after the progress thread left its loop: it stopped.
  REQUIRE(text.back() == '\n');
  REQUIRE(text.find('\n') == text.size() - 1);  // one line, rewritten in place
  REQUIRE_THAT(text, Catch::Contains("conveyor: ") && Catch::Contains("items/s") &&
                         Catch::Contains("GPU busy") && Catch::Contains("now: "));
}
