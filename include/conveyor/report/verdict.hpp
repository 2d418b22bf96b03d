// conveyor/report/verdict.hpp: names the bottleneck of a run and the knob to turn.
//
//   conveyor::report r = ...;                           // filled from the counters
//   conveyor::metrics::complete_report(r);              // throughput + r.verdict
//   conveyor::verdict v = conveyor::metrics::diagnose(r);   // or just the verdict
//   // v.kind, v.stage ("normalize"), v.summary (the numbers), v.advice (the knob)
//
// The verdict is attributed by starved/blocked time, not by overlap of intervals. In a
// chain of stages joined by bounded rings, the slowest stage B is busy all of its
// capacity, the stages before B fill B's input ring and then wait for room (blocked),
// and the stages after B drain their rings and then wait for input (starved).
//
// Quantities (fractions of a stage's capacity, wall_s x workers):
//   busy_k, starved_k, blocked_k      from the stage_report
//   the GPU segment's parts (per lane: wall x lanes):
//     lane threads  busy_g (stage-in and the enqueue calls)
//     device        max(lane streams' busy fraction, gpu_busy_fraction)
//     completion    the lanes' stage_out_s (stage-out on the completion threads)
//   pace part                         the busiest part; a host part takes it from the
//                                     device only when busier by `margin`
//   slot_wait_g                       max(busy_g + blocked_g, 1 - starved_g) when the stage
//                                     before g is blocked and the stage after g starved
//                                     (each >= input_starved: both wait on g, so the lane
//                                     threads' waits are for the device), else 0. 1 - starved
//                                     also counts the drain at the end of a run, after the
//                                     lane threads have enqueued their last batch. It is
//                                     the pace part's load too when that part is busy
//                                     >= part_busy (a slot comes back after all three parts
//                                     did their share); below it, the wait is the hand-offs'
//                                     turnaround and no part is near capacity.
//   load_k = busy_k; for the GPU segment the highest of its parts and the credited wait
//   boundary between k and k+1:       d_k = blocked_k - starved_{k+1}; > 0 means the
//                                     upstream side waits for the downstream side
//   attribution score(k) = sum_{i<k} d_i - sum_{i>=k} d_i: how well "everything before k
//                                     waits for room, everything after k waits for input"
//                                     fits; highest at the bottleneck.
//
// Decision procedure (thresholds: verdict_thresholds, named below):
//   1. idle           wall_s <= 0, or no item was produced, completed, failed or cancelled.
//   2. GPU at capacity: some gpu stage whose pace part is the device has load_g >=
//      saturated. Then the phase with the
//      most lane time (summed over lanes) decides: compute -> compute_bound (ties go to
//      compute), H2D -> transfer_bound_h2d, D2H -> transfer_bound_d2h. Transfer advice
//      fits the bytes per batch (below large_copy_bytes: fewer, larger copies, not fewer
//      bytes). Hints (more lanes when kernels idle on saturated lanes, more slots when
//      the streams idle between batches) are ordered by the share of time they stand to
//      win, and come before "make the model cheaper"; "healthy" only without them. This
//      wins over a
//      saturated CPU stage: with the device at >= 85 %, more CPU capacity cannot raise
//      throughput by more than 1/0.85 - 1 = 18 %; the device is the expensive resource
//      and is where the time goes. The CPU stage is named in the summary.
//   3. Some stage at capacity (load_k >= saturated): among those, the one with the
//      highest attribution score (ties within `tie`: the higher load) is the bottleneck,
//      unless another stage (at capacity or not) has a load within `margin` of its own
//      and a score within `tie`: then no one stage is clearly nearer capacity and the
//      verdict is balanced (scale them together).
//      Otherwise:
//        the first stage                                  -> source_bound
//        a sink, or any stage after the last gpu stage    -> sink_bound (postprocess)
//        anything else (map, batch, unbatch, or the GPU
//        segment's host side: its pace part is the lane
//        threads or the completion threads; the summary
//        names stage-in, enqueue or stage-out)             -> cpu_stage_bound
//      With another stage at capacity too (load_o >= saturated), the advice says that
//      relieving the named stage alone gains at most 1/load_o - 1.
//      Where the advice is to add workers (a map stage, or several stages at capacity),
//      but the process already keeps >= cores_busy of its CPUs busy (report::cpus and
//      process_cpu_s), or the machine is >= cores_busy busy with >= others_busy of it
//      other processes' (machine_cpu_s), and the stage runs on a CPU >= cpu_bound of its
//      busy time (cpu_s), more workers would only share the same cores: the
//      advice says so
//      and turns to making the stage cheaper, moving its work to the GPU, more cores, and,
//      with more stage threads than cores, the placement that would pin them where
//      report::placement says they were not pinned (placement_advice()).
//   4. Nothing at capacity:
//      a. under_batched: batches leave on timeout (>= timeout_share of them) at a mean
//         size <= fill_low x max_size while the device is busy < gpu_idle. Items arrive
//         too slowly to fill batches within max_delay; every item pays the delay.
//      b. source_bound (input-limited): every stage after the first is starved >=
//         input_starved: the pipeline waits for input it is not given fast enough.
//      c. balanced: otherwise; no stage is near capacity, and the summary says what
//         limits the run: too short to tell (wall_s < min_wall_s, or the mean item
//         latency >= short_run of it), the cores (taken, as in 3), or waits spread out.
//   5. Moved (applied to the result of 1-4): the timeline (report::timeline) falls into
//      phases (bottleneck_phases, timeline.hpp: each >= phase_share of the run) naming
//      different bottlenecks. The verdict names the phase that held most of the run (ties
//      within `margin` of it: the later), says when it moved and each phase, and gives
//      each phase's advice, the longest phase first.
//
//   6. Lanes that cannot queue ahead (applied to the result of 1-5, where it names a GPU
//      segment): the device computes >= sync_min_share of wall x lanes, and either
//      >= drained_share of the segment's compute calls returned to an idle stream
//      (lane_report::drained_batches: the call waited for the device at its end), or the
//      calls took >= enqueue_share of the device's compute time (lane_report::enqueue_s:
//      a wait somewhere inside them, or launches as long as the kernels they launch). An
//      enqueue-only compute returns long before its kernels finish. One that synchronizes
//      (a Thrust call that returns a value or uses the default policy, cudaMalloc/cudaFree,
//      a stream or device synchronize) holds its lane thread until the device is done, so
//      the lane never has two batches queued and copies stop overlapping kernels. The
//      advice says so first: remove the synchronizing call, or capture launch-bound work
//      in a CUDA graph. Where another stage sets the pace, it says nothing: the lanes'
//      pace is not the run's.
//
// Each numbered case is one function in src/verdict.cpp, tried in this order.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <string>

