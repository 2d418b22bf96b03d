// conveyor/base/first_error.hpp: keeps the first exception thrown on any thread.
//
//   detail::first_error err;
//   try { work(); } catch (...) { if (err.capture(std::current_exception())) stop_all(); }
//   ... join every thread ...
//   err.rethrow_if_any();
//
// Thread-safety: capture() from any thread; rethrow_if_any()/get() after the capturing
// threads have been joined (or any time: a reader that sees failed() sees the error).
#pragma once

#include <atomic>
#include <exception>

namespace conveyor::detail {

class first_error {
 public:
  // Returns true for the first capture only; later errors are dropped (they are
  // usually consequences of the first: closed rings, cancelled waits).
  bool capture(std::exception_ptr e) noexcept {
    bool expected = false;
    // acq_rel: exactly one thread wins the flag; acquire orders nothing here, release
    // pairs with nothing (the error is published by the `ready_` store below).
    if (!claimed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) return false;
    error_ = std::move(e);
    // release: pairs with the acquire load in failed(); error_ is written before.
    ready_.store(true, std::memory_order_release);
    return true;
  }

  bool failed() const noexcept { return ready_.load(std::memory_order_acquire); }
  std::exception_ptr get() const noexcept { return failed() ? error_ : nullptr; }
  void rethrow_if_any() const {
    if (failed()) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> claimed_{false};
  std::atomic<bool> ready_{false};
  std::exception_ptr error_;
};

}  // namespace conveyor::detail
