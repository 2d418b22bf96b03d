// src/conveyor/control.cpp: the members of a pipeline's control block that are not on an
// item's path (conveyor/stage/detail/control.hpp), and the reorder buffer's window check.
#include "conveyor/stage/detail/control.hpp"

#include <exception>
#include <string>
#include <utility>

#include "conveyor/base/power_of_two.hpp"
#include "conveyor/stage/detail/reorder_buffer.hpp"

namespace conveyor::detail {
namespace {

std::unique_ptr<metrics::trace_buffer> make_trace(bool measure, std::size_t events) {
  if (events == 0) return nullptr;
  CONVEYOR_EXPECTS(measure,
                   "pipeline_options: trace_events needs metrics = true (the trace "
                   "is drawn from the same clock reads); set trace_events = 0 or "
                   "turn metrics on");
  return std::make_unique<metrics::trace_buffer>(events);
}

std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

control::control(bool measure, std::size_t trace_events)
    : metrics_on(measure), trace(make_trace(measure, trace_events)) {}

control::~control() = default;

metrics::trace_track* control::make_track(std::string name) {
  return trace ? &trace->add_track(std::move(name)) : nullptr;
}

void control::on_stop(std::function<void()> closer) { closers_.push_back(std::move(closer)); }

void control::stop() noexcept {
  // release: pairs with the acquire loads in is_stopping(); stages that see the flag
  // also see the failure recorded before it.
  if (stopping.exchange(true, std::memory_order_acq_rel)) return;
  for (auto& close : closers_) close();
  open_gate();  // a start() that failed half-way left threads at the gate
}

void control::open_gate() noexcept {
  // release: pairs with the acquire in await_gate(); what start() wrote before opening
  // (the run's start time) is visible to the stage threads.
  gate_.store(true, std::memory_order_release);
  gate_.notify_all();
}

void control::await_gate() const noexcept { gate_.wait(false, std::memory_order_acquire); }

void control::fail_current(const std::string& stage, std::uint64_t item,
                           std::uint64_t items) noexcept {
  failed.fetch_add(items, std::memory_order_relaxed);  // relaxed: read after join
  const std::string what = describe(std::current_exception());
  try {
    failures.add({stage, item, what});
  } catch (...) {  // bad_alloc: the log misses it; the failure still stops the run
  }
  try {
    throw stage_error(stage, item, what);
  } catch (...) {
    error.capture(std::current_exception());
  }
  stop();
}

bool control::fail_items(const std::string& stage, metrics::stage_stats& stats,
                         const meta_list& metas, std::uint64_t items) noexcept {
  stats.count_failed(items);
  // The first item names the failure (its sequence number read before settling frees a
  // ticket); none when stage-out failed after taking the batch's metas.
  const std::uint64_t item = metas.empty() ? 0 : seq_of(metas.front());
  if (!isolate_failures) {
    fail_current(stage, item, items);
    return false;
  }
  failed.fetch_add(items, std::memory_order_relaxed);  // relaxed: read after join
  std::exception_ptr e;
  try {
    const std::string what = describe(std::current_exception());
    failures.add({stage, item, what});
    try {
      throw stage_error(stage, item, what);  // nests the exception being handled
    } catch (...) {
      e = std::current_exception();
    }
  } catch (...) {
    e = std::current_exception();  // bad_alloc on the way: the item gets that
  }
  if (settle_alone)
    for (const item_meta& m : metas) settle_alone(m, e);
  return true;
}

void control::expire(metrics::stage_stats& stats, const item_meta& m) noexcept {
  stats.count_expired(1);
  expired.fetch_add(1, std::memory_order_relaxed);  // relaxed: read after join
  if (!settle_alone) return;
  std::exception_ptr e;
  try {
    e = std::make_exception_ptr(
        deadline_error("conveyor::pipeline: item " + std::to_string(seq_of(m)) +
                       " expired: its deadline passed before the stage could take it"));
  } catch (...) {
    e = std::current_exception();
  }
  settle_alone(m, e);
}

void check_workers(const std::string& stage, std::size_t n) {
  CONVEYOR_EXPECTS(n >= 1 && n <= max_workers,
                   "stage '" + stage + "': workers must be in [1, 1024], got " + std::to_string(n) +
                       "; pass .workers(1) or more (usually <= cores)");
}

// ---- stage/detail/reorder_buffer.hpp ---------------------------------------------------

void check_reorder_window(std::size_t window) {
  CONVEYOR_EXPECTS(window >= 2 && is_power_of_two(window),
                   "conveyor internal error: a reorder window must be a power of two >= 2, got " +
                       std::to_string(window) + "; please report it");
}

}  // namespace conveyor::detail
