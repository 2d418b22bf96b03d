// trace_buffer + write_chrome_trace: the export parses as JSON (nlohmann), has
// thread_name metadata per track, well-nested spans per track, counters, exact
// timestamps; memory stays bounded over a 1M-event run; exporting while writers run
// yields only whole events.
#include "conveyor/counters/trace.hpp"
#include "conveyor/report/trace_export.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace m = conveyor::metrics;
namespace t = conveyor::test;
using nlohmann::json;

namespace {

json export_json(const m::trace_buffer& trace) {
  std::ostringstream os;
  m::write_chrome_trace(os, trace);
  return json::parse(os.str());  // throws (fails the test) on invalid JSON
}

std::int64_t us_to_ns(const json& v) { return std::llround(v.get<double>() * 1000.0); }

// Every "X" event of each tid must nest inside or follow the previous open ones.
bool spans_well_nested(const json& doc, std::string& why) {
  std::map<std::int64_t, std::vector<std::pair<std::int64_t, std::int64_t>>> open;  // tid -> stack
  std::map<std::int64_t, std::int64_t> last_start;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::int64_t tid = e["tid"].get<std::int64_t>();
    const std::int64_t s = us_to_ns(e["ts"]);
    const std::int64_t end = s + us_to_ns(e["dur"]);
    if (last_start.count(tid) && s < last_start[tid]) {
      why = "spans of tid " + std::to_string(tid) + " not sorted by start";
      return false;
    }
    last_start[tid] = s;
    auto& st = open[tid];
    while (!st.empty() && st.back().second <= s) st.pop_back();
    if (!st.empty() && end > st.back().second) {
      why = "span [" + std::to_string(s) + "," + std::to_string(end) + ") of tid " +
            std::to_string(tid) + " overlaps its parent's end " + std::to_string(st.back().second);
      return false;
    }
    st.push_back({s, end});
  }
  return true;
}

std::size_t count_ph(const json& doc, const char* ph, std::int64_t tid = -1) {
  std::size_t n = 0;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == ph && (tid < 0 || e["tid"].get<std::int64_t>() == tid)) ++n;
  return n;
}

}  // namespace

TEST_CASE("trace_buffer: bad capacity throws config_error") {
  REQUIRE_THROWS_AS(m::trace_buffer{0}, conveyor::config_error);
  REQUIRE_THROWS_AS(m::trace_buffer{(std::size_t{1} << 26) + 1}, conveyor::config_error);
}

TEST_CASE("trace export: metadata per track, spans, counters, exact microseconds") {
  m::trace_buffer trace{64, /*origin_ns=*/1'000'000};
  auto& worker = trace.add_track("map normalize #1");
  auto& lane = trace.add_track("lane 0");
  auto& odd = trace.add_track("quote \" backslash \\ newline \n tab \t bell \x07");
  static_assert(noexcept(worker.span("x", 0, 1)));
  static_assert(noexcept(worker.counter("x", 1.0, 0)));

  worker.span("normalize", 1'000'000 + 1'234'567, 1'000'000 + 1'300'000);
  worker.counter("ring normalize", 5, 1'000'000 + 1'234'567);
  worker.span("normalize", 1'000'000 + 1'300'000, 1'000'000 + 1'400'001);
  // A lane's phases, and a parent span written after its children (as a lane thread
  // that learns the batch's end last would do).
  lane.span("H2D", 2'000'000, 2'100'000);
  lane.span("compute", 2'100'000, 2'900'000);
  lane.span("D2H", 2'900'000, 2'950'000);
  lane.span("batch 0", 2'000'000, 2'950'000);
  odd.counter("weird \"counter\"", 0.25, 3'000'000);

  const json doc = export_json(trace);
  REQUIRE(doc["displayTimeUnit"] == "ms");
  const json& ev = doc["traceEvents"];
  REQUIRE(ev.is_array());

  std::map<std::int64_t, std::string> names;
  bool process_named = false;
  for (const auto& e : ev) {
    REQUIRE(e["pid"] == 1);
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "process_name")
      process_named = e["args"]["name"] == "conveyor";
  }
  REQUIRE(process_named);
  REQUIRE(names.size() == 3);
  REQUIRE(names[1] == "map normalize #1");
  REQUIRE(names[2] == "lane 0");
  REQUIRE(names[3] == "quote \" backslash \\ newline \n tab \t bell \x07");

  REQUIRE(count_ph(doc, "X", 1) == 2);
  REQUIRE(count_ph(doc, "X", 2) == 4);
  REQUIRE(count_ph(doc, "C") == 2);
  std::string why;
  const bool nested = spans_well_nested(doc, why);
  INFO(why);
  REQUIRE(nested);

  bool saw_first = false, saw_parent_first = false, saw_counter = false;
  std::string first_lane_span;
  for (const auto& e : ev) {
    if (e["ph"] == "X" && e["tid"] == 1 && e["ts"].get<double>() == Approx(1234.567)) {
      saw_first = true;
      REQUIRE(us_to_ns(e["dur"]) == 65'433);
      REQUIRE(e["name"] == "normalize");
    }
    if (e["ph"] == "X" && e["tid"] == 2 && first_lane_span.empty()) first_lane_span = e["name"];
    if (e["ph"] == "C" && e["tid"] == 1) {
      saw_counter = true;
      REQUIRE(e["name"] == "ring normalize");
      REQUIRE(e["args"]["value"] == 5.0);
    }
    if (e["ph"] == "C" && e["tid"] == 3) REQUIRE(e["name"] == "weird \"counter\"");
  }
  saw_parent_first = first_lane_span == "batch 0";
  REQUIRE(saw_first);
  REQUIRE(saw_parent_first);
  REQUIRE(saw_counter);
}

