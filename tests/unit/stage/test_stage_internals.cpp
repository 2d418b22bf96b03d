// What stages share (stage/detail/): the latency sample, the control block's tickets,
// the items' identities in an envelope; and base/outcome.hpp, base/box.hpp.
#include "conveyor/pipeline.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "test_support.hpp"

using namespace conveyor;
namespace t = conveyor::test;

TEST_CASE("latency_samples: each timed item's entry time, by sample number, until overwritten") {
  // Sample numbers count the timed items 0, 1, 2, ... through all three densities.
  std::uint64_t next = 0;
  for (std::uint64_t seq = 0; seq < 2 * detail::latency_sparse_items; ++seq) {
    if (detail::latency_sample_weight(seq) == 0) continue;
    REQUIRE(detail::latency_sample_number(seq) == next);
    ++next;
  }
  detail::latency_samples table;
  REQUIRE(table.take(0) == 0);  // never written
  std::vector<std::uint64_t> timed;
  for (std::uint64_t seq = 0; timed.size() < detail::latency_samples::size + 5; ++seq)
    if (detail::latency_sample_weight(seq) != 0) timed.push_back(seq);
  for (std::size_t i = 0; i < detail::latency_samples::size; ++i)
    table.put(timed[i], static_cast<std::int64_t>(1000 + i));
  for (std::size_t i = 0; i < detail::latency_samples::size; ++i)
    REQUIRE(table.take(timed[i]) == static_cast<std::int64_t>(1000 + i));
  // The next samples take the oldest entries: those items' times are gone, not misread.
  for (std::size_t i = detail::latency_samples::size; i < timed.size(); ++i)
    table.put(timed[i], static_cast<std::int64_t>(1000 + i));
  for (std::size_t i = 0; i < 5; ++i) {
    REQUIRE(table.take(timed[i]) == 0);
    REQUIRE(table.take(timed[detail::latency_samples::size + i]) ==
            static_cast<std::int64_t>(1000 + detail::latency_samples::size + i));
  }
}

TEST_CASE("latency_samples: readers racing the writer get the right time or none") {
  // One writer (a source) runs through at least 64 laps of the table, and on until three
  // readers have made 20000 look-ups of the samples just behind it, where entries are
  // being overwritten. A time handed out must be the one written for that item (here a
  // function of its number). The readers start before the writer: slow threads
  // (sanitizers) must not find the race over before they look.
  const auto seq_of_sample = [](std::uint64_t n) {  // the inverse of latency_sample_number
    constexpr std::uint64_t dense = detail::latency_dense_items / 8;
    constexpr std::uint64_t sparse =
        (detail::latency_sparse_items - detail::latency_dense_items) / 64;
    if (n < dense) return 8 * n;
    if (n < dense + sparse) return detail::latency_dense_items + 64 * (n - dense);
    return detail::latency_sparse_items + 256 * (n - dense - sparse);
  };
  for (std::uint64_t n = 0; n < 3 * detail::latency_samples::size * 4; ++n)
    REQUIRE(detail::latency_sample_number(seq_of_sample(n)) == n);
  const auto time_of = [](std::uint64_t seq) { return static_cast<std::int64_t>(3 * seq + 1); };
  constexpr std::uint64_t min_samples = 64 * detail::latency_samples::size;
  constexpr std::uint64_t min_looks = 20000;
  detail::latency_samples table;
  std::atomic<std::uint64_t> written{0}, looks{0}, wrong{0}, found{0}, gone{0};
  std::atomic<int> started{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r)
    readers.emplace_back([&, r] {
      std::minstd_rand rng{static_cast<unsigned>(r + 1)};
      started.fetch_add(1);
      while (!done.load(std::memory_order_acquire)) {
        const std::uint64_t w = written.load(std::memory_order_acquire);
        if (w == 0) continue;
        // Anywhere in the last lap and a bit: entries the writer is about to reach.
        const std::uint64_t back = rng() % (detail::latency_samples::size + 64);
        const std::uint64_t seq = seq_of_sample(back >= w ? 0 : w - 1 - back);
        const std::int64_t t = table.take(seq);
        if (t == 0)
          gone.fetch_add(1, std::memory_order_relaxed);
        else if (t == time_of(seq))
          found.fetch_add(1, std::memory_order_relaxed);
        else
          wrong.fetch_add(1, std::memory_order_relaxed);
        looks.fetch_add(1, std::memory_order_relaxed);
      }
    });
  while (started.load() < 3) std::this_thread::yield();
  for (std::uint64_t n = 0; n < min_samples || looks.load(std::memory_order_relaxed) < min_looks;
       ++n) {
    table.put(seq_of_sample(n), time_of(seq_of_sample(n)));
    written.store(n + 1, std::memory_order_release);
  }
  done.store(true, std::memory_order_release);
  for (auto& th : readers) th.join();
  CAPTURE(written.load(), found.load(), gone.load());
  REQUIRE(wrong.load() == 0);
  REQUIRE(found.load() > 0);
}

