// The host runtime: streams really are asynchronous and in order, events complete when
// their stream reaches them, waits order streams, jitter turns a missing wait into
// corrupted data, errors are sticky, handles neither leak nor double-free, and bad
// configuration is refused. Ordering is proven with gates and checksums, never sleeps.
#include "conveyor/runtime/host/runtime.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/error.hpp"
#include "conveyor/runtime/concepts.hpp"
#include "conveyor/runtime/event_clock.hpp"
#include "test_support.hpp"

namespace host = conveyor::host;
using conveyor::event_timing;
using conveyor::event_wait;
using namespace std::chrono_literals;

namespace {

// Holds stream work until the test opens it. Declare the gate before the streams that
// wait on it and a gate::opener after them: the opener runs first on every exit path
// (a failed REQUIRE included), so the streams' destructors never drain into a closed gate.
class gate {
 public:
  void wait() const {
    // acquire: pairs with the release store in open().
    while (!open_.load(std::memory_order_acquire)) open_.wait(false, std::memory_order_acquire);
  }
  void open() {
    open_.store(true, std::memory_order_release);
    open_.notify_all();
  }
  bool is_open() const { return open_.load(std::memory_order_acquire); }

  struct opener {
    gate& g;
    ~opener() { g.open(); }
  };

 private:
  std::atomic<bool> open_{false};
};

// What a host kernel typically captures: four spans and two sizes.
struct four_spans {
  host::pinned_span<float> a;
  host::device_span<float> b;
  host::device_span<float> c;
  host::pinned_span<float> d;
  std::size_t n, m;
  void operator()() const {}
};

}  // namespace

// ---- compile-time contract -------------------------------------------------------------

static_assert(conveyor::runtime<host::runtime>);
static_assert(host::runtime::name == "host");
static_assert(!std::is_constructible_v<host::stream_ref, int>);
static_assert(!std::is_constructible_v<host::stream_ref, std::nullptr_t>);
static_assert(!std::is_default_constructible_v<host::stream_ref>);
static_assert(std::is_convertible_v<const host::stream&, host::stream_ref>);
static_assert(!std::is_copy_constructible_v<host::stream> &&
              std::is_nothrow_move_assignable_v<host::stream>);
static_assert(!std::is_copy_constructible_v<host::event> &&
              std::is_nothrow_move_assignable_v<host::event>);
static_assert(std::is_nothrow_destructible_v<host::stream> &&
              std::is_nothrow_destructible_v<host::event>);
static_assert(!std::is_convertible_v<event_timing, host::event>, "event(event_timing) is explicit");
static_assert(!std::is_same_v<host::pinned_span<float>, host::device_span<float>>);
static_assert(!std::is_convertible_v<host::pinned_span<float>, host::device_span<float>>);
static_assert(!std::is_convertible_v<host::device_span<float>, host::pinned_span<float>>);
static_assert(!std::is_convertible_v<float*, host::pinned_span<float>>);
static_assert(std::is_trivially_copyable_v<host::pinned_span<float>>);
static_assert(std::is_trivially_copyable_v<host::device_span<const float>>);
static_assert(std::is_convertible_v<host::pinned_span<float>, std::span<float>>);
template <class Dst, class Src, class Stream>
concept can_copy_async = requires(Dst d, Src src, Stream s) { copy_async(d, src, s); };
static_assert(can_copy_async<host::device_span<float>, host::pinned_span<float>, host::stream_ref>);
static_assert(
    can_copy_async<host::device_span<float>, host::pinned_span<const float>, host::stream>);
static_assert(!can_copy_async<host::device_span<float>, std::vector<float>&, host::stream_ref>,
              "a pageable std::vector must not be accepted by an async copy");
static_assert(!can_copy_async<host::device_span<float>, float*, host::stream_ref>);
static_assert(!can_copy_async<host::device_span<float>, std::span<const float>, host::stream_ref>);
static_assert(!can_copy_async<std::span<float>, host::device_span<const float>, host::stream_ref>);
static_assert(
    !can_copy_async<host::device_span<float>, host::pinned_span<double>, host::stream_ref>);
static_assert(conveyor::detail::host_task::fits_inline<four_spans>,
              "a kernel capturing four spans must enqueue without allocating");

// ---- streams ------------------------------------------------------------------------

