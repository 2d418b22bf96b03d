// src/conveyor/verdict.cpp: the verdict (conveyor/report/verdict.hpp), one function per
// case of its decision procedure, tried in troubleshooting order by diagnose().
#include "conveyor/report/verdict.hpp"

#include "conveyor/report/timeline.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace conveyor::metrics {
namespace {

std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * f);
  return buf;
}
std::string num(double v, const char* f = "%.1f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string quoted(const std::string& s) { return "'" + s + "'"; }

// A stage's fractions of its capacity, and its load: busy, or for the GPU segment the
// busiest of its three parts, the slot wait credited to it (see the header's segment).
struct load {
  double busy = 0, starved = 0, blocked = 0, device = 0, value = 0;
};

// The GPU segment's three parts, each a fraction of its capacity (wall x lanes): the
// lane threads (stage-in and enqueue: the stage's busy), the device (streams or the
// compute union) and the completion threads (stage-out); which one sets the pace.
struct segment {
  enum part_kind { device, lane_threads, completion };
  double lane_threads_busy = 0, stage_in = 0, device_busy = 0, stage_out = 0;
  part_kind top = device;
  double top_load = 0;
  bool slot_wait_credited = false;
};

// What every case reads: the report, the thresholds and each stage's load.
struct run_view {
  run_view(const report& rep, const verdict_thresholds& thresholds)
      : r(rep),
        th(thresholds),
        n(rep.stages.size()),
        device(device_busy_fraction(rep)),
        L(n),
        slot_wait(n, 0.0),
        seg(n) {
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
    // it blocked >= input_starved and the stage after it starved >= input_starved — that
    // wait is the device's: the lanes are at capacity even where their streams show gaps
    // between batches (the turnaround from a batch's end to its slot's reuse, which more
    // slots per lane hide). Without a stage before it, the segment must be starved at
    // most half of (1 - saturated) instead. The lane threads' share not spent waiting for
    // input is then the device's load (the drain after their last batch included).
    // Which part of the segment that wait is for: the busiest of the lane threads, the
    // device and the completion threads (ties within `margin` go to the device, then to
    // the lane threads). A slot comes back only after all three have done their share
    // of its batch, so the slot wait is credited to that part, and only when it is
    // busy at least part_busy: below it no part is near capacity, and the wait is the
    // turnaround between them (the threads handing batches on), not any one's load.
    double lanes_n = 0, stage_in_s = 0, stage_out_s = 0;
    for (const auto& l : r.lanes) {
      stage_in_s += l.stage_in_s;
      stage_out_s += l.stage_out_s;
      lanes_n += 1;
    }
    const double lane_cap = r.wall_s * lanes_n;
    for (std::size_t k = 0; k < n; ++k) {
      if (r.stages[k].kind != stage_kind::gpu) continue;
      const bool upstream_waits =
          k == 0 ? L[k].starved <= (1.0 - th.saturated) / 2 : L[k - 1].blocked >= th.input_starved;
      const bool downstream_waits = k + 1 < n && L[k + 1].starved >= th.input_starved;
      if (upstream_waits && downstream_waits)
        slot_wait[k] = std::clamp(std::max(L[k].busy + L[k].blocked, 1.0 - L[k].starved), 0.0, 1.0);
      segment& g = seg[k];
      g.lane_threads_busy = L[k].busy;
      g.device_busy = device;
      g.stage_in = lane_cap > 0 ? std::min(stage_in_s / lane_cap, 1.0) : 0.0;
      g.stage_out = lane_cap > 0 ? std::min(stage_out_s / lane_cap, 1.0) : 0.0;
      g.top = segment::device;
      g.top_load = g.device_busy;
      if (g.lane_threads_busy > g.top_load + th.margin) {
        g.top = segment::lane_threads;
        g.top_load = g.lane_threads_busy;
      }
      if (g.stage_out > g.top_load + (g.top == segment::device ? th.margin : 0.0)) {
        g.top = segment::completion;
        g.top_load = g.stage_out;
      }
      g.slot_wait_credited = slot_wait[k] > g.top_load && g.top_load >= th.part_busy;
      const double load = std::max(g.top_load, g.slot_wait_credited ? slot_wait[k] : 0.0);
      L[k].device = g.top == segment::device ? load : device;
      L[k].value = std::max({L[k].busy, device, g.stage_out, load});
      last_gpu = k;
    }
  }

  // The GPU segment at k has its device setting the pace, at capacity.
  bool device_at_capacity(std::size_t k) const noexcept {
    return r.stages[k].kind == stage_kind::gpu && seg[k].top == segment::device &&
           L[k].value >= th.saturated;
  }

  bool saturated(std::size_t k) const noexcept { return L[k].value >= th.saturated; }

  // Whether stage k's busy time is CPU work (so that taken cores limit it): its threads
  // ran on a CPU >= cpu_bound of it; not measured (0): assumed. For the GPU segment's
  // completion part, stage-out's CPU time over its wall time.
  bool uses_cpu(std::size_t k) const noexcept {
    const stage_report& s = r.stages[k];
    if (s.kind == stage_kind::gpu && seg[k].top == segment::completion) {
      double wall = 0, cpu = 0;
      for (const auto& l : r.lanes) {
        wall += l.stage_out_s;
        cpu += l.stage_out_cpu_s;
      }
      return cpu <= 0.0 || cpu >= th.cpu_bound * wall;
    }
    return s.cpu_s <= 0.0 || s.cpu_s >= th.cpu_bound * s.busy_s;
  }
  // Whether the stages' busy time, all together, is CPU work (as uses_cpu()).
  bool busy_is_cpu() const noexcept {
    double busy = 0, cpu = 0;
    for (const auto& s : r.stages) {
      busy += s.busy_s;
      cpu += s.cpu_s;
    }
    return cpu <= 0.0 || cpu >= th.cpu_bound * busy;
  }

  // How well "everything before k waits for room, everything after k waits for input"
  // fits: highest at the bottleneck (the header's score(k)).
  double score(std::size_t k) const noexcept {
    double sc = 0.0;
    for (std::size_t i = 0; i + 1 < n; ++i) {
      const double dk = L[i].blocked - L[i + 1].starved;
      sc += i < k ? dk : -dk;
    }
    return sc;
  }

  // "; 'a' before it is blocked 80% waiting for room; 'c' after it is starved 90%".
  std::string neighbours(std::size_t k) const {
    std::string out;
    if (k > 0)
      out += "; " + quoted(r.stages[k - 1].name) + " before it is blocked " +
             pct(L[k - 1].blocked) + " waiting for room";
    if (k + 1 < n)
      out += "; " + quoted(r.stages[k + 1].name) + " after it is starved " + pct(L[k + 1].starved);
    return out;
  }

  // The saturated stages other than `except`, for the summary.
  std::string also_saturated(std::size_t except) const {
    std::string out;
    for (std::size_t k = 0; k < n; ++k)
      if (k != except && saturated(k))
        out += (out.empty() ? "; also near capacity: " : ", ") + quoted(r.stages[k].name) + " " +
               pct(L[k].value);
    return out;
  }

  const report& r;
  const verdict_thresholds& th;
  const std::size_t n;
  const double device;
  std::vector<load> L;
  std::vector<double> slot_wait;
  std::vector<segment> seg;  // per stage; meaningful for gpu stages
  std::size_t last_gpu = n;  // index of the last gpu stage; n: none
};

// 1. Nothing went through.
std::optional<verdict> idle(const report& r) {
  std::uint64_t stage_items = 0;
  for (const auto& s : r.stages) stage_items += s.items;
  if (r.wall_s > 0.0 &&
      (r.produced + r.completed + r.failed + r.cancelled != 0 || stage_items != 0))
    return std::nullopt;
  return verdict{verdict_kind::idle,
                 {},
                 "no items went through the pipeline",
                 "nothing to tune: run it with input"};
}

// "12 KiB", "8.0 MiB": a byte count as people read it.
std::string bytes(double b) {
  if (b >= 1024.0 * 1024.0) return num(b / (1024.0 * 1024.0)) + " MiB";
  if (b >= 1024.0) return num(b / 1024.0) + " KiB";
  return num(b, "%.0f") + " bytes";
}

// A hint and the share of the wall time it stands to win, for ordering hints by it.
struct hint {
  double gain;
  std::string text;
};
std::string ordered(std::vector<hint> hints) {
  std::stable_sort(hints.begin(), hints.end(),
                   [](const hint& a, const hint& b) { return a.gain > b.gain; });
  std::string out;
  for (const hint& h : hints) out += (out.empty() ? "" : " ") + h.text;
  return out;
}

// 2. The GPU segment's device at capacity: the phase with the most lane time names the
// verdict.
std::optional<verdict> gpu_at_capacity(const run_view& v) {
  const report& r = v.r;
  const std::size_t n = v.n;
  std::size_t gpu_k = n;
  for (std::size_t k = 0; k < n; ++k)
    if (v.device_at_capacity(k)) gpu_k = k;
  if (gpu_k == n && !(n == 0 && v.device >= v.th.saturated)) return std::nullopt;

  double h2d = 0, compute = 0, d2h = 0, h2d_bytes = 0, d2h_bytes = 0, batches = 0;
  for (const auto& l : r.lanes) {
    h2d += l.h2d_s;
    compute += l.compute_s;
    d2h += l.d2h_s;
    h2d_bytes += static_cast<double>(l.h2d_bytes);
    d2h_bytes += static_cast<double>(l.d2h_bytes);
    batches += static_cast<double>(l.batches);
  }
  const double total = h2d + compute + d2h;
  const double fh = total > 0 ? h2d / total : 0, fc = total > 0 ? compute / total : 1,
               fd = total > 0 ? d2h / total : 0;
  verdict out;
  out.stage = gpu_k != n ? r.stages[gpu_k].name : std::string{};
  const std::string split =
      "H2D " + pct(fh) + ", compute " + pct(fc) + ", D2H " + pct(fd) + " of lane time";
  const double streams = lane_busy_fraction(r);
  const bool slot_bound = gpu_k != n && v.seg[gpu_k].slot_wait_credited &&
                          v.slot_wait[gpu_k] >= v.th.saturated && streams < v.th.saturated;
  const std::string state =
      "the GPU segment is at capacity (lanes' streams busy " + pct(streams) + ", GPU computing " +
      pct(r.gpu_busy_fraction) + " of the wall time" +
      (slot_bound ? ", lane threads waiting for a free slot or busy " + pct(v.slot_wait[gpu_k])
                  : std::string{}) +
      ")";
  std::string context = gpu_k != n ? v.neighbours(gpu_k) + v.also_saturated(gpu_k) : std::string{};
  if (gpu_k != n && v.seg[gpu_k].stage_out >= v.th.part_busy)
    context += "; stage-out keeps the completion threads busy " + pct(v.seg[gpu_k].stage_out);
  // The hints, each with the share of the time it stands to win: the kernels idle while
  // the lanes are saturated (more lanes overlap copies with kernels), the streams idle
  // between batches (more slots queue the next batch).
  const std::size_t lanes = r.lanes.empty() ? 1 : r.lanes.size();
  std::vector<hint> hints;
  if (r.gpu_busy_fraction < v.th.saturated && !r.lanes.empty())
    hints.push_back({1.0 - r.gpu_busy_fraction,
                     "Kernels run only " + pct(r.gpu_busy_fraction) +
                         " of the time while the lanes are saturated: more lanes (.lanes = " +
                         std::to_string(2 * lanes) + ") would overlap copies with kernels."});
  if (slot_bound)
    hints.push_back({1.0 - streams, "The streams idle " + pct(1.0 - streams) +
                                        " of the time between batches while the lanes wait for "
                                        "slots: more slots_per_lane keep the next batches queued "
                                        "on the stream."});
  const std::string first_hints = ordered(hints);
  const auto per_batch = [&](double b) { return batches > 0 ? b / batches : 0.0; };
  if (fc >= fh && fc >= fd) {
    out.kind = verdict_kind::compute_bound;
    out.summary = state + "; " + split + context;
    out.advice = hints.empty()
                     ? "healthy: the GPU is the bottleneck. To go faster make the model cheaper "
                       "(fp16 / tensor cores, fused kernels, CUDA graphs for many small "
                       "launches) or add GPUs; the CPU stages have headroom."
                     : first_hints +
                           " Then the GPU is the bottleneck: make the model cheaper (fp16 / "
                           "tensor cores, fused kernels, CUDA graphs for many small launches) "
                           "or add GPUs.";
  } else {
    const bool h = fh >= fd;
    const double b = per_batch(h ? h2d_bytes : d2h_bytes);
    const double secs = h ? h2d : d2h;
    out.kind = h ? verdict_kind::transfer_bound_h2d : verdict_kind::transfer_bound_d2h;
    out.summary = state + (h ? "; host-to-device" : "; device-to-host") +
                  " copies dominate: " + split + ", at " +
                  num(secs > 0 ? (h ? h2d_bytes : d2h_bytes) / secs * 1e-9 : 0.0, "%.2f") +
                  " GB/s, " + bytes(b) + " per batch" + context;
    // The advice fits the size: below large_copy_bytes a copy's fixed cost, not its
    // bytes, is what takes the time, and sending fewer bytes would not help.
    const std::string what =
        b < v.th.large_copy_bytes
            ? "copies of " + bytes(b) +
                  " per batch are too small for their bytes to matter: each copy's fixed "
                  "cost dominates, so use larger batches (fewer, bigger copies), and keep "
                  "enough lanes that copies overlap kernels."
        : h ? "send less and send it in bigger pieces: ship uint8 (or fp16) instead of float "
              "and normalize on the GPU, use larger batches so per-copy overhead amortizes, "
              "and keep enough lanes that copies overlap kernels."
            : "bring less back: reduce on the GPU (argmax / top-k / thresholding) before the "
              "copy, use larger batches, and keep enough lanes that copies overlap kernels.";
    out.advice = first_hints.empty() ? what : first_hints + " Then " + what;
  }
  return out;
}

// The stage at capacity with the highest attribution score (ties within `tie`: the
// higher load); n when none is at capacity.
std::size_t most_waited_on(const run_view& v) {
  std::size_t best = v.n;
  double best_score = -std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < v.n; ++k) {
    if (!v.saturated(k)) continue;
    const double sc = v.score(k);
    if (best == v.n || sc > best_score + v.th.tie ||
        (sc > best_score - v.th.tie && v.L[k].value > v.L[best].value)) {
      best = k;
      best_score = sc;
    }
  }
  return best;
}

