// The autotuner's search (see conveyor/pipeline/autotune.hpp): one probe per move, the
// move chosen from the best probe's verdict.
#include "conveyor/pipeline/autotune.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <ostream>
#include <set>
#include <thread>

#include "conveyor/base/config.hpp"

namespace conveyor {
namespace {

using metrics::verdict_kind;

struct move {
  std::string key;   // the knob and direction, for "tried from this best"
  std::string text;  // "workers 'decode' 2 -> 4"
  tune_knobs knobs;
};

const metrics::stage_report* find_stage(const report& r, std::string_view name) {
  for (const auto& s : r.stages)
    if (s.name == name) return &s;
  return nullptr;
}

std::string arrow(std::size_t from, std::size_t to) {
  return std::to_string(from) + " -> " + std::to_string(to);
}

// Doubles the workers of map stage `name` (the report says how many it ran with).
std::optional<move> more_workers(const report& r, const tune_knobs& k, std::string_view name,
                                 const tune_budget& b) {
  const metrics::stage_report* s = find_stage(r, name);
  if (s == nullptr || s->kind != stage_kind::map) return std::nullopt;
  const std::size_t now = s->workers;
  const std::size_t next = std::min(now * 2, b.max_workers);
  if (next <= now) return std::nullopt;
  move m{"workers:" + s->name, "workers '" + s->name + "' " + arrow(now, next), k};
  m.knobs.workers[s->name] = next;
  return m;
}

// Moves a knob held in one of tune_knobs' own fields to `to`, unless that changes nothing
// or goes the wrong way (a doubling capped below the knob's value).
std::optional<move> move_knob(const tune_knobs& k, std::size_t tune_knobs::*knob, std::size_t to,
                              bool up, const char* key, const char* name) {
  const std::size_t from = k.*knob;
  if (up ? to <= from : to >= from) return std::nullopt;
  move m{key, std::string(name) + " " + arrow(from, to), k};
  m.knobs.*knob = to;
  return m;
}

std::optional<move> more_lanes(const tune_knobs& k, const tune_budget& b) {
  return move_knob(k, &tune_knobs::lanes, std::min(k.lanes * 2, b.max_lanes), true, "lanes",
                   "lanes");
}

std::optional<move> batch_times(const tune_knobs& k, const tune_budget& b, bool up) {
  const std::size_t to =
      up ? std::min(k.batch * 2, b.max_batch) : std::max<std::size_t>(k.batch / 2, 1);
  return move_knob(k, &tune_knobs::batch, to, up, up ? "batch+" : "batch-", "batch");
}

std::optional<move> larger_rings(const tune_knobs& k, const tune_budget& b) {
  return move_knob(k, &tune_knobs::ring_capacity,
                   std::min(k.ring_capacity * 4, b.max_ring_capacity), true, "ring",
                   "ring_capacity");
}

bool within(const tune_objective& o, double p99_s) {
  return o.max_p99.count() <= 0 || p99_s <= static_cast<double>(o.max_p99.count()) * 1e-9;
}

// The moves the best probe's verdict asks for, in the order to try them.
std::vector<move> moves_for(const report& r, const tune_knobs& k, const tune_objective& o,
                            const tune_budget& b) {
  std::vector<move> out;
  const auto add = [&out](std::optional<move> m) {
    if (m) out.push_back(std::move(*m));
  };
  if (!within(o, r.item_latency.p99_s)) add(batch_times(k, b, false));
  const metrics::verdict& v = r.verdict;
  const metrics::stage_report* s = find_stage(r, v.stage);
  switch (v.kind) {
    case verdict_kind::cpu_stage_bound:
    case verdict_kind::sink_bound:
      if (s != nullptr && s->kind == stage_kind::gpu) add(more_lanes(k, b));
      add(more_workers(r, k, v.stage, b));
      break;
    case verdict_kind::transfer_bound_h2d:
    case verdict_kind::transfer_bound_d2h:
      add(more_lanes(k, b));
      add(batch_times(k, b, true));
      break;
    case verdict_kind::compute_bound:
      add(batch_times(k, b, true));
      break;
    case verdict_kind::balanced: {
      add(larger_rings(k, b));
      std::vector<const metrics::stage_report*> maps;
      for (const auto& st : r.stages)
        if (st.kind == stage_kind::map) maps.push_back(&st);
      std::stable_sort(maps.begin(), maps.end(), [](const auto* a, const auto* c) {
        return a->busy_s / static_cast<double>(a->workers) >
               c->busy_s / static_cast<double>(c->workers);
      });
      for (const auto* m : maps) add(more_workers(r, k, m->name, b));
      break;
    }
    default:
      break;
  }
  return out;
}

// Why nothing is left to move, from the best probe's verdict.
std::string nothing_left(const report& r, const std::vector<std::string>& rejected,
                         double min_gain) {
  const metrics::verdict& v = r.verdict;
  std::string why;
  switch (v.kind) {
    case verdict_kind::compute_bound:
      why = "the device is the bottleneck ('" + v.stage +
            "' computing most of the time): nothing is left to tune on the host; a cheaper "
            "model or more GPUs";
      break;
    case verdict_kind::source_bound:
      why = "the input sets the pace ('" + v.stage + "'): no knob here makes it faster";
      break;
    case verdict_kind::under_batched:
      why =
          "batches leave on timeout: items arrive too slowly to fill them, the input sets "
          "the pace";
      break;
    case verdict_kind::sink_bound:
      why = "the sink '" + v.stage + "' sets the pace: no knob here makes it faster";
      break;
    case verdict_kind::cpu_stage_bound:
      why = "'" + v.stage + "' still sets the pace" +
            (rejected.empty() ? " at the budget's limits (max_workers, max_lanes)" : "");
      break;
    case verdict_kind::unmeasured:
      why = "the probes ran with metrics off: nothing to tune from";
      break;
    case verdict_kind::idle:
      why = "the probe moved no items";
      break;
    default:
      why = "the best probe's verdict: " + std::string(metrics::to_string(v.kind)) +
            (v.stage.empty() ? std::string{} : " '" + v.stage + "'");
      break;
  }
  if (!rejected.empty()) {
    why += "; no move raised throughput by " + std::to_string(static_cast<int>(min_gain * 100)) +
           " % (tried: ";
    for (std::size_t i = 0; i < rejected.size(); ++i) why += (i ? ", " : "") + rejected[i];
    why += ")";
  }
  return why;
}

}  // namespace

namespace detail {

tune_result autotune(const std::function<report(const tune_knobs&)>& probe, tune_objective obj,
                     tune_budget budget, const tune_knobs& start) {
  CONVEYOR_EXPECTS(budget.max_probes >= 1, "autotune: budget.max_probes must be >= 1");
  CONVEYOR_EXPECTS(budget.min_gain >= 0.0 && budget.min_gain < 1.0,
                   "autotune: budget.min_gain must be in [0, 1), e.g. 0.05");
  CONVEYOR_EXPECTS(start.lanes >= 1 && start.batch >= 1 && start.ring_capacity >= 2,
                   "autotune: the start knobs need lanes >= 1, batch >= 1, ring_capacity >= 2");
  if (budget.max_workers == 0)
    budget.max_workers = std::max<std::size_t>(std::thread::hardware_concurrency(), 1);

  tune_result out;
  const auto t0 = std::chrono::steady_clock::now();
  const auto run = [&](const tune_knobs& k, std::string what) -> std::pair<tune_trial, report> {
    const auto p0 = std::chrono::steady_clock::now();
    report r = probe(k);
    tune_trial t;
    t.knobs = k;
    t.throughput = r.throughput > 0.0 ? r.throughput
                   : r.wall_s > 0.0   ? static_cast<double>(r.completed) / r.wall_s
                                      : 0.0;
    t.p99_s = r.item_latency.p99_s;
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
    t.kind = r.verdict.kind;
    t.stage = r.verdict.stage;
    t.move = std::move(what);
    out.probe_seconds += t.seconds;
    return {std::move(t), std::move(r)};
  };
  // Better: within the bound beats outside it; both within, more throughput by min_gain;
  // both outside, a P99 lower by min_gain (toward the bound).
  const auto better = [&](const tune_trial& a, const tune_trial& best) {
    const bool a_in = within(obj, a.p99_s), best_in = within(obj, best.p99_s);
    if (a_in != best_in) return a_in;
    if (a_in) return a.throughput >= best.throughput * (1.0 + budget.min_gain);
    return a.p99_s <= best.p99_s * (1.0 - budget.min_gain);
  };

  auto [first, best_report] = run(start, "start");
  first.kept = true;
  out.trials.push_back(first);
  std::size_t best = 0;
  std::set<std::string> tried;  // move keys tried from the current best
  std::vector<std::string> rejected;
  while (true) {
    if (out.trials.size() >= budget.max_probes) {
      out.stopped = "budget: " + std::to_string(budget.max_probes) + " probes";
      break;
    }
    if (std::chrono::steady_clock::now() - t0 >= budget.max_time) {
      out.stopped = "budget: " + std::to_string(budget.max_time.count()) + " ms of probing";
      break;
    }
    std::vector<move> moves = moves_for(best_report, out.trials[best].knobs, obj, budget);
    std::erase_if(moves, [&](const move& m) { return tried.contains(m.key); });
    if (moves.empty()) {
      out.stopped = nothing_left(best_report, rejected, budget.min_gain);
      break;
    }
    move& m = moves.front();
    tried.insert(m.key);
    auto [t, r] = run(m.knobs, m.text);
    if (better(t, out.trials[best])) {
      t.kept = true;
      best = out.trials.size();
      best_report = std::move(r);
      tried.clear();
      rejected.clear();
    } else {
      rejected.push_back(m.text);
    }
    out.trials.push_back(std::move(t));
  }
  const tune_trial& b = out.trials[best];
  out.best = b.knobs;
  out.best_throughput = b.throughput;
  out.best_p99_s = b.p99_s;
  out.objective_met = within(obj, b.p99_s);
  return out;
}

}  // namespace detail

namespace {
std::string knobs_text(const tune_knobs& k) {
  std::string s;
  for (const auto& [name, n] : k.workers) s += "workers '" + name + "' " + std::to_string(n) + ", ";
  return s + "lanes " + std::to_string(k.lanes) + ", batch " + std::to_string(k.batch) +
         ", ring_capacity " + std::to_string(k.ring_capacity);
}
std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string pad(std::string s, std::size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}
}  // namespace

std::ostream& operator<<(std::ostream& o, const tune_result& t) {
  o << "autotune: " << t.trials.size() << " probes, " << fmt("%.1f", t.probe_seconds)
    << " s; best: " << knobs_text(t.best) << ": " << fmt("%.1f", t.best_throughput * 1e-3)
    << " k items/s, P99 " << fmt("%.2f", t.best_p99_s * 1e3) << " ms"
    << (t.objective_met ? "" : " (over the P99 bound: no probe met it)") << '\n';
  o << "  " << pad("#", 4) << pad("move", 34) << pad("k items/s", 12) << pad("P99 ms", 10)
    << pad("verdict", 28) << "kept\n";
  for (std::size_t i = 0; i < t.trials.size(); ++i) {
    const tune_trial& tr = t.trials[i];
    const std::string verdict =
        std::string(metrics::to_string(tr.kind)) + (tr.stage.empty() ? "" : " '" + tr.stage + "'");
    o << "  " << pad(std::to_string(i + 1), 4) << pad(tr.move, 34)
      << pad(fmt("%.1f", tr.throughput * 1e-3), 12) << pad(fmt("%.2f", tr.p99_s * 1e3), 10)
      << pad(verdict, 28) << (tr.kept ? "*" : "") << '\n';
  }
  return o << "  stopped: " << t.stopped << '\n';
}

}  // namespace conveyor
