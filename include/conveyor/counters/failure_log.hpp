// conveyor/counters/failure_log.hpp: the first failures of a run, for the report: which
// stage, which item, what it said.
//
//   metrics::failure_log log;                          // one per pipeline
//   log.add({"decode", 17, "bad header"});             // any thread, on a failure
//   for (const metrics::failure_record& f : log.first()) ...
//   log.total();                                       // every failure, kept or not
//
// Keeps the first failure_log::kept records; after that only counts. Failures are rare
// next to items (a failure costs an exception already), so a mutex is fine here.
// Thread-safety: every member from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace conveyor::metrics {

struct failure_record {
  std::string stage;
  std::uint64_t item = 0;  // the item's sequence number (a batch: its first item's)
  std::string message;     // what the stage's exception said
};

class failure_log {
 public:
  static constexpr std::size_t kept = 16;

  void add(failure_record r) {
    const std::lock_guard lock{m_};
    ++total_;
    if (first_.size() < kept) first_.push_back(std::move(r));
  }
  std::vector<failure_record> first() const {
    const std::lock_guard lock{m_};
    return first_;
  }
  std::uint64_t total() const {
    const std::lock_guard lock{m_};
    return total_;
  }

 private:
  mutable std::mutex m_;
  std::vector<failure_record> first_;
  std::uint64_t total_ = 0;
};

}  // namespace conveyor::metrics