// Whether the cores are taken — by this process, or by other work on the machine — so
// that adding workers only makes more threads share them, and the sentence that says so.
struct cores_state {
  explicit cores_state(const report& r, const verdict_thresholds& th)
      : load(process_cpu_load(r)),
        others(other_cpu_load(r)),
        by_others(machine_cpu_load(r) >= th.cores_busy && others >= th.others_busy),
        taken(load >= th.cores_busy || by_others),
        note(by_others
                 ? "other processes keep " + pct(others) + " of the " + std::to_string(r.cpus) +
                       (r.cpus == 1 ? " core" : " cores") + " busy (this process " + pct(load) + ")"
                 : "the process keeps " + pct(load) + " of its " + std::to_string(r.cpus) +
                       (r.cpus == 1 ? " core" : " cores") + " busy") {}
  double load;
  double others;  // < 0: not measured
  bool by_others;
  bool taken;
  std::string note;
};

// 3a. Another stage about as near capacity as the best (load within `margin`, at capacity
// or not) that the waits do not tell apart from it (score within `tie`): no one stage is
// clearly the limit, so none is named.
std::optional<verdict> shared_limit(const run_view& v, std::size_t best, cores_state cores) {
  const double best_score = v.score(best);
  std::string tied;
  bool cpu = v.uses_cpu(best);
  for (std::size_t k = 0; k < v.n; ++k)
    if (k != best && v.score(k) > best_score - v.th.tie &&
        v.L[k].value > v.L[best].value - v.th.margin) {
      tied += ", " + quoted(v.r.stages[k].name) + " " + pct(v.L[k].value);
      cpu = cpu || v.uses_cpu(k);
    }
  if (tied.empty()) return std::nullopt;
  cores.taken = cores.taken && cpu;
  verdict out;
  out.kind = verdict_kind::balanced;
  out.summary = "no one stage is clearly nearest capacity (within " + pct(v.th.margin) +
                " of each other) and none waits on the others: " + quoted(v.r.stages[best].name) +
                " " + pct(v.L[best].value) + tied;
  out.advice = cores.taken ? "no single knob, and no spare cores: " + cores.note +
                                 "; make these stages cheaper together, move work onto the GPU, or "
                                 "run on more cores."
                           : "no single knob: speeding up one of these stages alone will not help; "
                             "scale them together (workers on each), or accept this as the "
                             "pipeline's capacity.";
  return out;
}

