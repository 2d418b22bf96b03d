// conveyor/stage/detail/envelope.hpp: what crosses a ring between two stages: a value and
// the identity of the item (or, for a batch, of each item) it stands for.
//
//   detail::envelope<image> e{std::move(im), detail::item_meta{seq}};      // one item
//   detail::envelope<batch> b{batch{}, detail::meta_list{}};               // a batch...
//   b.metas.push_back(m);                                                  // ...and its items
//   e.items();  b.items();                                                 // 1, metas.size()
//
// Thread-safety: plain values; moved between threads through the rings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "conveyor/base/config.hpp"

namespace conveyor::detail {

// Identity of one item from the source or from submit(): 8 bytes, because every
// envelope crosses a ring at every hop and the ring's slot holds the envelope. Ids stay
// below 2^63 (meta_list tags its pointer with the top bit). What the id does not hold,
// control keeps (control::seq_of(), control::entered()):
// - from a source: id is the item's sequence number. Its weight in the latency sample
//   follows from it (latency_sample_weight), and a timed item's entry time is in
//   control's table of samples (latency_samples).
// - from submit(): id is the item's ticket, the slot its result goes to. The ticket's
//   entry in control holds the item's sequence number and entry time.
struct item_meta {
  std::uint64_t id = 0;
};
static_assert(sizeof(item_meta) == 8);

// The identities of the items an envelope stands for, in one word: a single item's
// meta inline (the common case: no allocation, and a ring slot of a value and 8 bytes),
// or a batch's list, one meta per item, in an allocation the word points to. A list's
// word is its pointer with the top bit set, which no user-space pointer has and no id
// reaches (ids stay below 2^63, see item_meta). A default or moved-from meta_list is an
// empty list. A list stays a list at any size, one item included: is_list() tells a
// batch from a single item.
class meta_list {
 public:
  meta_list() noexcept = default;
  explicit meta_list(item_meta one) noexcept : w_(one) {}
  meta_list(const meta_list& o) : w_(o.is_list() ? item_meta{list_tag} : o.w_) {
    if (o.is_list()) append(o);
  }
  CONVEYOR_HOT_INLINE meta_list(meta_list&& o) noexcept
      : w_(std::exchange(o.w_, item_meta{list_tag})) {}
  meta_list& operator=(meta_list o) noexcept {
    std::swap(w_, o.w_);
    return *this;
  }
  CONVEYOR_HOT_INLINE ~meta_list() {
    // One compare per item: only a list's word with a pointer in it is above the tag
    // (an item's id is below it, an empty list's word is the tag alone).
    if (w_.id > list_tag) ::operator delete(list());
  }

  // A batch's list (of any size), not one item's inline meta.
  bool is_list() const noexcept { return (w_.id & list_tag) != 0; }
  bool empty() const noexcept { return size() == 0; }
  std::size_t size() const noexcept {
    if (!is_list()) return 1;
    const block* b = list();
    return b ? b->size : 0;
  }
  // Room in the list before it reallocates (0 for a single item's meta).
  std::size_t capacity() const noexcept {
    const block* b = list();
    return b ? b->capacity : 0;
  }
  const item_meta* begin() const noexcept {
    if (!is_list()) return &w_;
    const block* b = list();
    return b ? b->items() : nullptr;
  }
  const item_meta* end() const noexcept { return begin() + size(); }
  const item_meta& operator[](std::size_t i) const noexcept { return begin()[i]; }
  // The first item's meta (a batch's stands for the batch). Not on an empty list.
  const item_meta& front() const noexcept { return *begin(); }