TEST_CASE("trace_buffer: a 1M-event run keeps exactly the last N events") {
  const std::size_t capacity = GENERATE(as<std::size_t>{}, 1, 1000, 4096);
  const std::uint64_t n = std::max<std::uint64_t>(t::scaled(1'000'000), 20 * capacity);
  CAPTURE(capacity, n);
  m::trace_buffer trace{capacity, 0};
  auto& tr = trace.add_track("worker");
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto s = static_cast<std::int64_t>(i) * 1000;
    tr.span("work", s, s + 500);
  }
  REQUIRE(tr.written() == n);
  const json doc = export_json(trace);
  REQUIRE(count_ph(doc, "X") == capacity);
  std::int64_t first = INT64_MAX;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X") first = std::min(first, us_to_ns(e["ts"]));
  REQUIRE(first == static_cast<std::int64_t>(n - capacity) * 1000);
}

TEST_CASE("trace export while writers run: only whole events, bounded, nested") {
  constexpr std::size_t capacity = 512;
  m::trace_buffer trace{capacity, 0};
  auto& a = trace.add_track("writer a");
  auto& b = trace.add_track("writer b");
  std::atomic<bool> stop{false};
  // Event i of a writer: span [i*1000, i*1000 + 100 + i%500) when i is even, counter
  // i*0.5 at i*1000 when odd. A torn read would break these relations.
  auto writer = [&stop](m::trace_track& tr) {
    for (std::uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      const auto s = static_cast<std::int64_t>(i) * 1000;
      if (i % 2 == 0) {
        tr.span("work", s, s + 100 + static_cast<std::int64_t>(i % 500));
      } else {
        tr.counter("level", static_cast<double>(i) * 0.5, s);
      }
    }
  };
  std::thread ta{writer, std::ref(a)};
  std::thread tb{writer, std::ref(b)};
  const int exports = static_cast<int>(t::scaled(40));
  int torn = 0, unnested = 0, over = 0, invalid = 0;
  for (int k = 0; k < exports; ++k) {
    std::ostringstream os;
    m::write_chrome_trace(os, trace);
    json doc;
    try {
      doc = json::parse(os.str());
    } catch (const json::exception&) {
      ++invalid;
      continue;
    }
    std::string why;
    if (!spans_well_nested(doc, why)) ++unnested;
    if (count_ph(doc, "X", 1) + count_ph(doc, "C", 1) > capacity) ++over;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] == "M") continue;
      const std::int64_t ts = us_to_ns(e["ts"]);
      const std::int64_t i = ts / 1000;
      if (e["ph"] == "X") {
        torn += (i % 2 != 0 || us_to_ns(e["dur"]) != 100 + i % 500 || e["name"] != "work") ? 1 : 0;
      } else {
        torn += (i % 2 != 1 || e["args"]["value"].get<double>() != static_cast<double>(i) * 0.5 ||
                 e["name"] != "level")
                    ? 1
                    : 0;
      }
    }
  }
  stop.store(true, std::memory_order_relaxed);
  ta.join();
  tb.join();
  REQUIRE(invalid == 0);
  REQUIRE(torn == 0);
  REQUIRE(unnested == 0);
  REQUIRE(over == 0);
  // Quiescent now: exactly the last `capacity` events of each track.
  const json doc = export_json(trace);
  REQUIRE(count_ph(doc, "X", 1) + count_ph(doc, "C", 1) ==
          std::min<std::uint64_t>(capacity, a.written()));
  REQUIRE(count_ph(doc, "X", 2) + count_ph(doc, "C", 2) ==
          std::min<std::uint64_t>(capacity, b.written()));
}
