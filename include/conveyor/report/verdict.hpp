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
//   device_g (GPU segment only)       max(lane streams' busy fraction, gpu_busy_fraction,
//                                     slot_wait_g): how much of the time the lanes' streams
//                                     (or the compute engine) had work, or the lanes'
//                                     threads waited for the device to free a slot
//   slot_wait_g                       max(busy_g + blocked_g, 1 - starved_g) when the stage
//                                     before g is blocked and the stage after g starved
//                                     (each >= input_starved: both wait on g, so the lane
//                                     threads' waits are for the device), else 0. 1 - starved
//                                     also counts the drain at the end of a run, after the
//                                     lane threads have enqueued their last batch.
//   load_k = busy_k, or max(busy_g, device_g) for the GPU segment
//   boundary between k and k+1:       d_k = blocked_k - starved_{k+1}; > 0 means the
//                                     upstream side waits for the downstream side
//   attribution score(k) = sum_{i<k} d_i - sum_{i>=k} d_i: how well "everything before k
//                                     waits for room, everything after k waits for input"
//                                     fits; highest at the bottleneck.
//
// Decision procedure (thresholds: verdict_thresholds, named below):
//   1. idle           wall_s <= 0, or no item was produced, completed, failed or cancelled.
//   2. GPU at capacity: some gpu stage has device_g >= saturated. Then the phase with the
//      most lane time (summed over lanes) decides: compute -> compute_bound (ties go to
//      compute), H2D -> transfer_bound_h2d, D2H -> transfer_bound_d2h. This wins over a
//      saturated CPU stage: with the device at >= 85 %, more CPU capacity cannot raise
//      throughput by more than 1/0.85 - 1 = 18 %; the device is the expensive resource
//      and is where the time goes. The CPU stage is named in the summary.
//   3. Some stage at capacity (load_k >= saturated): among those, the one with the
//      highest attribution score (ties within `tie`: the higher load) is the bottleneck,
//      unless another stage at capacity is within `tie` of it in both score and load:
//      then no one stage is waited on and the verdict is balanced (scale them together).
//      Otherwise:
//        the first stage                                  -> source_bound
//        a sink, or any stage after the last gpu stage    -> sink_bound (postprocess)
//        anything else (map, batch, unbatch, or the GPU
//        segment's host threads with the device not busy)  -> cpu_stage_bound
//      With another stage at capacity too (load_o >= saturated), the advice says that
//      relieving the named stage alone gains at most 1/load_o - 1.
//      Where the advice is to add workers (a map stage, or several stages at capacity),
//      but the process already keeps >= cores_busy of its CPUs busy (report::cpus and
//      process_cpu_s), more workers would only share the same cores: the advice says so
//      and turns to making the stage cheaper, moving its work to the GPU, more cores, and,
//      with more stage threads than cores, the placement that would pin them where
//      report::placement says they were not pinned (placement_advice()).
//   4. Nothing at capacity:
//      a. under_batched: batches leave on timeout (>= timeout_share of them) at a mean
//         size <= fill_low x max_size while the device is busy < gpu_idle. Items arrive
//         too slowly to fill batches within max_delay; every item pays the delay.
//      b. source_bound (input-limited): every stage after the first is starved >=
//         input_starved: the pipeline waits for input it is not given fast enough.
//      c. balanced: otherwise; no single stage limits throughput (none is at capacity,
//         and the waits are spread out rather than pointing at one stage).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

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
  // taken: adding workers cannot help
  double cores_busy = 0.9;
};

}  // namespace conveyor::metrics

namespace conveyor::detail::verdict_text {

inline std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * f);
  return buf;
}
inline std::string num(double v, const char* f = "%.1f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
inline std::string quoted(const std::string& s) { return "'" + s + "'"; }

struct load {
  double busy = 0, starved = 0, blocked = 0, device = 0, value = 0;
};

}  // namespace conveyor::detail::verdict_text

