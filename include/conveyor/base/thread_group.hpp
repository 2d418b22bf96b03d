// conveyor/base/thread_group.hpp: threads that are always joined.
//
//   detail::thread_group threads;
//   threads.spawn([&] { work(); });    // a throw inside is the caller's job to catch
//   threads.join();                    // also done by the destructor
//
// Thread-safety: spawn() and join() from one owning thread.
#pragma once

#include <thread>
#include <type_traits>
#include <utility>
#include <vector>


namespace conveyor::detail {

class thread_group {
 public:
  thread_group() = default;
  thread_group(const thread_group&) = delete;
  thread_group& operator=(const thread_group&) = delete;
  ~thread_group() { join(); }

  template <class F>
  void spawn(F&& f) {
    threads_.emplace_back(std::forward<F>(f));
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
