// event_clock: device event times on the host clock. A simulated event (its device time
// in integer nanoseconds, elapsed_ms() a float like cudaEventElapsedTime's) drives a
// day-long run, so the float's precision loss far from the anchor is visible and the
// advancing anchor is shown to keep phase times exact; then the host runtime's events
// go through the same class.
#include "conveyor/runtime/event_clock.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "conveyor/runtime/host/runtime.hpp"

namespace {

constexpr std::int64_t ms = 1'000'000, s = 1'000 * ms, hour = 3'600 * s;

// An event whose completion time is set by the test, in device nanoseconds.
struct sim_event {
  explicit sim_event(conveyor::event_timing) {}
  std::int64_t device_ns = 0;
};

// As cudaEventElapsedTime: the exact difference, rounded to a float in milliseconds.
float elapsed_ms(const sim_event& start, const sim_event& end) {
  return static_cast<float>(static_cast<double>(end.device_ns - start.device_ns) / 1e6);
}

// Deterministic durations: splitmix64 -> [lo, hi) nanoseconds.
struct durations {
  std::uint64_t state;
  std::int64_t next(std::int64_t lo, std::int64_t hi) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + static_cast<std::int64_t>(z % static_cast<std::uint64_t>(hi - lo));
  }
};

}  // namespace

TEST_CASE("event_clock: a day into a run, phase times stay exact to the microsecond") {
  // The host clock reads 24 h at the anchor; the device's clock starts anywhere.
  const std::int64_t host_at_anchor = 24 * hour, device_at_anchor = 123'456'789;
  const std::int64_t offset = host_at_anchor - device_at_anchor;  // truth: host = device + offset

  conveyor::event_clock<sim_event> clock;  // advances once a second
  clock.anchor_event().device_ns = device_at_anchor;
  clock.set_anchor_ns(host_at_anchor);
  sim_event start_anchor{conveyor::event_timing::enabled};  // the one-anchor-per-run scheme
  start_anchor.device_ns = device_at_anchor;

  // A batch: four events, as a gpu lane records them (before H2D, after H2D, after
  // compute, after D2H), every 20-180 ms for 24 hours.
  sim_event ev[4] = {
      sim_event{conveyor::event_timing::enabled}, sim_event{conveyor::event_timing::enabled},
      sim_event{conveyor::event_timing::enabled}, sim_event{conveyor::event_timing::enabled}};
  durations d{27};
  std::int64_t t = device_at_anchor, worst_phase = 0, worst_gap = 0, worst_position = 0;
  std::int64_t last_end = 0, last_truth_end = 0, batches = 0, advances = 0;
  while (t - device_at_anchor < 24 * hour) {
    t += d.next(20 * ms, 180 * ms);
    std::int64_t truth[4] = {t, 0, 0, 0};
    truth[1] = truth[0] + d.next(10'000, 900'000);
    truth[2] = truth[1] + d.next(50'000, 9 * ms);
    truth[3] = truth[2] + d.next(1'000, 200'000);
    for (int i = 0; i < 4; ++i) ev[i].device_ns = truth[i];
    t = truth[3];

    std::int64_t host[4];
    for (int i = 0; i < 4; ++i) host[i] = clock.to_ns(ev[i]);
    for (int i = 1; i < 4; ++i)  // the phases: H2D, compute, D2H
      worst_phase =
          std::max(worst_phase, std::abs((host[i] - host[i - 1]) - (truth[i] - truth[i - 1])));
    if (batches > 0)  // the gap since the previous batch ended
      worst_gap = std::max(worst_gap, std::abs((host[0] - last_end) - (truth[0] - last_truth_end)));
    for (int i = 0; i < 4; ++i)
      worst_position = std::max(worst_position, std::abs(host[i] - (truth[i] + offset)));
    last_end = host[3];
    last_truth_end = truth[3];
    if (clock.advance(ev[3], host[3])) ++advances;
    ++batches;
  }
  CAPTURE(batches, advances, worst_phase, worst_gap, worst_position);
  REQUIRE(advances >= 80'000);         // about once a second (the first batch 1 s on)
  REQUIRE(worst_phase <= 1'000);       // every phase exact to the microsecond
  REQUIRE(worst_gap <= 1'000);         // and every gap between batches
  REQUIRE(worst_position <= 100'000);  // the anchor's random walk: ~8 us here

  // The last batch, a day after the start: converted from the run's first anchor alone,
  // its phases are off by milliseconds (the float's step is 8 ms there) ...
  sim_event last[2] = {sim_event{conveyor::event_timing::enabled},
                       sim_event{conveyor::event_timing::enabled}};
  last[0].device_ns = t - 4 * ms;  // a 4 ms compute phase ending at t
  last[1].device_ns = t;
  const auto from_start = [&](const sim_event& e) {
    return static_cast<std::int64_t>(static_cast<double>(elapsed_ms(start_anchor, e)) * 1e6);
  };
  const std::int64_t once = from_start(last[1]) - from_start(last[0]);
  CAPTURE(once);
  REQUIRE(std::abs(once - 4 * ms) >= 1 * ms);
  // ... and through the advancing clock, exact.
  REQUIRE(std::abs((clock.to_ns(last[1]) - clock.to_ns(last[0])) - 4 * ms) <= 1'000);
}

TEST_CASE("event_clock: advance() waits for the period and hands back the old anchor") {
  conveyor::event_clock<sim_event> clock{10 * ms};
  clock.anchor_event().device_ns = 5;
  clock.set_anchor_ns(1'000);
  sim_event e{conveyor::event_timing::enabled};
  e.device_ns = 5 + 9 * ms;
  REQUIRE(clock.to_ns(e) == 1'000 + 9 * ms);
  REQUIRE_FALSE(clock.advance(e, clock.to_ns(e)));  // 9 ms: not yet
  e.device_ns = 5 + 10 * ms;
  REQUIRE(clock.advance(e, clock.to_ns(e)));
  REQUIRE(clock.anchor_ns() == 1'000 + 10 * ms);
  REQUIRE(clock.anchor_event().device_ns == 5 + 10 * ms);
  REQUIRE(e.device_ns == 5);  // the old anchor, to be recorded again
}

TEST_CASE("event_clock: host runtime events convert to now_ns() and keep their order") {
  namespace host = conveyor::host;
  host::stream st;
  conveyor::event_clock<host::event> clock{0};  // advance on every call
  const std::int64_t before = conveyor::now_ns();
  clock.anchor(st.ref());
  REQUIRE(clock.anchor_ns() >= before);
  host::event a{conveyor::event_timing::enabled}, b{conveyor::event_timing::enabled};
  a.record(st);
  st.enqueue([] {});
  b.record(st);
  b.synchronize();
  const std::int64_t ta = clock.to_ns(a), tb = clock.to_ns(b);
  REQUIRE(ta >= clock.anchor_ns() - 1'000);  // float rounding: a microsecond at most here
  REQUIRE(tb >= ta);
  REQUIRE(clock.advance(b, tb));
  REQUIRE(clock.anchor_ns() == tb);
  b.record(st);  // the old anchor event, recorded again
  b.synchronize();
  REQUIRE(clock.to_ns(b) >= tb - 1'000);
}
