// conveyor/base/thread_group.hpp: threads that are always joined.
//
//   detail::thread_group threads;
//   threads.spawn([&] { work(); });    // a throw inside is the caller's job to catch
//   threads.join();                    // also done by the destructor
//
// The threads themselves live in the library (src/conveyor/thread_group.cpp): a user's
// file that includes the pipeline does not compile <thread>.
// Thread-safety: spawn() and join() from one owning thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace conveyor::detail {

class thread_group {
 public:
  thread_group();
  thread_group(const thread_group&) = delete;
  thread_group& operator=(const thread_group&) = delete;
  ~thread_group();  // joins

  // Starts f on a new thread. @throws std::system_error when no thread can be started.
  void spawn(std::function<void()> f);
  void join() noexcept;
  std::size_t size() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace conveyor::detail
