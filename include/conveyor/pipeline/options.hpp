// conveyor/pipeline/options.hpp: how a pipeline runs: its rings, what it measures, where
// its threads go, and how it stops.
//
//   conveyor::pipeline p{chain, {.ring_capacity = 4096, .trace_events = 16384}};
//   conveyor::pipeline q{chain, {.placement = conveyor::thread_placement::os}};
//   q.stop(conveyor::stop_mode::drain);
//
// Bad values throw config_error when the pipeline is built, naming what to change.
// docs/tuning.md says when to change which.
// Thread-safety: plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string_view>

namespace conveyor {

enum class stop_mode {
  drain,   // take no new input; everything already inside completes
  cancel,  // stop at once; what is inside is dropped and counted as cancelled
};

// Where the pipeline's stage threads run.
enum class thread_placement {
  automatic,  // as by_load while the stage threads alone fill the cores, else as os
  os,         // wherever the OS scheduler puts them
  by_load,    // each pinned to one CPU, balanced by the stages' measured CPU time per item
};

constexpr std::string_view to_string(thread_placement p) noexcept {
  switch (p) {
    case thread_placement::os:
      return "os";
    case thread_placement::by_load:
      return "by_load";
    default:
      return "automatic";
  }
}

// What a stage's exception does. Either way the item it was thrown for (a batch's: every
// item of the batch) counts as failed, and the report keeps the first errors and a count
// per stage.
enum class error_policy {
  automatic,  // isolate in a service pipeline (input<T>()), stop in a source pipeline
  stop,       // the first failure stops the pipeline; run() / wait() / stop() rethrow it
              // as stage_error, and every item still inside is settled at once
  isolate,    // the item fails alone (a service: its future or callback gets the
              // stage_error); every other item goes on, in input order where a stage is
              // ordered, and the pipeline keeps running
};

constexpr std::string_view to_string(error_policy p) noexcept {
  switch (p) {
    case error_policy::stop:
      return "stop";
    case error_policy::isolate:
      return "isolate";
    default:
      return "automatic";
  }
}

struct pipeline_options {
  // Every ring between two stages (power of two). An ordered map of W workers on lanes
  // (stage/map.hpp) has one such ring per worker on each side (between maps of W and V
  // workers: one per pair of workers that items pass between, up to W x V).
  std::size_t ring_capacity = 1024;
  // How far a ring may grow while the pipeline runs (a power of two in [1, 64]; 1: every
  // ring keeps ring_capacity). Where placement pins the two stage threads at the ends of
  // a ring to one CPU, they take turns on it, a context switch each time the ring fills
  // or empties. Such a ring, and a ring between two pinned CPUs next to such a pair
  // (it carries what arrives during a turn), moves to a reserve ring_capacity x
  // ring_growth deep, made when it first grows, where its consumer works through that
  // many elements within 1 ms of its CPU time (at the defaults, <= 122 ns per element: a
  // ring in front of a slower stage never grows), and back when that no longer holds
  // (pipeline/growth.hpp). Only rings with one thread at each end, of trivially copyable
  // items, in slots of at most 64 bytes get a reserve: 512 KiB a ring at most, at the
  // defaults (a ring of batches or strings never grows). Such a ring holds up
  // to ring_capacity x (1 + ring_growth) items while it moves. The report shows the
  // deepest each ring ran (ring_capacity).
  std::size_t ring_growth = 8;
  // Per-stage busy / starved / blocked time, ring occupancy, item latency and per-lane
  // H2D / compute / D2H time: a few clock reads per item and stage. false: only item
  // counts are kept (report() carries the counts and verdict_kind::unmeasured).
  bool metrics = true;
  // Events kept per trace track (one track per stage worker, three per lane), for
  // trace_json() / write_trace(): 40 bytes each, the oldest overwritten. 0: no trace,
  // and the cost is one branch per phase. Needs metrics.
  std::size_t trace_events = 0;
  // A live line on progress_out (default std::cerr) every progress_period (>= 250 ms):
  // items done, items/s, GPU busy and the bottleneck of the last period. Needs metrics.
  bool progress = false;
  std::chrono::milliseconds progress_period{500};
  std::ostream* progress_out = nullptr;
  // Where the stage threads run (Linux; elsewhere always as os). With more CPU-heavy
  // stage threads than cores the OS tends to wake a stage that waits for its input on
  // the core of the stage that fed it, often the slowest one, and the pipeline loses
  // what the two share. Pinning fixes that but a pinned thread cannot dodge other work.
  // by_load: 10 ms after the start, then every placement_period (>= 10 ms), each stage
  // thread's CPU time per item is measured and every stage thread is pinned to one of
  // the CPUs this process may use, balanced by those loads (pipeline/placement.hpp).
  // Each pipeline plans alone: for one pipeline that owns the machine's cores.
  // automatic (the default): by_load's plan, applied only while this pipeline's stage
  // threads fill the cores (>= 80 % of them) and other work (the rest of the process,
  // other processes) takes <= 10 %; every thread goes back on all allowed CPUs once
  // other work takes > 20 % (or the stage threads < 50 % for two periods). With more
  // CPUs than stage threads, a busy chain of stages under 1 us per item is tried packed,
  // neighbours in pairs, and kept so where that moves more items (packing_trial).
  // os: never pinned.
  thread_placement placement = thread_placement::automatic;
  std::chrono::milliseconds placement_period{200};
  // What a stage's exception does (see error_policy). With isolate (and in every service
  // pipeline, where items may expire: submit(x, deadline)) an ordered map keeps the
  // order with its reorder window, which skips what was dropped, rather than on lanes.
  error_policy errors = error_policy::automatic;
};

// produced == completed + failed + cancelled + expired once the pipeline has stopped.
// expired: a service's items whose deadline passed before a stage took them
// (submit(x, deadline)).
struct item_counts {
  std::uint64_t produced = 0, completed = 0, failed = 0, cancelled = 0, expired = 0;
};

}  // namespace conveyor