// 3b. The advice for the one stage at capacity: where it sits decides the kind.
verdict one_stage_at_capacity(const run_view& v, std::size_t best, cores_state cores) {
  const report& r = v.r;
  cores.taken = cores.taken && v.uses_cpu(best);  // a stage that waits gains from workers
  const stage_report& s = r.stages[best];
  std::size_t threads = 0;
  for (const auto& st : r.stages) threads += st.workers;
  // With more stage threads than cores, placement can still keep this stage on cores of
  // its own.
  const std::string placement_hint = threads > r.cpus && s.workers < r.cpus
                                         ? placement_advice(r, threads, s.workers)
                                         : std::string{};
  const std::string more_workers =
      "add workers to " + quoted(s.name) + " (.workers(" + std::to_string(2 * s.workers) + "))";
  verdict out;
  out.stage = s.name;
  const std::string who = quoted(s.name) + " (" + std::string(to_string(s.kind)) + ", " +
                          std::to_string(s.workers) + (s.workers == 1 ? " worker" : " workers") +
                          ")";
  const std::string gpu_note =
      r.lanes.empty() ? std::string{} : "; GPU busy " + pct(r.gpu_busy_fraction);
  const std::string numbers = who + " is busy " + pct(v.L[best].value) + " of its capacity" +
                              v.neighbours(best) + gpu_note + v.also_saturated(best);
  if (best == 0) {
    out.kind = verdict_kind::source_bound;
    out.summary = "the source sets the pace: " + numbers;
    out.advice =
        "make the source faster: move decoding or parsing out of it into a map stage with "
        "workers, prefetch or read in parallel, or feed several sources.";
  } else if (s.kind == stage_kind::sink || (v.last_gpu != v.n && best > v.last_gpu)) {
    out.kind = verdict_kind::sink_bound;
    out.summary = "the end of the pipeline sets the pace: " + numbers;
    out.advice = s.kind == stage_kind::sink
                     ? "make the sink cheaper or hand its work off (buffer, write "
                       "asynchronously, or do the heavy part in a map stage with workers "
                       "before it)."
                 : cores.taken
                     ? "make " + quoted(s.name) + " cheaper: " + cores.note +
                           ", so more workers would only share them. Reduce on the GPU "
                           "(argmax / top-k) so less is left for the CPU, or run on more "
                           "cores." +
                           placement_hint
                     : more_workers +
                           ", or reduce on the GPU (argmax / top-k) so less is left for the "
                           "CPU.";
  } else {
    out.kind = verdict_kind::cpu_stage_bound;
    out.summary = "a CPU stage sets the pace and the stages after it wait: " + numbers;
    switch (s.kind) {
      case stage_kind::gpu: {
        // The segment's host side: stage-out on the completion threads, or stage-in (and
        // the enqueue calls) on the lane threads, with the device far from busy.
        const segment& g = v.seg[best];
        const bool out_side = g.top == segment::completion;
        const bool in_side = !out_side && g.stage_in >= g.lane_threads_busy / 2;
        const std::string phase = out_side ? "stage-out" : in_side ? "stage-in" : "enqueue";
        const std::string lanes = ".lanes = " + std::to_string(2 * s.workers);
        out.summary =
            "the GPU segment's host side sets the pace, not the device: " + phase + " keeps " +
            (out_side
                 ? "the lanes' completion threads busy " + pct(g.stage_out)
                 : "the lane threads busy " + pct(in_side ? g.stage_in : g.lane_threads_busy)) +
            " while the lanes' streams are busy " + pct(lane_busy_fraction(r)) +
            " and the GPU computes " + pct(r.gpu_busy_fraction) + " of the wall time (" +
            std::to_string(s.workers) + (s.workers == 1 ? " lane" : " lanes") + ")" +
            v.neighbours(best) + v.also_saturated(best);
        const std::string move_out =
            out_side  ? "move the work out of stage-out into a map after the segment, with "
                        "workers (stage-out should only copy the results out of the slot)"
            : in_side ? "move the work out of stage-in into a map before the batch stage, "
                        "with workers (stage-in should only fill the pinned slot; ship uint8, "
                        "normalize on the GPU)"
                      : "launch less per batch (CUDA graphs, fewer and larger kernels)";
        out.advice = cores.taken ? "make " + phase + " cheaper: " + move_out + "; " + cores.note +
                                       ", so more lanes would only share them."
                                 : "more lanes (" + lanes + "): each lane's " +
                                       (out_side ? "completion thread" : "thread") + " runs " +
                                       phase + " for one batch at a time; or " + move_out + ".";
        break;
      }
      case stage_kind::batch:
        out.advice =
            "the batch stage itself is the limit: make batch assembly cheaper "
            "(prepare items straight into the pinned slot in stage-in), or move work "
            "off it.";
        break;
      default:
        out.advice = cores.taken ? "make " + quoted(s.name) +
                                       " cheaper or move its work onto the GPU: " + cores.note +
                                       ", so more workers would only share them; or run on "
                                       "more cores." +
                                       placement_hint
                                 : more_workers + ", or move its work onto the GPU.";
    }
  }
  // Another stage near capacity caps what relieving this one can give.
  std::size_t next = v.n;
  for (std::size_t k = 0; k < v.n; ++k)
    if (k != best && v.saturated(k) && (next == v.n || v.L[k].value > v.L[next].value)) next = k;
  if (next != v.n && v.L[next].value > 0.0)
    out.advice += " " + quoted(r.stages[next].name) + " is near capacity too (" +
                  pct(v.L[next].value) + "): relieving " + quoted(s.name) +
                  " alone gains at most about " + pct(std::max(0.0, 1.0 / v.L[next].value - 1.0)) +
                  "; scale both.";
  return out;
}