#include "conveyor/report/report.hpp"

namespace conveyor::metrics {

struct verdict_thresholds {
  // load at or above which a stage is "at capacity" (it would be 1.0 without the gaps
  // between charged phases and the warm-up/drain at the ends of a run)
  double saturated = 0.85;
  // attribution scores (and loads) closer than this are a tie
  double tie = 0.05;
  // under-batched: share of batches that left on timeout, at least
  double timeout_share = 0.5;
  // under-batched: mean batch size at most this share of max_size
  double fill_low = 0.5;
  // under-batched: the device busy less than this
  double gpu_idle = 0.5;
  // input-limited: every stage after the first starved at least this share
  double input_starved = 0.5;
  // the process's CPU time over wall x usable CPUs at or above which the cores are
  // taken: adding workers cannot help. Also the machine's load (every process, from
  // /proc/stat) at or above which, with others_busy of it other processes', other work
  // holds the cores.
  double cores_busy = 0.9;
  double others_busy = 0.2;
  // taken cores limit a stage only when it runs on a CPU at least this share of its busy
  // time (stage_report::cpu_s, lane_report::stage_out_cpu_s; not measured: assumed); a
  // stage that waits in its function (I/O, sleeps, a device) gains from more workers
  // whatever holds the cores
  double cpu_bound = 0.1;
  // a stage is named only when no other stage's load is within `margin` of its own,
  // unless the waits point at it (attribution score higher by `tie`); within the GPU
  // segment, a host part takes the pace from the device only when busier by `margin`
  double margin = 0.10;
  // the slot wait is credited to a part of the GPU segment only when that part is busy
  // at least this share; below it no part is near capacity
  double part_busy = 0.5;
  // copies per batch below this many bytes: their fixed cost dominates, not the bytes
  double large_copy_bytes = 256.0 * 1024;
  // nothing at capacity, and the run shorter than min_wall_s or its mean item latency
  // at least short_run of the wall time: too short to tell
  double min_wall_s = 0.25;
  double short_run = 0.25;
  // a timeline phase must last this share of the run (and two periods) to count
  double phase_share = 0.2;
  // lanes waiting in compute (see 6. below): at least drained_share of the compute calls
  // returned to an idle stream (lane_report::drained_batches), or the calls took at least
  // enqueue_share of the device's compute time; the device computing at least
  // sync_min_share of wall x lanes
  double drained_share = 0.8;
  double enqueue_share = 0.8;
  double sync_min_share = 0.05;
};

// How busy the device was: lanes' stream time and the compute union, whichever is higher.
double device_busy_fraction(const report& r) noexcept;

// For a stage at capacity, with `threads` stage threads on the report's cpus and
// `workers` of them the stage's: what thread placement can still do, given where the
// threads ran (report::placement). Nothing where they were pinned (by_load, or automatic
// after at least half its rounds) or no round was done; else the setting that pins.
std::string placement_advice(const report& r, std::size_t threads, std::size_t workers);

// The verdict on a filled report (see above).
verdict diagnose(const report& r, const verdict_thresholds& th = {});

// Sets r.throughput (completed / wall_s) and r.verdict = diagnose(r).
void complete_report(report& r, const verdict_thresholds& th = {});

}  // namespace conveyor::metrics
