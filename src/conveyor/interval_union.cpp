// src/conveyor/interval_union.cpp: interval_union's window and sweep
// (conveyor/counters/interval_union.hpp).
#include "conveyor/counters/interval_union.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace conveyor::metrics {
namespace {

struct later_start {  // makes std::*_heap a min-heap on start
  bool operator()(const interval& a, const interval& b) const noexcept {
    return a.start_ns > b.start_ns;
  }
};

}  // namespace

void interval_union::add(std::int64_t start_ns, std::int64_t end_ns) noexcept {
  if (end_ns <= start_ns) return;
  ++count_;
  heap_.push_back(interval{start_ns, end_ns});  // capacity reserved: never reallocates
  std::push_heap(heap_.begin(), heap_.end(), later_start{});
  if (heap_.size() > window_) {
    std::pop_heap(heap_.begin(), heap_.end(), later_start{});
    sweep(heap_.back());
    heap_.pop_back();
  }
}

std::int64_t interval_union::total_ns() const noexcept {
  std::vector<interval>& held = scratch_;
  held.assign(heap_.begin(), heap_.end());  // fits the reserved capacity
  std::sort(held.begin(), held.end(),
            [](const interval& a, const interval& b) { return a.start_ns < b.start_ns; });
  std::int64_t total = closed_;
  bool has = has_run_;
  interval run = run_;
  for (const interval& iv : held) {
    if (has && iv.start_ns <= run.end_ns) {
      run.end_ns = std::max(run.end_ns, iv.end_ns);
      // held intervals are >= every swept start only when the window held; a late
      // one is clipped here exactly as sweep() would clip it.
    } else {
      if (has) total += run.length_ns();
      run = iv;
      has = true;
    }
  }
  if (has) total += run.length_ns();
  return total;
}

void interval_union::sweep(interval iv) noexcept {
  if (!has_run_) {
    run_ = iv;
    has_run_ = true;
  } else if (iv.start_ns > run_.end_ns) {
    closed_ += run_.length_ns();
    run_ = iv;
  } else {
    if (iv.start_ns < run_.start_ns) ++late_;  // its part before run_ is lost
    run_.end_ns = std::max(run_.end_ns, iv.end_ns);
  }
}

}  // namespace conveyor::metrics