// 3. A stage at capacity: the one the others wait on, unless another is as near.
std::optional<verdict> stage_at_capacity(const run_view& v) {
  const std::size_t best = most_waited_on(v);
  if (best == v.n) return std::nullopt;
  const cores_state cores{v.r, v.th};
  if (auto shared = shared_limit(v, best, cores)) return shared;
  return one_stage_at_capacity(v, best, cores);
}

// 4a. Batches leave on timeout, far below max size, while the device idles.
std::optional<verdict> under_batched(const run_view& v) {
  const report& r = v.r;
  if (!r.batching || r.batching->batches == 0 || r.batching->max_size == 0) return std::nullopt;
  // A batcher with a latency target that it meets cuts its batches small on purpose:
  // larger ones would wait longer than the target allows.
  if (r.latency_target && r.latency_target->met) return std::nullopt;
  const batch_report& b = *r.batching;
  const double timeouts =
      static_cast<double>(b.flushed_on_timeout) / static_cast<double>(b.batches);
  const double fill = b.mean_size / static_cast<double>(b.max_size);
  if (timeouts < v.th.timeout_share || fill > v.th.fill_low || v.device >= v.th.gpu_idle)
    return std::nullopt;
  verdict out;
  out.kind = verdict_kind::under_batched;
  for (const auto& s : r.stages)
    if (s.kind == stage_kind::batch) {
      out.stage = s.name;
      break;
    }
  out.summary = pct(timeouts) + " of " + std::to_string(b.batches) +
                " batches left on timeout at a mean size of " + num(b.mean_size) + " of max " +
                std::to_string(b.max_size) + ", and the GPU is busy only " + pct(v.device);
  out.advice =
      "items arrive too slowly to fill a batch within max_delay, so every item waits the "
      "full delay: lower max_size toward what arrives (or max_delay, for latency), or "
      "submit more concurrently (clients that wait for results before sending more cap "
      "the batch size).";
  return out;
}

