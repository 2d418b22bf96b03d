// src/conveyor/trace_export.cpp: a trace_buffer as Chrome trace-event JSON
// (conveyor/report/trace_export.hpp).
#include "conveyor/report/trace_export.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <vector>

#include "json_writer.hpp"

namespace conveyor::metrics {

void write_chrome_trace(std::ostream& os, const trace_buffer& trace,
                        std::string_view process_name) {
  const std::int64_t origin = trace.origin_ns();
  detail::json_writer j{os};
  j.begin_object().field("displayTimeUnit", "ms").key("traceEvents").begin_array();
  const auto metadata = [&](const char* name, std::uint64_t tid, const char* arg, auto value) {
    j.newline()
        .begin_object()
        .field("name", name)
        .field("ph", "M")
        .field("pid", 1)
        .field("tid", tid);
    j.key("args").begin_object().field(arg, value).end_object().end_object();
  };
  metadata("process_name", 0, "name", process_name);
  std::vector<trace_event> events;
  for (std::size_t t = 0; t < trace.track_count(); ++t) {
    const trace_track& track = trace.track(t);
    const auto tid = static_cast<std::uint64_t>(t + 1);
    metadata("thread_name", tid, "name", std::string_view{track.name()});
    metadata("thread_sort_index", tid, "sort_index", tid);
    events.clear();
    events.reserve(track.capacity());
    track.for_each_event([&](const trace_event& e) { events.push_back(e); });
    std::stable_sort(events.begin(), events.end(), [](const trace_event& a, const trace_event& b) {
      if (a.ts_ns != b.ts_ns) return a.ts_ns < b.ts_ns;
      return a.dur_ns > b.dur_ns;  // parent before child on equal start
    });
    for (const trace_event& e : events) {
      j.newline().begin_object();
      j.field("name", e.name != nullptr ? std::string_view{e.name} : std::string_view{});
      if (e.kind == trace_event_kind::span) {
        j.field("cat", "conveyor").field("ph", "X");
        j.key("ts").microseconds(e.ts_ns - origin).key("dur").microseconds(e.dur_ns);
      } else {
        j.field("ph", "C").key("ts").microseconds(e.ts_ns - origin);
      }
      j.field("pid", 1).field("tid", tid);
      if (e.kind == trace_event_kind::counter)
        j.key("args").begin_object().field("value", e.value).end_object();
      j.end_object();
    }
  }
  j.newline().end_array().end_object();
  os << '\n';
}

}  // namespace conveyor::metrics