TEST_CASE("control: a service item's number and entry time go with its ticket") {
  detail::control ctl;
  // A source pipeline's id is the item's number; its time is in the sample table.
  REQUIRE(ctl.seq_of(detail::item_meta{42}) == 42);
  REQUIRE(ctl.entered(detail::item_meta{3}).weight == 0);  // not a timed item
  ctl.sampled(8, 555);
  REQUIRE(ctl.entered(detail::item_meta{8}).t0_ns == 555);
  REQUIRE(ctl.entered(detail::item_meta{8}).weight == 8);
  // A service's id is the ticket; a ticket used again carries the new item.
  ctl.use_tickets(4);
  ctl.enter_ticket(2, 77, 1234, 0);
  REQUIRE(ctl.seq_of(detail::item_meta{2}) == 77);
  REQUIRE(ctl.entered(detail::item_meta{2}).t0_ns == 1234);
  REQUIRE(ctl.entered(detail::item_meta{2}).weight == 1);
  ctl.enter_ticket(2, 78, 0, 0);  // metrics off: not timed
  REQUIRE(ctl.seq_of(detail::item_meta{2}) == 78);
  REQUIRE(ctl.entered(detail::item_meta{2}).t0_ns == 0);
}

TEST_CASE("meta_list: one pointer that grows, appends, copies and moves its items") {
  using detail::item_meta;
  using detail::meta_list;
  STATIC_REQUIRE(sizeof(meta_list) == sizeof(void*));
  meta_list a;
  REQUIRE(a.empty());
  REQUIRE(a.size() == 0);
  REQUIRE(a.begin() == a.end());
  for (std::uint64_t i = 0; i < 100; ++i) a.push_back(item_meta{i});
  REQUIRE(a.size() == 100);
  REQUIRE(a.capacity() >= 100);
  for (std::uint64_t i = 0; i < 100; ++i) REQUIRE(a[i].id == i);

  meta_list b;
  b.reserve(4);
  b.push_back(item_meta{1000});
  b.append(a);
  b.append(meta_list{});  // appending nothing changes nothing
  REQUIRE(b.size() == 101);
  REQUIRE(b[0].id == 1000);
  REQUIRE(b[100].id == 99);

  meta_list c = b;  // a deep copy
  b.push_back(item_meta{2000});
  REQUIRE(c.size() == 101);
  REQUIRE(b.size() == 102);
  REQUIRE(c[100].id == 99);

  meta_list d = std::move(c);
  REQUIRE(c.empty());  // NOLINT(bugprone-use-after-move): a moved-from list is empty
  REQUIRE(d.size() == 101);
  d = a;
  REQUIRE(d.size() == 100);
  d = meta_list{};
  REQUIRE(d.empty());
  std::uint64_t sum = 0;
  for (const item_meta& m : a) sum += m.id;
  REQUIRE(sum == 99 * 100 / 2);
}

TEST_CASE("meta_list: a single item's meta inline, a list once it grows, retained in order") {
  using detail::item_meta;
  using detail::meta_list;
  const std::uint64_t big = (std::uint64_t{1} << 63) - 1;  // the largest id
  meta_list one{item_meta{big}};
  REQUIRE_FALSE(one.is_list());
  REQUIRE(one.size() == 1);
  REQUIRE(one.capacity() == 0);  // no allocation
  REQUIRE(one.front().id == big);
  REQUIRE(one.end() - one.begin() == 1);

  meta_list copy = one;  // inline: a copy of the word
  REQUIRE_FALSE(copy.is_list());
  REQUIRE(copy.front().id == big);
  meta_list moved = std::move(copy);
  REQUIRE(moved.front().id == big);
  REQUIRE(copy.is_list());  // NOLINT(bugprone-use-after-move): moved-from: an empty list
  REQUIRE(copy.empty());    // NOLINT(bugprone-use-after-move)

  one.push_back(item_meta{7});  // becomes a list, its inline meta first
  REQUIRE(one.is_list());
  REQUIRE(one.size() == 2);
  REQUIRE(one[0].id == big);
  REQUIRE(one[1].id == 7);

  meta_list batch;  // a batch of batches: one item's meta and a list append alike
  batch.append(moved);
  batch.append(one);
  REQUIRE(batch.is_list());
  REQUIRE(batch.size() == 3);
  REQUIRE(batch[2].id == 7);

  meta_list of_one;  // a list of one item stays a list (a batch, not a single item)
  of_one.append(meta_list{item_meta{5}});
  REQUIRE(of_one.is_list());
  REQUIRE(of_one.size() == 1);

  std::vector<std::size_t> seen;
  batch.retain([&](std::size_t i, const item_meta& m) {
    seen.push_back(i);
    return m.id != big;
  });
  REQUIRE(seen == std::vector<std::size_t>{0, 1, 2});
  REQUIRE(batch.size() == 1);
  REQUIRE(batch.front().id == 7);

  meta_list single{item_meta{3}};
  single.retain([](std::size_t, const item_meta&) { return true; });
  REQUIRE_FALSE(single.is_list());
  single.retain([](std::size_t, const item_meta&) { return false; });
  REQUIRE(single.empty());

  const detail::envelope<std::uint64_t> e{std::uint64_t{9}, item_meta{4}};
  STATIC_REQUIRE(sizeof(e) == 16);
  REQUIRE(e.items() == 1);
  REQUIRE(e.meta().id == 4);
}