// 4b. Every stage after the first is starved: the pipeline waits for input.
std::optional<verdict> input_limited(const run_view& v) {
  if (v.n < 2) return std::nullopt;
  double min_starved = 1.0;
  for (std::size_t k = 1; k < v.n; ++k) min_starved = std::min(min_starved, v.L[k].starved);
  if (min_starved < v.th.input_starved) return std::nullopt;
  const std::string& first = v.r.stages[0].name;
  return verdict{verdict_kind::source_bound, first,
                 "the pipeline waits for input: every stage after " + quoted(first) +
                     " is starved at least " + pct(min_starved) + ", and " + quoted(first) +
                     " is busy " + pct(v.L[0].busy),
                 "the pipeline has spare capacity and throughput follows the input rate: "
                 "feed it faster (more clients, a faster source) to use it."};
}

// 4c. Nothing at capacity: what limits the run instead, in this order: a run too short
// to tell, cores taken (by the process's threads or by other work), or waits spread over
// the stages.
verdict spread_out(const run_view& v) {
  const report& r = v.r;
  std::size_t top = 0, next = v.n;
  for (std::size_t k = 1; k < v.n; ++k)
    if (v.L[k].value > v.L[top].value) top = k;
  for (std::size_t k = 0; k < v.n; ++k)
    if (k != top && (next == v.n || v.L[k].value > v.L[next].value)) next = k;
  const std::string loads =
      v.n == 0
          ? std::string{}
          : " (most loaded: " + quoted(r.stages[top].name) + " " + pct(v.L[top].value) +
                (next != v.n ? ", next " + quoted(r.stages[next].name) + " " + pct(v.L[next].value)
                             : std::string{}) +
                ")";
  const std::string lead = "no stage is near capacity" + loads + ": ";
  const double latency = r.item_latency.mean_s;
  if (r.wall_s < v.th.min_wall_s || (latency > 0 && latency >= v.th.short_run * r.wall_s))
    return verdict{verdict_kind::balanced,
                   {},
                   lead + "the run is too short to tell: " + num(r.wall_s * 1e3, "%.0f") +
                       " ms, and an item takes " + num(latency * 1e3) +
                       " ms through the pipeline, so filling and draining the rings is much "
                       "of it",
                   "measure a longer run (seconds, not milliseconds) before tuning: at this "
                   "length no stage is near capacity and the waits say nothing stable."};
  const cores_state cores{r, v.th};
  if (cores.taken && v.busy_is_cpu()) {
    std::size_t threads = 0;
    for (const auto& st : r.stages) threads += st.workers;
    return verdict{
        verdict_kind::balanced,
        {},
        lead + "the run is limited by the cores: " + cores.note + " while no stage is busy",
        cores.by_others ? "other work holds the cores: more workers or lanes cannot win a "
                          "larger share of them. Run where cores are free, or stop the other "
                          "work; pipeline_options::placement = by_load keeps each stage on "
                          "cores of its own."
                        : "the pipeline's threads (" + std::to_string(threads) +
                              " stage threads, and each lane's completion and stream threads) "
                              "take the cores without any stage being busy: they hand items on "
                              "and wait. Fewer workers or lanes, or larger batches so each "
                              "hand-off carries more."};
  }
  return verdict{verdict_kind::balanced,
                 {},
                 v.n == 0 ? "no stage is at capacity"
                          : lead +
                                "the run is limited by waits spread over the stages, not by "
                                "one stage",
                 "no single knob: throughput is limited by all stages together. Scale the "
                 "most loaded stage first, or enlarge the rings so stages absorb each other's "
                 "jitter."};
}

