// conveyor/stage/detail/worker_registry.hpp: how a stage's worker threads make themselves
// known, while they run, to whoever owns the threads (the pipeline, which places them on
// cores by what they cost); the stages need no more of placement than this.
//
//   detail::registered_worker me{ctl.workers, stats, w};   // on worker w's own thread
//   ...                                                     // the worker's loop
//                                                           // leaves when `me` goes
//
// Thread-safety: enter() and leave() from the worker thread they are about, any number
// of workers at once.
#pragma once

#include <cstddef>

namespace conveyor::metrics {
class stage_stats;
}  // namespace conveyor::metrics

namespace conveyor::detail {

class worker_registry {
 public:
  // The calling thread is worker `worker` of the stage whose counters are `stage`, and
  // starts its loop. false: not registered (leave() must not be called then).
  virtual bool enter(const metrics::stage_stats& stage, std::size_t worker) noexcept = 0;
  // The calling thread, registered by enter(), ends its loop.
  virtual void leave() noexcept = 0;

  virtual ~worker_registry() = default;

 protected:
  worker_registry() = default;
  worker_registry(const worker_registry&) = default;
  worker_registry& operator=(const worker_registry&) = default;
};

// A worker's registration for as long as it lives; construct it on the worker's thread.
// A null registry: nobody asked, nothing happens.
class registered_worker {
 public:
  registered_worker(worker_registry* registry, const metrics::stage_stats& stage,
                    std::size_t worker) noexcept
      : registry_(registry != nullptr && registry->enter(stage, worker) ? registry : nullptr) {}
  ~registered_worker() {
    if (registry_ != nullptr) registry_->leave();
  }
  registered_worker(const registered_worker&) = delete;
  registered_worker& operator=(const registered_worker&) = delete;

 private:
  worker_registry* registry_;
};

}  // namespace conveyor::detail