namespace conveyor::metrics {

// How busy the device was: lanes' stream time and the compute union, whichever is higher.
inline double device_busy_fraction(const report& r) noexcept {
  return std::max(lane_busy_fraction(r), r.gpu_busy_fraction);
}

// For a stage at capacity, with `threads` stage threads on the report's cpus and
// `workers` of them the stage's: what thread placement can still do, given where the
// threads ran (report::placement). Nothing where they were pinned (by_load, or automatic
// after at least half its rounds) or no round was done; else the setting that pins.
inline std::string placement_advice(const report& r, std::size_t threads, std::size_t workers) {
  const std::string lead = " With " + std::to_string(threads) + " stage threads on " +
                           std::to_string(r.cpus) + " cores, ";
  const std::string own = workers == 1 ? "a core" : "cores";
  const placement_report& p = r.placement;
  if (p.mode == "by_load") return {};
  if (p.mode == "automatic") {
    if (p.rounds == 0 || 2 * p.pinned_rounds >= p.rounds) return {};
    return lead + "automatic placement had them pinned after only " +
           std::to_string(p.pinned_rounds) + " of its " + std::to_string(p.rounds) +
           " rounds (other work took part of the cores, or the stages did not fill them); "
           "pipeline_options::placement = by_load gives it " + own +
           " of its own whatever else runs.";
  }
  if (p.mode == "os")
    return lead + "pipeline_options::placement = automatic (the default) gives it " + own +
           " of its own while the pipeline has the cores to itself, by_load whatever else runs.";
  return lead + "pipeline_options::placement = by_load gives it " + own + " of its own.";
}

inline verdict diagnose(const report& r, const verdict_thresholds& th = {}) {
  namespace d = ::conveyor::detail::verdict_text;
  verdict v;
  const std::size_t n = r.stages.size();
  std::uint64_t stage_items = 0;
  for (const auto& s : r.stages) stage_items += s.items;
  if (!(r.wall_s > 0.0) ||
      (r.produced + r.completed + r.failed + r.cancelled == 0 && stage_items == 0)) {
    v.kind = verdict_kind::idle;
    v.summary = "no items went through the pipeline";
    v.advice = "nothing to tune: run it with input";
    return v;
  }

  const double device = device_busy_fraction(r);
  std::vector<d::load> L(n);
  std::size_t last_gpu = n;  // index of the last gpu stage; n: none
  for (std::size_t k = 0; k < n; ++k) {
    const stage_report& s = r.stages[k];
    L[k].busy = busy_fraction(s, r.wall_s);
    L[k].starved = starved_fraction(s, r.wall_s);
    L[k].blocked = blocked_fraction(s, r.wall_s);
    L[k].value = L[k].busy;
  }
  // The GPU segment's host threads are blocked while they wait for a free slot (the
  // device still works on earlier batches) or, through the completion side, for room
  // downstream. When the waits point at the segment from both sides — the stage before
  // it blocked >= input_starved (waiting for room in the segment's ring) and the stage
  // after it starved >= input_starved (nothing downstream pushes back) — that wait is
  // the device's: the lanes are at capacity even where their streams show gaps between
  // batches (the turnaround from a batch's end to its slot's reuse, which more slots per
  // lane hide). Without a stage before it, the segment must be starved at most half of
  // (1 - saturated) instead. The lane threads' share not spent waiting for input is
  // then the device's load (the drain after their last batch included).
  std::vector<double> slot_wait(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    if (r.stages[k].kind != stage_kind::gpu) continue;
    const bool upstream_waits = k == 0 ? L[k].starved <= (1.0 - th.saturated) / 2
                                       : L[k - 1].blocked >= th.input_starved;
    const bool downstream_waits = k + 1 < n && L[k + 1].starved >= th.input_starved;
    if (upstream_waits && downstream_waits)
      slot_wait[k] = std::clamp(std::max(L[k].busy + L[k].blocked, 1.0 - L[k].starved), 0.0, 1.0);
    L[k].device = std::max(device, slot_wait[k]);
    L[k].value = std::max(L[k].busy, L[k].device);
    last_gpu = k;
  }
  const auto score = [&](std::size_t k) {
    double sc = 0.0;
    for (std::size_t i = 0; i + 1 < n; ++i) {
      const double dk = L[i].blocked - L[i + 1].starved;
      sc += i < k ? dk : -dk;
    }
    return sc;
  };
  const auto neighbours = [&](std::size_t k) {
    std::string out;
    if (k > 0)
      out += "; " + d::quoted(r.stages[k - 1].name) + " before it is blocked " +
             d::pct(L[k - 1].blocked) + " waiting for room";
    if (k + 1 < n)
      out += "; " + d::quoted(r.stages[k + 1].name) + " after it is starved " +
             d::pct(L[k + 1].starved);
    return out;
  };
  // The saturated stages other than `except`, for the summary.
  const auto also_saturated = [&](std::size_t except) {
    std::string out;
    for (std::size_t k = 0; k < n; ++k)
      if (k != except && L[k].value >= th.saturated)
        out += (out.empty() ? "; also near capacity: " : ", ") + d::quoted(r.stages[k].name) +
               " " + d::pct(L[k].value);
    return out;
  };

  // 2. the GPU at capacity
  std::size_t gpu_k = n;
  for (std::size_t k = 0; k < n; ++k)
    if (r.stages[k].kind == stage_kind::gpu && L[k].device >= th.saturated) gpu_k = k;
  if (gpu_k != n || (n == 0 && device >= th.saturated)) {
    double h2d = 0, compute = 0, d2h = 0, h2d_bytes = 0, d2h_bytes = 0;
    for (const auto& l : r.lanes) {
      h2d += l.h2d_s;
      compute += l.compute_s;
      d2h += l.d2h_s;
      h2d_bytes += static_cast<double>(l.h2d_bytes);
      d2h_bytes += static_cast<double>(l.d2h_bytes);
    }
    const double total = h2d + compute + d2h;
    const double fh = total > 0 ? h2d / total : 0, fc = total > 0 ? compute / total : 1,
                 fd = total > 0 ? d2h / total : 0;
    v.stage = gpu_k != n ? r.stages[gpu_k].name : std::string{};
    const std::string split = "H2D " + d::pct(fh) + ", compute " + d::pct(fc) + ", D2H " +
                              d::pct(fd) + " of lane time";
    const double streams = lane_busy_fraction(r);
    const bool slot_bound = gpu_k != n && slot_wait[gpu_k] >= th.saturated && streams < th.saturated;
    const std::string state = "the GPU segment is at capacity (lanes' streams busy " +
                              d::pct(streams) + ", GPU computing " +
                              d::pct(r.gpu_busy_fraction) + " of the wall time" +
                              (slot_bound ? ", lane threads waiting for a free slot or busy " +
                                                d::pct(slot_wait[gpu_k])
                                          : std::string{}) +
                              ")";
    const std::string context = (gpu_k != n ? neighbours(gpu_k) : std::string{}) +
                                (gpu_k != n ? also_saturated(gpu_k) : std::string{});
    const std::string overlap =
        (r.gpu_busy_fraction < th.saturated && r.lanes.size() > 0
             ? " Kernels run only " + d::pct(r.gpu_busy_fraction) +
                   " of the time while the lanes are saturated: more lanes would overlap "
                   "copies with kernels."
             : std::string{}) +
        (slot_bound ? " The streams idle " + d::pct(1.0 - streams) +
                          " of the time between batches while the lanes wait for slots: more "
                          "slots_per_lane keep the next batches queued on the stream."
                    : std::string{});
    if (fc >= fh && fc >= fd) {
      v.kind = verdict_kind::compute_bound;
      v.summary = state + "; " + split + context;
      v.advice =
          "healthy: the GPU is the bottleneck. To go faster make the model cheaper (fp16 / "
          "tensor cores, fused kernels, CUDA graphs for many small launches) or add GPUs; "
          "the CPU stages have headroom." +
          overlap;
    } else if (fh >= fd) {
      v.kind = verdict_kind::transfer_bound_h2d;
      v.summary = state + "; host-to-device copies dominate: " + split + ", at " +
                  d::num(h2d > 0 ? h2d_bytes / h2d * 1e-9 : 0.0, "%.2f") + " GB/s" + context;
      v.advice =
          "send less and send it in bigger pieces: ship uint8 (or fp16) instead of float and "
          "normalize on the GPU, use larger batches so per-copy overhead amortizes, and keep "
          "enough lanes that copies overlap kernels." +
          overlap;
    } else {
      v.kind = verdict_kind::transfer_bound_d2h;
      v.summary = state + "; device-to-host copies dominate: " + split + ", at " +
                  d::num(d2h > 0 ? d2h_bytes / d2h * 1e-9 : 0.0, "%.2f") + " GB/s" + context;
      v.advice =
          "bring less back: reduce on the GPU (argmax / top-k / thresholding) before the copy, "
          "use larger batches, and keep enough lanes that copies overlap kernels." +
          overlap;
    }
    return v;
  }

  // 3. a stage at capacity
  std::size_t best = n;
  double best_score = -std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < n; ++k) {
    if (L[k].value < th.saturated) continue;
    const double sc = score(k);
    if (best == n || sc > best_score + th.tie ||
        (sc > best_score - th.tie && L[k].value > L[best].value)) {
      best = k;
      best_score = sc;
    }
  }
  // Whether the process already keeps its cores busy: then adding workers only makes
  // more threads share them. With more threads than cores, placement by load keeps the
  // slowest stage on a core of its own.
  const double cpu_load = process_cpu_load(r);
  const bool cores_taken = cpu_load >= th.cores_busy;
  const std::string cores_note = "the process keeps " + d::pct(cpu_load) + " of its " +
                                 std::to_string(r.cpus) + (r.cpus == 1 ? " core" : " cores") +
                                 " busy";
  std::size_t threads = 0;
  for (const auto& s : r.stages) threads += s.workers;
  const std::size_t best_workers = best != n ? r.stages[best].workers : 0;
  const std::string placement_hint =
      threads > r.cpus && best_workers < r.cpus ? placement_advice(r, threads, best_workers)
                                                : std::string{};
  // Another stage at capacity that the waits cannot tell apart from `best` (score and
  // load both within `tie`): several stages share the limit.
  std::string tied;
  for (std::size_t k = 0; best != n && k < n; ++k)
    if (k != best && L[k].value >= th.saturated && score(k) > best_score - th.tie &&
        L[k].value > L[best].value - th.tie)
      tied += ", " + d::quoted(r.stages[k].name) + " " + d::pct(L[k].value);
  if (!tied.empty()) {
    v.kind = verdict_kind::balanced;
    v.summary = "several stages are at capacity and none waits on the others: " +
                d::quoted(r.stages[best].name) + " " + d::pct(L[best].value) + tied;
    v.advice = cores_taken
                   ? "no single knob, and no spare cores: " + cores_note +
                         "; make these stages cheaper together, move work onto the GPU, or "
                         "run on more cores."
                   : "no single knob: speeding up one of these stages alone will not help; "
                     "scale them together (workers on each), or accept this as the "
                     "pipeline's capacity.";
    return v;
  }
  if (best != n) {
    const stage_report& s = r.stages[best];
    v.stage = s.name;
    const std::string who = d::quoted(s.name) + " (" + std::string(to_string(s.kind)) + ", " +
                            std::to_string(s.workers) + (s.workers == 1 ? " worker" : " workers") +
                            ")";
    const std::string gpu_note =
        r.lanes.empty() ? std::string{} : "; GPU busy " + d::pct(r.gpu_busy_fraction);
    const std::string numbers =
        who + " is busy " + d::pct(L[best].value) + " of its capacity" + neighbours(best) +
        gpu_note + also_saturated(best);
    if (best == 0) {
      v.kind = verdict_kind::source_bound;
      v.summary = "the source sets the pace: " + numbers;
      v.advice =
          "make the source faster: move decoding or parsing out of it into a map stage with "
          "workers, prefetch or read in parallel, or feed several sources.";
    } else if (s.kind == stage_kind::sink || (last_gpu != n && best > last_gpu)) {
      v.kind = verdict_kind::sink_bound;
      v.summary = "the end of the pipeline sets the pace: " + numbers;
      v.advice = s.kind == stage_kind::sink
                     ? "make the sink cheaper or hand its work off (buffer, write asynchronously, "
                       "or do the heavy part in a map stage with workers before it)."
                 : cores_taken
                     ? "make " + d::quoted(s.name) + " cheaper: " + cores_note +
                           ", so more workers would only share them. Reduce on the GPU "
                           "(argmax / top-k) so less is left for the CPU, or run on more "
                           "cores." + placement_hint
                     : "add workers to " + d::quoted(s.name) + " (.workers(" +
                           std::to_string(2 * s.workers) +
                           ")), or reduce on the GPU (argmax / top-k) so less is left for the CPU.";
    } else {
      v.kind = verdict_kind::cpu_stage_bound;
      v.summary = "a CPU stage sets the pace and the stages after it wait: " + numbers;
      switch (s.kind) {
        case stage_kind::gpu:
          v.advice = "the lanes' host threads (stage-in and enqueue) are the limit while the "
                     "device is busy only " + d::pct(L[best].device) +
                     ": add lanes, or make stage-in cheaper (ship uint8, normalize on the GPU).";
          break;
        case stage_kind::batch:
          v.advice = "the batch stage itself is the limit: make batch assembly cheaper (prepare "
                     "items straight into the pinned slot in stage-in), or move work off it.";
          break;
        default:
          v.advice = cores_taken
                         ? "make " + d::quoted(s.name) + " cheaper or move its work onto the "
                               "GPU: " + cores_note +
                               ", so more workers would only share them; or run on more "
                               "cores." + placement_hint
                         : "add workers to " + d::quoted(s.name) + " (.workers(" +
                               std::to_string(2 * s.workers) + ")), or move its work onto the GPU.";
      }
    }
    // Another stage near capacity caps what relieving this one can give.
    std::size_t next = n;
    for (std::size_t k = 0; k < n; ++k)
      if (k != best && L[k].value >= th.saturated && (next == n || L[k].value > L[next].value))
        next = k;
    if (next != n && L[next].value > 0.0)
      v.advice += " " + d::quoted(r.stages[next].name) + " is near capacity too (" +
                  d::pct(L[next].value) + "): relieving " + d::quoted(s.name) +
                  " alone gains at most about " +
                  d::pct(std::max(0.0, 1.0 / L[next].value - 1.0)) +
                  "; scale both.";
    return v;
  }