// 5. The bottleneck moved: the timeline falls into phases naming different bottlenecks.
// The verdict names the phase that held the most of the run (ties within `margin` of the
// run: the later one), says when it moved and what each phase was, and gives each
// phase's advice, the longest phase first.
std::optional<verdict> moved(const report& r, const verdict& whole, const verdict_thresholds& th) {
  if (whole.kind == verdict_kind::idle || r.timeline.empty()) return std::nullopt;
  const std::vector<bottleneck_phase> phases = bottleneck_phases(r.timeline, th.phase_share);
  std::vector<const bottleneck_phase*> named;
  for (const auto& p : phases)
    if (!p.stage.empty()) named.push_back(&p);
  bool differ = false;
  for (std::size_t i = 1; i < named.size(); ++i)
    differ = differ || named[i]->kind != named[0]->kind || named[i]->stage != named[0]->stage;
  if (!differ) return std::nullopt;
  const double total = phases.back().end_s - phases.front().start_s;
  const bottleneck_phase* main = named[0];
  for (const bottleneck_phase* p : named)
    if (p->duration_s() >= main->duration_s() - th.margin * total) main = p;
  std::string when, story;
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const bottleneck_phase& p = phases[i];
    if (i > 0) when += (when.empty() ? "" : " and ") + num(p.start_s, "%.2f") + " s";
    story += (i == 0 ? "" : ", then ") +
             (p.stage.empty() ? std::string{"no one stage"}
                              : quoted(p.stage) + " (" + std::string(to_string(p.kind)) + ")") +
             " from " + num(p.start_s, "%.2f") + " s to " + num(p.end_s, "%.2f") + " s";
  }
  std::vector<const bottleneck_phase*> by_length = named;
  std::stable_sort(by_length.begin(), by_length.end(),
                   [](const bottleneck_phase* a, const bottleneck_phase* b) {
                     return a->duration_s() > b->duration_s();
                   });
  std::string advice = "the bottleneck moved, so relieve each phase's: ";
  for (std::size_t i = 0; i < by_length.size(); ++i)
    advice += (i == 0 ? "" : " Then, for ") + (i == 0 ? "for " : std::string{}) +
              quoted(by_length[i]->stage) + " (" + pct(by_length[i]->duration_s() / total) +
              " of the run): " + by_length[i]->advice;
  return verdict{
      main->kind, main->stage,
      "the bottleneck moved at " + when + ": " + story + ". Over the whole run: " + whole.summary,
      advice};
}

}  // namespace

