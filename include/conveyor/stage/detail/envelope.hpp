// conveyor/stage/detail/envelope.hpp: what crosses a ring between two stages: a value and
// the identity of the item (or, for a batch, of each item) it stands for.
//
//   detail::envelope<image> e{std::move(im), detail::item_meta{seq}, {}};   // one item
//   e.metas.push_back(m);                                                  // a batch's items
//   e.items();                                                             // 1, or metas.size()
//
// Thread-safety: plain values; moved between threads through the rings.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace conveyor::detail {

// Identity of one item from the source or from submit(): 8 bytes, because every
// envelope crosses a ring at every hop and the ring's slot holds the envelope: around a
// 64-bit value that keeps two slots to a cache line. What the id does not hold, control
// keeps (control::seq_of(), control::entered()):
// - from a source: id is the item's sequence number. Its weight in the latency sample
//   follows from it (latency_sample_weight), and a timed item's entry time is in
//   control's table of samples (latency_samples).
// - from submit(): id is the item's ticket, the slot its result goes to. The ticket's
//   entry in control holds the item's sequence number and entry time.
struct item_meta {
  std::uint64_t id = 0;
};
static_assert(sizeof(item_meta) == 8);

// The identities of the items a batch holds, in one pointer: for single items (the common
// case) an empty list keeps the envelope, and so every ring slot, small. One allocation
// per non-empty list; a move copies a pointer.
class meta_list {
 public:
  meta_list() noexcept = default;
  meta_list(const meta_list& o) : meta_list() { append(o); }
  meta_list(meta_list&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  meta_list& operator=(meta_list o) noexcept {
    std::swap(b_, o.b_);
    return *this;
  }
  ~meta_list() {
    if (b_) ::operator delete(b_);  // not a call into free() for every single item
  }

  bool empty() const noexcept { return size() == 0; }
  std::size_t size() const noexcept { return b_ ? b_->size : 0; }
  std::size_t capacity() const noexcept { return b_ ? b_->capacity : 0; }
  const item_meta* begin() const noexcept { return b_ ? b_->items() : nullptr; }
  const item_meta* end() const noexcept { return begin() + size(); }
  const item_meta& operator[](std::size_t i) const noexcept { return b_->items()[i]; }

  // @throws std::bad_alloc
  void reserve(std::size_t n) {
    if (n <= capacity()) return;
    block* b = static_cast<block*>(::operator new(sizeof(block) + n * sizeof(item_meta)));
    b->size = size();
    b->capacity = n;
    if (b_) std::memcpy(b->items(), b_->items(), b_->size * sizeof(item_meta));
    if (block* old = std::exchange(b_, b)) ::operator delete(old);
  }
  void push_back(const item_meta& m) {
    if (size() == capacity()) reserve(std::max<std::size_t>(8, 2 * capacity()));
    b_->items()[b_->size++] = m;
  }
  // Keeps the metas m at the indices i for which keep(i, m) is true, in order, calling
  // keep once per meta, first to last (no allocation).
  template <class Keep>
  void retain(Keep&& keep) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < size(); ++i) {
      const item_meta m = b_->items()[i];
      if (keep(i, m)) b_->items()[kept++] = m;
    }
    if (b_) b_->size = kept;
  }
  void append(const meta_list& o) { append(o.begin(), o.size()); }
  void append(const item_meta* first, std::size_t n) {
    if (n == 0) return;
    if (size() + n > capacity()) reserve(std::max(size() + n, 2 * capacity()));
    std::memcpy(b_->items() + b_->size, first, n * sizeof(item_meta));
    b_->size += n;
  }

 private:
  // A header and the items after it, in one allocation (item_meta is trivially
  // copyable: its objects are created by the copies into the storage).
  struct block {
    std::size_t size;
    std::size_t capacity;
    item_meta* items() noexcept { return reinterpret_cast<item_meta*>(this + 1); }
  };
  static_assert(std::is_trivially_copyable_v<item_meta> && sizeof(block) % alignof(item_meta) == 0);

  block* b_ = nullptr;
};
static_assert(sizeof(meta_list) == sizeof(void*));

// True for std::vector: what batch() makes and unbatch() takes apart.
template <class T>
inline constexpr bool is_vector_v = false;
template <class T, class A>
inline constexpr bool is_vector_v<std::vector<T, A>> = true;

// A value in flight. A batch carries one meta per item it holds (metas); a single item
// carries its own (meta) and leaves metas empty, so it costs no allocation.
template <class T>
struct envelope {
  // A constructor, not aggregate initialization: a ring builds the envelope in its slot
  // with parentheses, which compilers before C++20's P0960 (clang < 16) do not accept for
  // an aggregate.
  template <class V>
    requires std::is_constructible_v<T, V&&>
  envelope(V&& v, item_meta m, meta_list ms) noexcept(std::is_nothrow_constructible_v<T, V&&>)
      : value(std::forward<V>(v)), meta(m), metas(std::move(ms)) {}

  T value;
  item_meta meta;
  meta_list metas;

  std::uint64_t items() const noexcept { return metas.empty() ? 1 : metas.size(); }
};

}  // namespace conveyor::detail
