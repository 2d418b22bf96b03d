// src/conveyor/verdict.cpp: the verdict (conveyor/report/verdict.hpp), one function per
// case of its decision procedure, tried in troubleshooting order by diagnose().
#include "conveyor/report/verdict.hpp"

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
// higher of busy and the device's (see the header's device_g).
struct load {
  double busy = 0, starved = 0, blocked = 0, device = 0, value = 0;
};

// What every case reads: the report, the thresholds and each stage's load.
struct run_view {
  run_view(const report& rep, const verdict_thresholds& thresholds)
      : r(rep),
        th(thresholds),
        n(rep.stages.size()),
        device(device_busy_fraction(rep)),
        L(n),
        slot_wait(n, 0.0) {
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
    for (std::size_t k = 0; k < n; ++k) {
      if (r.stages[k].kind != stage_kind::gpu) continue;
      const bool upstream_waits =
          k == 0 ? L[k].starved <= (1.0 - th.saturated) / 2 : L[k - 1].blocked >= th.input_starved;
      const bool downstream_waits = k + 1 < n && L[k + 1].starved >= th.input_starved;
      if (upstream_waits && downstream_waits)
        slot_wait[k] = std::clamp(std::max(L[k].busy + L[k].blocked, 1.0 - L[k].starved), 0.0, 1.0);
      L[k].device = std::max(device, slot_wait[k]);
      L[k].value = std::max(L[k].busy, L[k].device);
      last_gpu = k;
    }
  }

