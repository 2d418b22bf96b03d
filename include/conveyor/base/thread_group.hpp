// conveyor/base/thread_group.hpp: threads that are always joined.
//
//   detail::thread_group threads;
//   threads.spawn([&] { work(); });    // a throw inside is the caller's job to catch
//   threads.join();                    // also done by the destructor
//
// Each thread may put off the wake-ups of the rings it feeds while it runs (see
// detail::wake_batching): the group is joined before those rings are destroyed.
//
// Thread-safety: spawn() and join() from one owning thread.
#pragma once

#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/ring/detail/wait.hpp"

namespace conveyor::detail {

class thread_group {
 public:
  thread_group() = default;
  thread_group(const thread_group&) = delete;
  thread_group& operator=(const thread_group&) = delete;
  ~thread_group() { join(); }

  template <class F>
  void spawn(F&& f) {
    threads_.emplace_back([f = std::decay_t<F>(std::forward<F>(f))]() mutable {
      wake_batching batching;
      f();
    });
  }

  void join() noexcept {
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  std::size_t size() const noexcept { return threads_.size(); }

 private:
  std::vector<std::thread> threads_;
};

}  // namespace conveyor::detail
