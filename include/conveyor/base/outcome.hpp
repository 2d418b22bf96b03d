// conveyor/base/outcome.hpp: what a service pipeline hands the callback of submit(x, done):
// the item's result, or the reason there is none.
//
//   svc.submit(request, [&out](conveyor::outcome<label> r) noexcept {
//     if (r) out.send(*r);            // the result
//     else out.fail(r.error());       // the stage's exception, or closed_error: cancelled
//   });
//
// A plain value: T, or a std::exception_ptr (never both, never neither). value() returns
// the result or rethrows the error, as std::future::get() would.
// Thread-safety: a value type; distinct objects may be used from distinct threads.
#pragma once

#include <exception>
#include <optional>
#include <utility>

namespace conveyor {

template <class T>
class outcome {
 public:
  static outcome success(T value) { return outcome{std::move(value)}; }
  // @pre error is not null.
  static outcome failure(std::exception_ptr error) noexcept { return outcome{std::move(error)}; }

  bool has_value() const noexcept { return value_.has_value(); }
  explicit operator bool() const noexcept { return has_value(); }

  // The result. @throws the item's error (rethrown) when there is none.
  T& value() & {
    if (!value_) std::rethrow_exception(error_);
    return *value_;
  }
  const T& value() const& {
    if (!value_) std::rethrow_exception(error_);
    return *value_;
  }
  T&& value() && { return std::move(value()); }

  // @pre has_value().
  T& operator*() & noexcept { return *value_; }
  const T& operator*() const& noexcept { return *value_; }
  T* operator->() noexcept { return &*value_; }
  const T* operator->() const noexcept { return &*value_; }

  // The error; null when there is a result.
  const std::exception_ptr& error() const noexcept { return error_; }

 private:
  explicit outcome(T&& value) : value_(std::move(value)) {}
  explicit outcome(std::exception_ptr&& error) noexcept : error_(std::move(error)) {}

  std::optional<T> value_;
  std::exception_ptr error_;
};

}  // namespace conveyor