  bool saturated(std::size_t k) const noexcept { return L[k].value >= th.saturated; }

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

// 2. The GPU segment at capacity: the phase with the most lane time names the verdict.
std::optional<verdict> gpu_at_capacity(const run_view& v) {
  const report& r = v.r;
  const std::size_t n = v.n;
  std::size_t gpu_k = n;
  for (std::size_t k = 0; k < n; ++k)
    if (r.stages[k].kind == stage_kind::gpu && v.L[k].device >= v.th.saturated) gpu_k = k;
  if (gpu_k == n && !(n == 0 && v.device >= v.th.saturated)) return std::nullopt;

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
  verdict out;
  out.stage = gpu_k != n ? r.stages[gpu_k].name : std::string{};
  const std::string split =
      "H2D " + pct(fh) + ", compute " + pct(fc) + ", D2H " + pct(fd) + " of lane time";
  const double streams = lane_busy_fraction(r);
  const bool slot_bound =
      gpu_k != n && v.slot_wait[gpu_k] >= v.th.saturated && streams < v.th.saturated;
  const std::string state =
      "the GPU segment is at capacity (lanes' streams busy " + pct(streams) + ", GPU computing " +
      pct(r.gpu_busy_fraction) + " of the wall time" +
      (slot_bound ? ", lane threads waiting for a free slot or busy " + pct(v.slot_wait[gpu_k])
                  : std::string{}) +
      ")";
  const std::string context =
      gpu_k != n ? v.neighbours(gpu_k) + v.also_saturated(gpu_k) : std::string{};
  const std::string overlap =
      (r.gpu_busy_fraction < v.th.saturated && !r.lanes.empty()
           ? " Kernels run only " + pct(r.gpu_busy_fraction) +
                 " of the time while the lanes are saturated: more lanes would overlap "
                 "copies with kernels."
           : std::string{}) +
      (slot_bound ? " The streams idle " + pct(1.0 - streams) +
                        " of the time between batches while the lanes wait for slots: more "
                        "slots_per_lane keep the next batches queued on the stream."
                  : std::string{});
  if (fc >= fh && fc >= fd) {
    out.kind = verdict_kind::compute_bound;
    out.summary = state + "; " + split + context;
    out.advice =
        "healthy: the GPU is the bottleneck. To go faster make the model cheaper (fp16 / "
        "tensor cores, fused kernels, CUDA graphs for many small launches) or add GPUs; "
        "the CPU stages have headroom." +
        overlap;
  } else if (fh >= fd) {
    out.kind = verdict_kind::transfer_bound_h2d;
    out.summary = state + "; host-to-device copies dominate: " + split + ", at " +
                  num(h2d > 0 ? h2d_bytes / h2d * 1e-9 : 0.0, "%.2f") + " GB/s" + context;
    out.advice =
        "send less and send it in bigger pieces: ship uint8 (or fp16) instead of float and "
        "normalize on the GPU, use larger batches so per-copy overhead amortizes, and keep "
        "enough lanes that copies overlap kernels." +
        overlap;
  } else {
    out.kind = verdict_kind::transfer_bound_d2h;
    out.summary = state + "; device-to-host copies dominate: " + split + ", at " +
                  num(d2h > 0 ? d2h_bytes / d2h * 1e-9 : 0.0, "%.2f") + " GB/s" + context;
    out.advice =
        "bring less back: reduce on the GPU (argmax / top-k / thresholding) before the copy, "
        "use larger batches, and keep enough lanes that copies overlap kernels." +
        overlap;
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

// Whether the process already keeps its cores busy (then adding workers only makes more
// threads share them), and the sentence that says so.
struct cores_state {
  explicit cores_state(const report& r, const verdict_thresholds& th)
      : load(process_cpu_load(r)),
        taken(load >= th.cores_busy),
        note("the process keeps " + pct(load) + " of its " + std::to_string(r.cpus) +
             (r.cpus == 1 ? " core" : " cores") + " busy") {}
  double load;
  bool taken;
  std::string note;
};

// 3a. Several stages at capacity that the waits cannot tell apart from the best (score
// and load both within `tie`): they share the limit.
std::optional<verdict> shared_limit(const run_view& v, std::size_t best, const cores_state& cores) {
  const double best_score = v.score(best);
  std::string tied;
  for (std::size_t k = 0; k < v.n; ++k)
    if (k != best && v.saturated(k) && v.score(k) > best_score - v.th.tie &&
        v.L[k].value > v.L[best].value - v.th.tie)
      tied += ", " + quoted(v.r.stages[k].name) + " " + pct(v.L[k].value);
  if (tied.empty()) return std::nullopt;
  verdict out;
  out.kind = verdict_kind::balanced;
  out.summary = "several stages are at capacity and none waits on the others: " +
                quoted(v.r.stages[best].name) + " " + pct(v.L[best].value) + tied;
  out.advice = cores.taken ? "no single knob, and no spare cores: " + cores.note +
                                 "; make these stages cheaper together, move work onto the GPU, or "
                                 "run on more cores."
                           : "no single knob: speeding up one of these stages alone will not help; "
                             "scale them together (workers on each), or accept this as the "
                             "pipeline's capacity.";
  return out;
}

// 3b. The advice for the one stage at capacity: where it sits decides the kind.
verdict one_stage_at_capacity(const run_view& v, std::size_t best, const cores_state& cores) {
  const report& r = v.r;
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
      case stage_kind::gpu:
        out.advice =
            "the lanes' host threads (stage-in and enqueue) are the limit while the "
            "device is busy only " +
            pct(v.L[best].device) +
            ": add lanes, or make stage-in cheaper (ship uint8, normalize on the GPU).";
        break;
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

// 3. A stage at capacity: the one the others wait on, or several sharing the limit.
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

// 4c. Nothing at capacity and the waits point at no one stage.
verdict spread_out(const run_view& v) {
  std::size_t top = 0;
  for (std::size_t k = 1; k < v.n; ++k)
    if (v.L[k].value > v.L[top].value) top = k;
  return verdict{verdict_kind::balanced,
                 {},
                 v.n == 0
                     ? "no stage is at capacity"
                     : "no stage is at capacity (most loaded: " + quoted(v.r.stages[top].name) +
                           " " + pct(v.L[top].value) + ") and the waits do not point at one stage",
                 "no single knob: throughput is limited by all stages together. Scale the "
                 "most loaded stage first, or enlarge the rings so stages absorb each other's "
                 "jitter."};
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

verdict diagnose(const report& r, const verdict_thresholds& th) {
  if (auto v = idle(r)) return *v;
  const run_view view{r, th};
  if (auto v = gpu_at_capacity(view)) return *v;
  if (auto v = stage_at_capacity(view)) return *v;
  if (auto v = under_batched(view)) return *v;
  if (auto v = input_limited(view)) return *v;
  return spread_out(view);
}

void complete_report(report& r, const verdict_thresholds& th) {
  r.throughput = r.wall_s > 0.0 ? static_cast<double>(r.completed) / r.wall_s : 0.0;
  r.verdict = diagnose(r, th);
}

}  // namespace conveyor::metrics