TEST_CASE("outcome: a value or an error, never both") {
  auto ok = outcome<std::string>::success("label");
  REQUIRE(ok);
  REQUIRE(ok.has_value());
  REQUIRE(*ok == "label");
  REQUIRE(ok->size() == 5);
  REQUIRE(ok.value() == "label");
  REQUIRE(ok.error() == nullptr);
  const std::string moved = std::move(ok).value();
  REQUIRE(moved == "label");

  auto bad = outcome<std::string>::failure(std::make_exception_ptr(closed_error("cancelled")));
  REQUIRE_FALSE(bad);
  REQUIRE(bad.error() != nullptr);
  REQUIRE_THROWS_AS(bad.value(), closed_error);
}

namespace {
// A base with a virtual destructor, for box's conversion to a base.
struct shape {
  virtual ~shape() = default;
  virtual int sides() const noexcept = 0;
};
struct square final : shape {
  explicit square(t::counted c) : tag(std::move(c)) {}
  int sides() const noexcept override { return 4; }
  t::counted tag;
};
}  // namespace

TEST_CASE("box: one owner, moved, reset, released, converted to a base, and nothing leaks") {
  const long live = t::counted::live.load();
  {
    detail::box<t::counted> empty;
    REQUIRE_FALSE(empty);
    REQUIRE(empty == nullptr);
    REQUIRE(empty.get() == nullptr);
    detail::box<t::counted> none = nullptr;
    REQUIRE(none == nullptr);

    auto a = detail::make_box<t::counted>(7);
    REQUIRE(a);
    REQUIRE(a != nullptr);
    REQUIRE(a->value == 7);
    REQUIRE((*a).value == 7);
    REQUIRE(t::counted::live.load() == live + 1);

    detail::box<t::counted> b = std::move(a);  // ownership moves; the object stays put
    REQUIRE(a == nullptr);  // NOLINT(bugprone-use-after-move): a moved-from box is empty
    REQUIRE(b->value == 7);
    REQUIRE(t::counted::live.load() == live + 1);

    auto c = detail::make_box<t::counted>(8);
    b = std::move(c);  // the 7 is destroyed, the 8 kept
    REQUIRE(b->value == 8);
    REQUIRE(t::counted::live.load() == live + 1);
    auto& self = b;
    b = std::move(self);  // NOLINT(bugprone-use-after-move): self-assignment keeps it
    REQUIRE(b->value == 8);
    REQUIRE(t::counted::live.load() == live + 1);

    b.reset(new t::counted(9));
    REQUIRE(b->value == 9);
    REQUIRE(t::counted::live.load() == live + 1);
    t::counted* const raw = b.release();
    REQUIRE(b == nullptr);
    REQUIRE(raw->value == 9);
    delete raw;
    REQUIRE(t::counted::live.load() == live);

    b.reset(new t::counted(10));
    b.reset();
    REQUIRE(b == nullptr);
    REQUIRE(t::counted::live.load() == live);

    detail::box<shape> s = detail::make_box<square>(t::counted(11));
    REQUIRE(s->sides() == 4);
    REQUIRE(t::counted::live.load() == live + 1);
    s = detail::make_box<square>(t::counted(12));  // the first square goes, through ~shape
    REQUIRE(t::counted::live.load() == live + 1);
  }
  REQUIRE(t::counted::live.load() == live);  // the destructor deleted the last square
  static_assert(std::is_nothrow_move_constructible_v<detail::box<t::counted>>);
  static_assert(!std::is_copy_constructible_v<detail::box<t::counted>>);
  static_assert(sizeof(detail::box<t::counted>) == sizeof(void*));
}
