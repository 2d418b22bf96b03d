// conveyor/runtime/event_timing.hpp: whether an event stores the time it completed, and
// how a thread waits for it.
//
//   R::event start{conveyor::event_timing::enabled}, end{conveyor::event_timing::enabled};
//   start.record(s); enqueue_work(s); end.record(s);
//   end.synchronize();
//   float ms = elapsed_ms(start, end);          // found by ADL in R's namespace
//   R::event fast{conveyor::event_timing::disabled, conveyor::event_wait::spin};
//
// Shared by conveyor::host and conveyor::cuda, so code generic over the runtime names it
// once. Timing costs a little on CUDA (cudaEventDisableTiming is the fast path), so the
// choice is explicit. Thread-safety: a plain enum.
#pragma once

namespace conveyor {

enum class event_timing { disabled, enabled };

// How synchronize() waits. block: the thread sleeps until the event completes (CUDA:
// cudaEventBlockingSync), leaving its core to other threads; it wakes some microseconds
// later than a spinner would. spin: the thread polls the event on its core, for the last
// microseconds of latency where a core per waiting thread is free.
enum class event_wait { block, spin };

}  // namespace conveyor