double device_busy_fraction(const report& r) noexcept {
  return std::max(lane_busy_fraction(r), r.gpu_busy_fraction);
}

std::string placement_advice(const report& r, std::size_t threads, std::size_t workers) {
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
           "pipeline_options::placement = by_load gives it " +
           own + " of its own whatever else runs.";
  }
  if (p.mode == "os")
    return lead + "pipeline_options::placement = automatic (the default) gives it " + own +
           " of its own while the pipeline has the cores to itself, by_load whatever else "
           "runs.";
  return lead + "pipeline_options::placement = by_load gives it " + own + " of its own.";
}

namespace {
verdict whole_run(const report& r, const verdict_thresholds& th) {
  if (auto v = idle(r)) return *v;
  const run_view view{r, th};
  if (auto v = gpu_at_capacity(view)) return *v;
  if (auto v = stage_at_capacity(view)) return *v;
  if (auto v = under_batched(view)) return *v;
  if (auto v = input_limited(view)) return *v;
  return spread_out(view);
}
}  // namespace

namespace {
// 6. The lanes' compute calls last as long as the device's work, where the GPU segment
// is what the verdict names: the lanes cannot queue ahead of their streams.
void waits_in_compute(const report& r, const verdict_thresholds& th, verdict& v) {
  const bool names_segment = std::any_of(r.stages.begin(), r.stages.end(), [&](const auto& s) {
    return s.kind == stage_kind::gpu && s.name == v.stage;
  });
  double enqueue = 0, compute = 0, batches = 0, drained = 0;
  for (const auto& l : r.lanes) {
    enqueue += l.enqueue_s;
    compute += l.compute_s;
    batches += static_cast<double>(l.batches);
    drained += static_cast<double>(l.drained_batches);
  }
  const double capacity = r.wall_s * static_cast<double>(r.lanes.size());
  if (!names_segment || compute <= 0.0 || compute < th.sync_min_share * capacity || batches <= 0.0)
    return;
  const bool synchronizes = drained >= th.drained_share * batches;
  if (!synchronizes && enqueue < th.enqueue_share * compute) return;
  v.summary += "; the lanes' compute calls took " + num(enqueue * 1e3) + " ms against " +
               num(compute * 1e3) + " ms of device compute, " + pct(drained / batches) +
               " of them returning to an idle stream";
  const std::string what_syncs =
      "a Thrust call that returns a value or runs on the default policy (use "
      "thrust::cuda::par_nosync(alloc).on(l.stream) with a preallocated allocator), "
      "cudaMalloc/cudaFree, a stream or device synchronize";
  // Not healthy while the lanes cannot queue ahead: the rest of the advice comes after.
  const std::string healthy = "healthy: ";
  const std::string rest =
      v.advice.starts_with(healthy) ? "Then " + v.advice.substr(healthy.size()) : v.advice;
  v.advice = synchronizes
                 ? "The compute functor waits for the device: its calls return only when "
                   "the stream is idle, so no lane gets a second batch queued. Remove what "
                   "synchronizes in it (" +
                       what_syncs + "). " + rest
                 : "The lanes cannot queue work ahead of the device: the compute functor's "
                   "calls last as long as the device's work. Either a call in it waits for "
                   "the device (" +
                       what_syncs +
                       "): remove it; or it launches kernels shorter than their launch: "
                       "capture them in a CUDA graph. " +
                       rest;
}
}  // namespace

verdict diagnose(const report& r, const verdict_thresholds& th) {
  verdict whole = whole_run(r, th);
  if (auto v = moved(r, whole, th)) whole = *v;
  waits_in_compute(r, th, whole);
  return whole;
}

void complete_report(report& r, const verdict_thresholds& th) {
  r.throughput = r.wall_s > 0.0 ? static_cast<double>(r.completed) / r.wall_s : 0.0;
  r.verdict = diagnose(r, th);
}

}  // namespace conveyor::metrics
