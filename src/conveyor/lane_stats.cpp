// src/conveyor/lane_stats.cpp: gpu_stats' setup (conveyor/counters/lane_stats.hpp).
#include "conveyor/counters/lane_stats.hpp"

#include <cstddef>
#include <memory>
#include <vector>

#include "conveyor/base/config.hpp"

namespace conveyor::metrics {
namespace {

std::size_t checked_lanes(std::size_t lanes) {
  CONVEYOR_EXPECTS(lanes >= 1 && lanes <= 1024,
                   "gpu_stats: lanes must be in [1, 1024]; pass the pipeline's lane count");
  return lanes;
}

}  // namespace

gpu_stats::gpu_stats(std::size_t lanes, std::size_t window)
    : lanes_(checked_lanes(lanes)),
      stats_(std::make_unique<lane_stats[]>(lanes)),
      window_(window),
      compute_busy_(window),
      lane_device_(lanes, 0),
      lane_slot_(lanes, 0),
      devices_{0} {}

gpu_stats::~gpu_stats() = default;

void gpu_stats::set_devices(const std::vector<int>& lane_devices) {
  CONVEYOR_EXPECTS(lane_devices.size() == lanes_,
                   "gpu_stats::set_devices: pass one device per lane");
  devices_.clear();
  for (std::size_t i = 0; i < lanes_; ++i) {
    std::size_t slot = 0;
    while (slot < devices_.size() && devices_[slot] != lane_devices[i]) ++slot;
    if (slot == devices_.size()) devices_.push_back(lane_devices[i]);
    lane_device_[i] = lane_devices[i];
    lane_slot_[i] = slot;
  }
  per_device_.clear();
  if (devices_.size() > 1)
    for (std::size_t d = 0; d < devices_.size(); ++d)
      per_device_.push_back(std::make_unique<concurrent_interval_union>(window_));
}

}  // namespace conveyor::metrics
