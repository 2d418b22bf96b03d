// conveyor/runtime/detail/host_task.hpp: the unit of work in a host stream's queue, a
// move-only type-erased `void(host_stream_state&)` with inline storage.
//
//   detail::host_task t{[p, n](detail::host_stream_state& s) { ... }};
//   queue.push(std::move(t));             // no allocation: the callable lives inside t
//   t(state);                             // run on the stream thread
//
// Callables up to inline_capacity bytes with a nothrow move live inside the task, so
// enqueueing them allocates nothing (the ring slot holds the task). Larger ones are boxed
// on the heap: one allocation per enqueue, which the hot path should avoid.
// Thread-safety: a value type; one thread uses a task at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace conveyor::detail {

class host_stream_state;

class host_task {
 public:
  static constexpr std::size_t inline_capacity = 96;

  template <class F>
  static constexpr bool fits_inline =
      sizeof(F) <= inline_capacity && alignof(F) <= alignof(std::max_align_t) &&
      std::is_nothrow_move_constructible_v<F>;

  host_task() noexcept = default;

  // The constraint keeps the copy and move constructors visible (the check below does
  // not read it).
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, host_task> &&
             std::is_invocable_v<std::decay_t<F>&, host_stream_state&>)
  explicit host_task(F&& f) {  // NOLINT(bugprone-forwarding-reference-overload)
    using D = std::decay_t<F>;
    if constexpr (fits_inline<D>) {
      ::new (static_cast<void*>(buf_)) D(std::forward<F>(f));
      ops_ = &inline_ops<D>;
    } else {
      ::new (static_cast<void*>(buf_)) D*(new D(std::forward<F>(f)));
      ops_ = &boxed_ops<D>;
    }
  }

  host_task(host_task&& other) noexcept { take(other); }
  host_task& operator=(host_task&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  host_task(const host_task&) = delete;
  host_task& operator=(const host_task&) = delete;
  ~host_task() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }
  void operator()(host_stream_state& s) { ops_->invoke(buf_, s); }

 private:
  struct ops_table {
    void (*invoke)(void*, host_stream_state&);
    void (*move)(void* dst, void* src) noexcept;  // move-constructs at dst, destroys src
    void (*destroy)(void*) noexcept;
  };

  template <class D>
  static D* as(void* p) noexcept {
    return std::launder(static_cast<D*>(p));
  }

  template <class D>
  static constexpr ops_table inline_ops{[](void* p, host_stream_state& s) { (*as<D>(p))(s); },
                                        [](void* dst, void* src) noexcept {
                                          ::new (dst) D(std::move(*as<D>(src)));
                                          std::destroy_at(as<D>(src));
                                        },
                                        [](void* p) noexcept { std::destroy_at(as<D>(p)); }};

  template <class D>
  static constexpr ops_table boxed_ops{
      [](void* p, host_stream_state& s) { (**as<D*>(p))(s); },
      [](void* dst, void* src) noexcept { ::new (dst) D*(*as<D*>(src)); },
      [](void* p) noexcept { delete *as<D*>(p); }};

  void take(host_task& other) noexcept {
    if (other.ops_ == nullptr) return;
    other.ops_->move(buf_, other.buf_);
    ops_ = std::exchange(other.ops_, nullptr);
  }
  void reset() noexcept {
    if (ops_ != nullptr) std::exchange(ops_, nullptr)->destroy(buf_);
  }

  alignas(std::max_align_t) unsigned char buf_[inline_capacity];
  const ops_table* ops_ = nullptr;
};

}  // namespace conveyor::detail