  // 4. nothing at capacity
  std::size_t top = 0;
  for (std::size_t k = 1; k < n; ++k)
    if (L[k].value > L[top].value) top = k;
  if (r.batching && r.batching->batches > 0 && r.batching->max_size > 0) {
    const batch_report& b = *r.batching;
    const double timeouts = static_cast<double>(b.flushed_on_timeout) / static_cast<double>(b.batches);
    const double fill = b.mean_size / static_cast<double>(b.max_size);
    if (timeouts >= th.timeout_share && fill <= th.fill_low && device < th.gpu_idle) {
      v.kind = verdict_kind::under_batched;
      for (const auto& s : r.stages)
        if (s.kind == stage_kind::batch) {
          v.stage = s.name;
          break;
        }
      v.summary = d::pct(timeouts) + " of " + std::to_string(b.batches) +
                  " batches left on timeout at a mean size of " + d::num(b.mean_size) +
                  " of max " + std::to_string(b.max_size) + ", and the GPU is busy only " +
                  d::pct(device);
      v.advice =
          "items arrive too slowly to fill a batch within max_delay, so every item waits the "
          "full delay: lower max_size toward what arrives (or max_delay, for latency), or "
          "submit more concurrently (clients that wait for results before sending more cap "
          "the batch size).";
      return v;
    }
  }
  if (n >= 2) {
    double min_starved = 1.0;
    for (std::size_t k = 1; k < n; ++k) min_starved = std::min(min_starved, L[k].starved);
    if (min_starved >= th.input_starved) {
      v.kind = verdict_kind::source_bound;
      v.stage = r.stages[0].name;
      v.summary = "the pipeline waits for input: every stage after " +
                  d::quoted(r.stages[0].name) + " is starved at least " + d::pct(min_starved) +
                  ", and " + d::quoted(r.stages[0].name) + " is busy " + d::pct(L[0].busy);
      v.advice =
          "the pipeline has spare capacity and throughput follows the input rate: feed it "
          "faster (more clients, a faster source) to use it.";
      return v;
    }
  }
  v.kind = verdict_kind::balanced;
  v.summary = n == 0 ? "no stage is at capacity"
                     : "no stage is at capacity (most loaded: " + d::quoted(r.stages[top].name) +
                           " " + d::pct(L[top].value) + ") and the waits do not point at one stage";
  v.advice =
      "no single knob: throughput is limited by all stages together. Scale the most loaded "
      "stage first, or enlarge the rings so stages absorb each other's jitter.";
  return v;
}

// Sets r.throughput (completed / wall_s) and r.verdict = diagnose(r).
inline void complete_report(report& r, const verdict_thresholds& th = {}) {
  r.throughput = r.wall_s > 0.0 ? static_cast<double>(r.completed) / r.wall_s : 0.0;
  r.verdict = diagnose(r, th);
}

}  // namespace conveyor::metrics