  // Makes this a list (a single item's meta its first element) with room for n.
  // @throws std::bad_alloc
  void reserve(std::size_t n) {
    if (is_list() && n <= capacity()) return;
    const std::size_t have = size();
    const std::size_t cap = n > have ? n : have;
    block* b = static_cast<block*>(::operator new(sizeof(block) + cap * sizeof(item_meta)));
    b->size = have;
    b->capacity = cap;
    if (have != 0) std::memcpy(b->items(), begin(), have * sizeof(item_meta));
    block* old = list();
    w_ = item_meta{reinterpret_cast<std::uintptr_t>(b) | list_tag};
    if (old) ::operator delete(old);
  }
  void push_back(const item_meta& m) {
    if (!is_list() || size() == capacity()) {
      const std::size_t doubled = 2 * capacity();
      reserve(doubled > 8 ? doubled : 8);
    }
    block* b = list();
    b->items()[b->size++] = m;
  }
  // Keeps the metas m at the indices i for which keep(i, m) is true, in order, calling
  // keep once per meta, first to last (no allocation; a single item kept stays inline).
  template <class Keep>
  void retain(Keep&& keep) {
    if (!is_list()) {
      if (!keep(std::size_t{0}, std::as_const(w_))) w_ = item_meta{list_tag};
      return;
    }
    block* b = list();
    if (!b) return;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < b->size; ++i) {
      const item_meta m = b->items()[i];
      if (keep(i, m)) b->items()[kept++] = m;
    }
    b->size = kept;
  }
  // Appends o's items (a single item's meta too): this becomes a list.
  void append(const meta_list& o) { append(o.begin(), o.size()); }
  void append(const item_meta* first, std::size_t n) {
    if (n == 0 && is_list()) return;
    if (!is_list() || size() + n > capacity()) {
      const std::size_t need = size() + n;
      reserve(need > 2 * capacity() ? need : 2 * capacity());
    }
    block* b = list();
    if (n != 0) std::memcpy(b->items() + b->size, first, n * sizeof(item_meta));
    b->size += n;
  }

 private:
  static constexpr std::uint64_t list_tag = std::uint64_t{1} << 63;

  // A header and the items after it, in one allocation (item_meta is trivially
  // copyable: its objects are created by the copies into the storage).
  struct block {
    std::size_t size;
    std::size_t capacity;
    item_meta* items() noexcept { return reinterpret_cast<item_meta*>(this + 1); }
    const item_meta* items() const noexcept { return reinterpret_cast<const item_meta*>(this + 1); }
  };
  static_assert(std::is_trivially_copyable_v<item_meta> && sizeof(block) % alignof(item_meta) == 0);

  block* list() const noexcept {
    if (!is_list()) return nullptr;
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the word is a pointer, tagged in reserve()
    return reinterpret_cast<block*>(static_cast<std::uintptr_t>(w_.id & ~list_tag));
  }

  item_meta w_{list_tag};  // an item's meta, or a tagged pointer to a list (or null: empty)
};
static_assert(sizeof(meta_list) == sizeof(void*));

// True for std::vector: what batch() makes and unbatch() takes apart.
template <class T>
inline constexpr bool is_vector_v = false;
template <class T, class A>
inline constexpr bool is_vector_v<std::vector<T, A>> = true;

// A value in flight and the items it stands for: one (a single item's meta, inline) or,
// for a batch, one meta per item. For a value of 8 bytes the envelope is 16.
template <class T>
struct envelope {
  // Constructors, not aggregate initialization: a ring builds the envelope in its slot
  // with parentheses, which compilers before C++20's P0960 (clang < 16) do not accept for
  // an aggregate.
  template <class V>
    requires std::is_constructible_v<T, V&&>
  envelope(V&& v, item_meta m) noexcept(std::is_nothrow_constructible_v<T, V&&>)
      : value(std::forward<V>(v)), metas(m) {}
  template <class V>
    requires std::is_constructible_v<T, V&&>
  envelope(V&& v, meta_list ms) noexcept(std::is_nothrow_constructible_v<T, V&&>)
      : value(std::forward<V>(v)), metas(std::move(ms)) {}

  T value;
  meta_list metas;

  // The first item's meta: a single item's own, a batch's first (it stands for the batch).
  item_meta meta() const noexcept { return metas.front(); }
  std::uint64_t items() const noexcept { return metas.size(); }
};

}  // namespace conveyor::detail