TEST_CASE("host stream: enqueue returns before the work runs, which runs on the stream thread") {
  gate g;
  host::stream s;
  gate::opener open_on_exit{g};
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> finished{false}, ran_inline{false};
  s.ref().enqueue([&] {
    if (std::this_thread::get_id() == caller) {  // an inline enqueue: record it, don't block
      ran_inline.store(true);
      return;
    }
    g.wait();  // opened by the test only after enqueue() returned
    finished.store(true);
  });
  // Deterministic: the work cannot finish while the gate is closed.
  const bool finished_before_open = finished.load();
  g.open();
  s.synchronize();
  REQUIRE_FALSE(ran_inline.load());
  REQUIRE_FALSE(finished_before_open);
  REQUIRE(finished.load());
}

TEST_CASE("host stream: query() is false while enqueued work has not run, true after") {
  gate g;
  host::stream s;
  gate::opener open_on_exit{g};
  REQUIRE(s.ref().query());  // nothing enqueued yet
  s.ref().enqueue([&] { g.wait(); });
  s.ref().enqueue([] {});
  const bool idle_while_held = s.ref().query();  // deterministic: the gate holds the stream
  g.open();
  s.synchronize();
  REQUIRE_FALSE(idle_while_held);
  REQUIRE(s.ref().query());
  // Work that threw counts as run: query() is no error check.
  s.ref().enqueue([] { throw std::runtime_error("kernel failed"); });
  REQUIRE_THROWS(s.synchronize());
  REQUIRE(s.ref().query());
}

