// conveyor/base/box.hpp: the one owner of an object on the heap, for a pipeline's parts.
//
//   detail::box<map_node<F, In>> node = detail::make_box<map_node<F, In>>(stage, ctl, in, out);
//   node->start(threads);                   // as a unique_ptr: ->, *, get(), bool
//   detail::box<growable_ring> any = std::move(typed);  // to a base, as unique_ptr
//
// std::unique_ptr<T> with its default deleter, and no other: no deleter type, no array
// form. libstdc++'s unique_ptr keeps its pointer in a std::tuple, so each unique_ptr<X> a
// header names makes every includer instantiate the tuple, its bases, get<> and the
// deleter's constraints for X; a box<X> costs the few functions it uses. A pipeline names
// one per stage and ring, and box is what it holds them in.
// Thread-safety: as a unique_ptr (one object, not shared).
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace conveyor::detail {

template <class T>
class box {
  static_assert(!std::is_array_v<T>, "detail::box holds one object; use a std::vector");

 public:
  box() noexcept = default;
  box(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor): as unique_ptr
  // Takes ownership of p (from new T(...)).
  explicit box(T* p) noexcept : p_(p) {}
  box(box&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  // From a box of a derived type (its destructor must be virtual, as for unique_ptr).
  template <class U>
    requires std::is_convertible_v<U*, T*>
  box(box<U>&& o) noexcept : p_(o.release()) {}  // NOLINT(google-explicit-constructor)
  box& operator=(box&& o) noexcept {
    reset(o.release());
    return *this;
  }
  ~box() { delete p_; }

  T* get() const noexcept { return p_; }
  T& operator*() const noexcept { return *p_; }
  T* operator->() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  friend bool operator==(const box& b, std::nullptr_t) noexcept { return b.p_ == nullptr; }

  // Destroys the object held, if any, and holds p instead.
  void reset(T* p = nullptr) noexcept { delete std::exchange(p_, p); }
  // Gives the object up, unowned, to the caller.
  [[nodiscard]] T* release() noexcept { return std::exchange(p_, nullptr); }

 private:
  T* p_ = nullptr;
};

// As std::make_unique<T>(args...).
template <class T, class... Args>
box<T> make_box(Args&&... args) {
  return box<T>(new T(std::forward<Args>(args)...));
}

}  // namespace conveyor::detail
