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

#include <iosfwd>
#include <string_view>

#include "conveyor/counters/trace.hpp"

namespace conveyor::metrics {

void write_chrome_trace(std::ostream& os, const trace_buffer& trace,
                        std::string_view process_name = "conveyor");

}  // namespace conveyor::metrics