TEST_CASE("host event: elapsed_ns is exact, and event_clock converts host events exactly") {
  host::stream s;
  conveyor::event_clock<host::event> clock;
  clock.anchor(s.ref());
  host::event a{event_timing::enabled}, b{event_timing::enabled};
  a.record(s.ref());
  s.ref().enqueue([] { std::this_thread::sleep_for(std::chrono::microseconds(300)); });
  b.record(s.ref());
  b.synchronize();
  const std::int64_t ns = elapsed_ns(a, b);
  CHECK(ns >= 300'000);                          // the sleep between the two records, at least
  CHECK(clock.to_ns(b) - clock.to_ns(a) == ns);  // no float milliseconds in between
  CHECK(elapsed_ms(a, b) == Approx(static_cast<double>(ns) * 1e-6).epsilon(1e-6));
  host::event never{event_timing::enabled};
  CHECK_THROWS_AS(elapsed_ns(a, never), conveyor::error);
}

TEST_CASE("host stream: work runs in enqueue order") {
  const bool with_jitter = GENERATE(false, true);
  CAPTURE(with_jitter);
  host::stream s = with_jitter ? host::stream{host::jitter{42, 5us}} : host::stream{};
  const std::uint64_t n = conveyor::test::scaled(50'000);
  std::uint64_t next = 0;  // touched by the stream thread only until synchronize()
  bool in_order = true;
  for (std::uint64_t i = 0; i < n; ++i) {
    s.ref().enqueue([&next, &in_order, i] {
      in_order &= (next == i);
      next = i + 1;
    });
  }
  s.synchronize();
  REQUIRE(in_order);
  REQUIRE(next == n);
}

TEST_CASE("host stream: enqueues from several threads keep each thread's order") {
  constexpr int producers = 3;
  host::stream s{host::jitter{7, 3us}};
  const std::uint64_t n = conveyor::test::scaled(20'000);
  std::array<std::uint64_t, producers> next{};  // stream thread only
  bool in_order = true;
  std::vector<std::thread> threads;
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < n; ++i) {
        s.ref().enqueue([&next, &in_order, t, i] {
          in_order &= (next[t] == i);
          next[t] = i + 1;
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  s.synchronize();
  REQUIRE(in_order);
  for (int t = 0; t < producers; ++t) REQUIRE(next[t] == n);
}

TEST_CASE("host stream: a full queue blocks enqueue until the stream catches up, losing nothing") {
  gate g;
  host::stream s;
  gate::opener open_on_exit{g};
  const std::size_t n = 3 * conveyor::detail::host_stream_state::queue_capacity;
  std::atomic<std::size_t> enqueued{0};
  std::size_t next = 0;  // stream thread only
  bool in_order = true;
  s.ref().enqueue([&g] { g.wait(); });
  std::thread producer{[&] {
    for (std::size_t i = 0; i < n; ++i) {
      s.ref().enqueue([&next, &in_order, i] {
        in_order &= (next == i);
        next = i + 1;
      });
      enqueued.fetch_add(1, std::memory_order_relaxed);  // relaxed: progress indicator
    }
  }};
  // The queue holds queue_capacity tasks; the producer gets that far and then blocks.
  while (enqueued.load(std::memory_order_relaxed) <
         conveyor::detail::host_stream_state::queue_capacity)
    std::this_thread::yield();
  const std::size_t before_open = enqueued.load(std::memory_order_relaxed);
  g.open();
  producer.join();
  s.synchronize();
  CHECK(before_open < n);  // the producer cannot have finished while the stream was held
  REQUIRE(in_order);
  REQUIRE(next == n);
}

TEST_CASE("host stream: the destructor runs everything queued, then joins") {
  const long streams_before = conveyor::detail::host_counters::live_streams();
  const std::size_t n = conveyor::test::scaled(10'000);
  std::size_t ran = 0;  // stream thread only, until its join
  {
    host::stream s{host::jitter{3, 2us}};
    for (std::size_t i = 0; i < n; ++i) s.ref().enqueue([&ran] { ++ran; });
  }
  REQUIRE(ran == n);
  REQUIRE(conveyor::detail::host_counters::live_streams() == streams_before);
}

// ---- events -------------------------------------------------------------------------

TEST_CASE(
    "host event: never recorded counts as complete, a record completes when the stream reaches "
    "it") {
  host::event never{event_timing::enabled};
  REQUIRE(never.query());
  never.synchronize();
  REQUIRE_THROWS_AS(elapsed_ms(never, never), conveyor::error);

  gate g;
  host::stream s;
  gate::opener open_on_exit{g};
  host::event start{event_timing::enabled}, end{event_timing::enabled};
  start.record(s);
  s.ref().enqueue([&g] { g.wait(); });
  end.record(s);
  const bool end_pending = !end.query();  // deterministic: end is behind the closed gate
  start.synchronize();
  const bool start_done = start.query();
  g.open();
  end.synchronize();
  REQUIRE(end_pending);
  REQUIRE(start_done);
  REQUIRE(end.query());
  REQUIRE(elapsed_ms(start, end) >= 0.0f);  // same stream: end completes after start
}

TEST_CASE("host event: event_wait::spin waits as block does, for completion and errors") {
  const event_wait w = GENERATE(event_wait::block, event_wait::spin);
  gate g;
  host::stream s;
  gate::opener open_on_exit{g};
  host::event e{event_timing::enabled, w};
  int value = 0;  // written on the stream's thread, read after the event: ordered by it
  s.ref().enqueue([&] {
    g.wait();
    value = 7;
  });
  e.record(s);
  const bool pending = !e.query();
  std::thread opener{[&g] { g.open(); }};
  e.synchronize();
  opener.join();
  REQUIRE(pending);
  REQUIRE(value == 7);
  // Behind a failed stream the event carries its error, waited for either way.
  s.ref().enqueue([] { throw std::runtime_error("kernel fault"); });
  host::event after{event_timing::disabled, w};
  after.record(s);
  REQUIRE_THROWS_WITH(after.synchronize(), Catch::Contains("kernel fault"));
}

TEST_CASE("host device: a stream is its maker's device's, and takes work only from there") {
  REQUIRE(host::current_device() == 0);
  REQUIRE(host::device_count() == host::simulated_devices);
  host::stream on0;
  std::optional<host::stream> on2;
  {
    const host::device_guard g{2};
    REQUIRE(host::current_device() == 2);
    on2.emplace();
  }
  REQUIRE(host::current_device() == 0);  // the guard restored it
  std::atomic<int> ran{0};
  on0.ref().enqueue([&] { ran.fetch_add(1); });
  REQUIRE_THROWS_WITH(on2->ref().enqueue([&] { ran.fetch_add(1); }),
                      Catch::Contains("belongs to device 2") && Catch::Contains("set_device(2)"));
  std::thread bound{[&] {
    host::set_device(2);  // per thread: the main thread stays on 0
    on2->ref().enqueue([&] { ran.fetch_add(1); });
  }};
  bound.join();
  REQUIRE(host::current_device() == 0);
  on0.synchronize();
  on2->synchronize();
  REQUIRE(ran.load() == 2);
  REQUIRE_THROWS_WITH(host::set_device(host::simulated_devices), Catch::Contains("valid ids"));
  REQUIRE_THROWS_WITH(host::set_device(-1), Catch::Contains("valid ids"));
}

TEST_CASE("host event: destroying an event with a record pending is safe") {
  const long events_before = conveyor::detail::host_counters::live_events();
  gate g;
  host::stream s;
  gate::opener open_on_exit{g};
  s.ref().enqueue([&g] { g.wait(); });
  {
    host::event e;
    e.record(s);
  }  // the pending task keeps the state alive
  g.open();
  s.synchronize();
  REQUIRE(conveyor::detail::host_counters::live_events() == events_before);
}

TEST_CASE("host stream: wait() holds a stream until the event's stream reaches it") {
  const int rounds = static_cast<int>(conveyor::test::scaled(200));
  for (int round = 0; round < rounds; ++round) {
    gate g;
    host::stream a, b;
    gate::opener open_on_exit{g};
    int value = 0;  // written on a's thread, read on b's: ordered only by the wait
    std::atomic<int> seen{-1};
    host::event written, b_done;
    a.ref().enqueue([&] {
      g.wait();
      value = 42 + round;
    });
    written.record(a);
    b.ref().wait(written);
    b.ref().enqueue([&] { seen.store(value); });
    b_done.record(b);
    // Until b is provably blocked in its wait (or, with a broken wait, its reader ran):
    while (b.native()->blocked_waits() == 0 && seen.load() == -1) std::this_thread::yield();
    const int seen_while_closed = seen.load();
    const bool b_pending = !b_done.query();
    g.open();
    b.synchronize();
    REQUIRE(seen_while_closed == -1);
    REQUIRE(b_pending);
    REQUIRE(seen.load() == 42 + round);
  }
}

TEST_CASE("host stream: a wait on an event never recorded does not hold the stream") {
  host::stream s;
  host::event never;
  bool ran = false;
  s.ref().wait(never);
  s.ref().enqueue([&ran] { ran = true; });
  s.synchronize();
  REQUIRE(ran);
}

// ---- jitter proves the detector -------------------------------------------------------

namespace {

// Stream a fills a device buffer with batch b's pattern; stream b checks it. Correct
// code makes b wait for `filled` and a wait for `consumed`. skip_wait drops b's wait:
// with jitter on, b then reads batches a has not written yet.
std::uint64_t run_fill_check(bool skip_wait, std::uint64_t batches, std::uint64_t seed) {
  constexpr std::size_t k = 256;
  host::device_buffer<std::uint64_t> dev{k};
  std::uint64_t corrupted = 0;  // stream b's thread only, until synchronize()
  host::stream a{host::jitter{seed, 40us}}, b{host::jitter{seed + 1, 40us}};
  host::event filled, consumed;
  const host::device_span<std::uint64_t> d = dev.span();
  for (std::uint64_t batch = 0; batch < batches; ++batch) {
    a.ref().wait(consumed);
    a.ref().enqueue([d, batch] {
      for (std::size_t j = 0; j < k; ++j) d.unsafe_host()[j] = batch * k + j;
    });
    filled.record(a);
    if (!skip_wait) b.ref().wait(filled);
    b.ref().enqueue([d, batch, &corrupted] {
      for (std::size_t j = 0; j < k; ++j) {
        if (d.unsafe_host()[j] != batch * k + j) {
          ++corrupted;
          return;
        }
      }
    });
    consumed.record(b);
  }
  a.synchronize();
  b.synchronize();
  return corrupted;
}

}  // namespace

TEST_CASE("host jitter: correctly ordered streams never see corrupted data") {
  const std::uint64_t batches = conveyor::test::scaled(20'000);
  CAPTURE(batches);
  REQUIRE(run_fill_check(false, batches, 1234) == 0);
}

#if !defined(CONVEYOR_TEST_TSAN)
// TSan reports the deliberate race itself (halting the run), so this variant runs in the
// plain and ASan builds.
TEST_CASE("host jitter: skipping the wait is caught as corrupted data") {
  const std::uint64_t batches = conveyor::test::scaled(2'000);
  CAPTURE(batches);
  REQUIRE(run_fill_check(true, batches, 1234) > 0);
}
#endif

TEST_CASE("host jitter: the delay sequence is a function of the seed") {
  conveyor::detail::jitter_rng x{99}, y{99}, z{100};
  bool same = true, differs = false;
  for (int i = 0; i < 64; ++i) {
    const std::uint64_t vx = x.next(), vy = y.next(), vz = z.next();
    same &= (vx == vy);
    differs |= (vx != vz);
  }
  REQUIRE(same);
  REQUIRE(differs);
}

// ---- errors -------------------------------------------------------------------------

TEST_CASE("host stream: a throwing kernel is a sticky error, rethrown by synchronize and events") {
  host::stream s;
  host::pinned_buffer<int> in{4}, out{4};
  host::device_buffer<int> dev{4};
  for (int& x : in.span()) x = 7;
  for (int& x : out.span()) x = -1;
  bool ran_after = false;
  s.ref().enqueue([] { throw std::runtime_error("kernel 7 failed"); });
  s.ref().enqueue([&ran_after] { ran_after = true; });
  copy_async(dev.span(), in.span(), s);
  copy_async(out.span(), dev.span(), s);
  host::event behind;
  behind.record(s);
  REQUIRE_THROWS_AS(s.synchronize(), std::runtime_error);
  REQUIRE_THROWS_WITH(s.synchronize(), "kernel 7 failed");  // sticky
  REQUIRE_THROWS_WITH(behind.synchronize(), "kernel 7 failed");
  REQUIRE_THROWS_WITH(behind.query(), "kernel 7 failed");
  REQUIRE_FALSE(ran_after);
  for (int x : out.span()) REQUIRE(x == -1);  // the copies behind the failure were skipped

  // A stream that waits on an event behind the failure inherits it.
  host::stream t;
  bool t_ran = false;
  t.ref().wait(behind);
  t.ref().enqueue([&t_ran] { t_ran = true; });
  REQUIRE_THROWS_WITH(t.synchronize(), "kernel 7 failed");
  REQUIRE_FALSE(t_ran);
}

TEST_CASE("host runtime: bad configuration is refused with a message that says what to change") {
  using Catch::Contains;
  REQUIRE_THROWS_WITH(host::stream(host::jitter{1, -1us}), Contains("max_delay must be >= 0"));
  REQUIRE_THROWS_WITH(host::stream(host::jitter{1, 2s}), Contains("max_delay above 1 s"));

  host::stream s;
  host::pinned_buffer<float> small{4}, big{8};
  host::device_buffer<float> dev{4};
  REQUIRE_THROWS_WITH(copy_async(dev.span(), big.span(), s),
                      Contains("destination has 4 elements but source has 8"));
  REQUIRE_THROWS_WITH(copy_async(big.span(), dev.span(), s), Contains("copy_async (D2H)"));
  REQUIRE_THROWS_AS(big.span().subspan(5, 4), conveyor::config_error);
  REQUIRE_THROWS_WITH(big.span().subspan(9, 0), Contains("outside a span of 8 elements"));
  REQUIRE(big.span().subspan(8, 0).empty());

  const std::size_t absurd = std::size_t{1} << 40;  // elements: 4 TiB of floats
  REQUIRE_THROWS_AS(host::pinned_buffer<float>(absurd, "huge staging"), conveyor::config_error);
  REQUIRE_THROWS_WITH(host::pinned_buffer<float>(absurd, "huge staging"),
                      Contains("1099511627776 x 4 bytes") && Contains("'huge staging'"));
  REQUIRE_THROWS_WITH(host::device_buffer<float>(~std::size_t{0}), Contains("host device"));

  host::event plain, timed{event_timing::enabled};
  REQUIRE_THROWS_AS(elapsed_ms(plain, timed), conveyor::config_error);
  REQUIRE_THROWS_WITH(elapsed_ms(timed, plain), Contains("event_timing::enabled"));
}

// ---- ownership ----------------------------------------------------------------------

TEST_CASE(
    "host handles: move-assignment between two non-empty handles leaks and double-frees nothing") {
  using counters = conveyor::detail::host_counters;
  const long streams0 = counters::live_streams(), events0 = counters::live_events(),
             buffers0 = counters::live_buffers();
  {
    std::size_t ran_on_a = 0;  // a's thread until a is destroyed
    host::stream a, b;
    REQUIRE(counters::live_streams() == streams0 + 2);
    for (int i = 0; i < 100; ++i) a.ref().enqueue([&ran_on_a] { ++ran_on_a; });
    auto* const b_state = b.native();
    a = std::move(b);  // a's old stream drains and joins; a takes b's
    REQUIRE(ran_on_a == 100);
    REQUIRE(counters::live_streams() == streams0 + 1);
    REQUIRE(a.native() == b_state);
    REQUIRE(b.native() == nullptr);
    bool ran = false;
    a.ref().enqueue([&ran] { ran = true; });
    a.synchronize();
    REQUIRE(ran);

    host::stream c = std::move(a);
    REQUIRE(c.native() == b_state);
    auto* const raw = c.release();
    REQUIRE(counters::live_streams() == streams0 + 1);  // released, not destroyed
    host::stream d = host::stream::from_native(raw);
    REQUIRE(d.ref() == host::stream_ref{d});

    host::event e1, e2{event_timing::enabled};
    REQUIRE(counters::live_events() == events0 + 2);
    e1.record(d);
    e1 = std::move(e2);
    d.synchronize();  // the old e1's pending record has run and let go of its state
    REQUIRE(counters::live_events() == events0 + 1);
    REQUIRE(e1.timing_enabled());

    host::pinned_buffer<int> p1{10}, p2{20};
    host::device_buffer<int> d1{30}, d2{40};
    REQUIRE(counters::live_buffers() == buffers0 + 4);
    p1 = std::move(p2);
    d1 = std::move(d2);
    REQUIRE(counters::live_buffers() == buffers0 + 2);
    REQUIRE(p1.size() == 20);
    REQUIRE(p2.data() == nullptr);
    REQUIRE(p2.size() == 0);
    REQUIRE(d1.size_bytes() == 40 * sizeof(int));
    host::pinned_buffer<int> p3 = std::move(p1);
    REQUIRE(p3.size() == 20);
    REQUIRE(counters::live_buffers() == buffers0 + 2);
  }
  REQUIRE(counters::live_streams() == streams0);
  REQUIRE(counters::live_events() == events0);
  REQUIRE(counters::live_buffers() == buffers0);
}

// ---- memory -------------------------------------------------------------------------

TEST_CASE("host memory: copies and memset run in stream order") {
  const std::size_t n = GENERATE(1u, 255u, 4096u);
  CAPTURE(n);
  host::stream s{host::jitter{n, 10us}};
  host::pinned_buffer<std::uint32_t> in{n}, out{n};
  host::device_buffer<std::uint32_t> d1{n}, d2{n};
  for (std::size_t i = 0; i < n; ++i) in.span()[i] = static_cast<std::uint32_t>(i * 3 + 1);
  copy_async(d1.span(), in.span(), s);
  s.ref().enqueue([d = d1.span()] {
    for (auto& x : d.unsafe_host()) x *= 2;
  });
  copy_async(d2.span(), d1.span(), s);
  copy_async(out.span(), d2.span(), s);
  s.synchronize();
  bool all = true;
  for (std::size_t i = 0; i < n; ++i) all &= (out.span()[i] == (i * 3 + 1) * 2);
  REQUIRE(all);

  memset_async(d1.span(), 0, s);
  copy_async(out.span(), d1.span(), s);
  s.synchronize();
  for (std::uint32_t x : out.span()) REQUIRE(x == 0);

  if (n >= 4) {  // a subspan copy touches only its window
    copy_async(d1.span().subspan(1, 2), in.span().subspan(n - 2, 2), s);
    copy_async(out.span(), d1.span(), s);
    s.synchronize();
    REQUIRE(out.span()[0] == 0);
    REQUIRE(out.span()[1] == in.span()[n - 2]);
    REQUIRE(out.span()[2] == in.span()[n - 1]);
    REQUIRE(out.span()[3] == 0);
  }
}

TEST_CASE("host memory: buffers are aligned like cudaMalloc and empty ones hold nothing") {
  host::pinned_buffer<char> p{3};
  host::device_buffer<double> d{5};
  REQUIRE(reinterpret_cast<std::uintptr_t>(p.data()) % 256 == 0);
  REQUIRE(reinterpret_cast<std::uintptr_t>(d.data()) % 256 == 0);
  host::pinned_buffer<float> empty{0};
  REQUIRE(empty.data() == nullptr);
  REQUIRE(empty.span().empty());
  host::stream s;
  host::device_buffer<float> dev_empty{0};
  copy_async(dev_empty.span(), empty.span(), s);  // zero bytes: nothing to do, no UB
  s.synchronize();
  const host::pinned_span<const float> c = host::pinned_span<float>{};
  REQUIRE(c.size() == 0);
}
