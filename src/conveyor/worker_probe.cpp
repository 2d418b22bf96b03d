// src/conveyor/worker_probe.cpp: a stage worker's instrumentation, the parts that do not
// depend on the rings it waits on (conveyor/stage/detail/worker_probe.hpp).
#include "conveyor/stage/detail/worker_probe.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace conveyor::detail {

std::string worker_track_name(const std::string& stage, std::size_t w, std::size_t workers) {
  return workers == 1 ? stage : stage + " #" + std::to_string(w + 1);
}

std::string ring_track_name(const std::string& stage) { return "ring " + stage; }

worker_probe::~worker_probe() {
  before_wait();
  if (on_) w_->set_cpu_ns(thread_cpu_ns());
}

void worker_probe::busy(const char* name) noexcept {
  if (!on_) return;
  const metrics::phase p = mark();
  if (track_ != nullptr) track_->span(name, p);
}

void worker_probe::wait_ended(wait_for kind, const wait_timing& t, bool timed) noexcept {
  w_->add_spin_rounds(t.rounds);
  if (timed) {
    const metrics::phase p = kind == wait_for::input ? clock_.starved() : clock_.blocked();
    learn_round(p.length_ns() - t.slow_ns, t.rounds);
    return;
  }
  if (!on_) return;
  (kind == wait_for::input ? pending_starved_ns_ : pending_blocked_ns_) +=
      std::int64_t{t.rounds} * round_ns_ + t.slow_ns;
  if (t.end_ns != 0) (void)charge_until(t.end_ns);
}

void worker_probe::mark_work() noexcept {
  if (!on_) {  // 2^32 - 1 items without metrics
    lazy_ = 0;
    return;
  }
  if (track_ != nullptr) return busy();
  const std::uint32_t items = lazy_;
  const std::int64_t per_item = mark().length_ns() / items;
  mark_period_ = static_cast<std::uint32_t>(std::clamp<std::int64_t>(
      per_item > 0 ? mark_interval_ns / per_item : max_mark_period, 1, max_mark_period));
}

void worker_probe::learn_round(std::int64_t spin_ns, std::uint32_t rounds) noexcept {
  if (rounds == 0) return;
  std::int64_t per_round = std::clamp<std::int64_t>(spin_ns / rounds, 0, max_round_ns);
  if (round_ns_ != 0) per_round = std::min(per_round, 2 * round_ns_);
  round_ns_ = round_ns_ == 0 ? per_round : (3 * round_ns_ + per_round) / 4;
}

metrics::phase worker_probe::mark() noexcept {
  if (track_ == nullptr || ++marks_ % occupancy_period == 0) occupancy_due_ = true;
  return charge_until(now_ns());
}

metrics::phase worker_probe::charge_until(std::int64_t end_ns) noexcept {
  lazy_ = 0;
  // The thread's CPU time, at most every cpu_read_period_ns of the clock it already read
  // (one system call, not a clock read per item).
  if (end_ns - cpu_read_ns_ >= cpu_read_period_ns) {
    cpu_read_ns_ = end_ns;
    w_->set_cpu_ns(thread_cpu_ns());
  }
  const metrics::phase p = clock_.busy_until(end_ns, pending_starved_ns_, pending_blocked_ns_);
  pending_starved_ns_ = pending_blocked_ns_ = 0;
  return p;
}

}  // namespace conveyor::detail
