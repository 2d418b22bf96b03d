// src/conveyor/thread_group.cpp: threads that are always joined (conveyor/base/thread_group.hpp).
#include "conveyor/base/thread_group.hpp"

#include <thread>
#include <utility>
#include <vector>

namespace conveyor::detail {

struct thread_group::impl {
  std::vector<std::thread> threads;
};

thread_group::thread_group() : impl_(std::make_unique<impl>()) {}
thread_group::~thread_group() { join(); }

void thread_group::spawn(std::function<void()> f) { impl_->threads.emplace_back(std::move(f)); }

void thread_group::join() noexcept {
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
  impl_->threads.clear();
}

std::size_t thread_group::size() const noexcept { return impl_->threads.size(); }

}  // namespace conveyor::detail
