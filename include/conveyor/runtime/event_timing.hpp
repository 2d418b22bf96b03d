// conveyor/runtime/event_timing.hpp: whether an event stores the time it completed.
//
//   R::event start{conveyor::event_timing::enabled}, end{conveyor::event_timing::enabled};
//   start.record(s); enqueue_work(s); end.record(s);
//   end.synchronize();
//   float ms = elapsed_ms(start, end);          // found by ADL in R's namespace
//
// Shared by conveyor::host and conveyor::cuda, so code generic over the runtime names it
// once. Timing costs a little on CUDA (cudaEventDisableTiming is the fast path), so the
// choice is explicit. Thread-safety: a plain enum.
#pragma once

namespace conveyor {

enum class event_timing { disabled, enabled };

}  // namespace conveyor
