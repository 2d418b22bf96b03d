// conveyor/report/trace_export.hpp: writes a trace_buffer as Chrome trace-event JSON,
// which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
//   std::ofstream f{"conveyor.trace.json"};
//   conveyor::metrics::write_chrome_trace(f, pipeline_trace);
//
// Format (the "JSON Object Format" of the Trace Event Format document):
//   {"displayTimeUnit":"ms","traceEvents":[ ... ]}
//   - "M" process_name (pid 1, "conveyor"), and per track "M" thread_name and
//     thread_sort_index (tid = track index + 1, sorted in add_track() order);
//   - spans as "X" complete events {name, cat:"conveyor", ts, dur, pid:1, tid};
//   - counter samples as "C" events {name, ts, pid:1, tid, args:{"value":v}} (viewers
//     draw one counter track per name, e.g. "ring normalize" for a ring's occupancy).
// ts and dur are microseconds relative to the buffer's origin, with three decimals
// (exact nanoseconds). Within a track, events are written sorted by start time, longer
// spans first on ties, so nested spans appear parent-first as viewers expect.
//
// Thread-safety: any thread, also while the writers run (see trace.hpp); allocates a
// copy of one track's events at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <vector>

#include "conveyor/report/detail/json.hpp"
#include "conveyor/counters/trace.hpp"

namespace conveyor::metrics {

inline void write_chrome_trace(std::ostream& os, const trace_buffer& trace,
                               std::string_view process_name = "conveyor") {
  const std::int64_t origin = trace.origin_ns();
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  os << R"({"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":)";
  detail::json_string(os, process_name);
  os << "}}";
  std::vector<trace_event> events;
  for (std::size_t t = 0; t < trace.track_count(); ++t) {
    const trace_track& track = trace.track(t);
    const auto tid = static_cast<std::uint64_t>(t + 1);
    os << ",\n" << R"({"name":"thread_name","ph":"M","pid":1,"tid":)";
    detail::json_number(os, tid);
    os << R"(,"args":{"name":)";
    detail::json_string(os, track.name());
    os << "}}";
    os << ",\n" << R"({"name":"thread_sort_index","ph":"M","pid":1,"tid":)";
    detail::json_number(os, tid);
    os << R"(,"args":{"sort_index":)";
    detail::json_number(os, tid);
    os << "}}";

    events.clear();
    events.reserve(track.capacity());
    track.for_each_event([&](const trace_event& e) { events.push_back(e); });
    std::stable_sort(events.begin(), events.end(), [](const trace_event& a, const trace_event& b) {
      if (a.ts_ns != b.ts_ns) return a.ts_ns < b.ts_ns;
      return a.dur_ns > b.dur_ns;  // parent before child on equal start
    });
    for (const trace_event& e : events) {
      os << ",\n{\"name\":";
      detail::json_string(os, e.name != nullptr ? std::string_view{e.name} : std::string_view{});
      if (e.kind == trace_event_kind::span) {
        os << R"(,"cat":"conveyor","ph":"X","ts":)";
        detail::json_us(os, e.ts_ns - origin);
        os << ",\"dur\":";
        detail::json_us(os, e.dur_ns);
      } else {
        os << R"(,"ph":"C","ts":)";
        detail::json_us(os, e.ts_ns - origin);
      }
      os << ",\"pid\":1,\"tid\":";
      detail::json_number(os, tid);
      if (e.kind == trace_event_kind::counter) {
        os << ",\"args\":{\"value\":";
        detail::json_number(os, e.value);
        os << '}';
      }
      os << '}';
    }
  }
  os << "\n]}\n";
}

}  // namespace conveyor::metrics
