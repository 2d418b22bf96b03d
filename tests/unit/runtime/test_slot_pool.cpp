// slot_pool over the host runtime: configuration errors, ownership, a slot is never
// handed out before the event behind its last use completed, close() cancels, many
// threads share it safely, jitter finds a skipped event and never a correct run, and
// nothing allocates after construction.
#include "conveyor/runtime/slot_pool.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "conveyor/base/error.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "test_support.hpp"

// Every operator new in this binary goes through replace_new.hpp, which counts them.
#include "replace_new.hpp"

using conveyor::test::allocations;
namespace host = conveyor::host;
using pool_t = conveyor::slot_pool<host::runtime, std::uint64_t>;
using namespace std::chrono_literals;

namespace {

// Holds stream work until the test opens it. Declare the gate before the streams and a
// gate::opener after them, so every exit path opens it before the streams drain.
class gate {
 public:
  void wait() const {
    // acquire: pairs with the release store in open().
    while (!open_.load(std::memory_order_acquire)) open_.wait(false, std::memory_order_acquire);
  }
  void open() {
    open_.store(true, std::memory_order_release);
    open_.notify_all();
  }
  struct opener {
    gate& g;
    ~opener() { g.open(); }
  };

 private:
  std::atomic<bool> open_{false};
};

}  // namespace

TEST_CASE("slot_pool: bad sizes are refused at construction with what to change") {
  using Catch::Contains;
  const auto [slots, in, out, says] =
      GENERATE(table<std::size_t, std::size_t, std::size_t, std::string>({
          {0, 8, 8, "slots must be in [1, 65536], got 0"},
          {65537, 8, 8, "got 65537"},
          {4, 0, 8, "in_elems and out_elems must be >= 1"},
          {4, 8, 0, "in_elems and out_elems must be >= 1"},
          {4, std::size_t{1} << 40, 8, "exceed 1 TiB"},
          {2, ~std::size_t{0}, 1, "check the units"},
      }));
  CAPTURE(slots, in, out);
  REQUIRE_THROWS_AS(pool_t(slots, in, out), conveyor::config_error);
  REQUIRE_THROWS_WITH(pool_t(slots, in, out), Contains(says));
}

TEST_CASE("slot_pool: slots are distinct, sized and aligned, and owned until released") {
  const std::size_t n = GENERATE(1u, 3u, 8u);
  CAPTURE(n);
  pool_t pool{n, 10, 3};
  REQUIRE(pool.size() == n);
  std::vector<pool_t::slot*> held;
  std::set<std::size_t> indices;
  std::set<const void*> starts;
  for (std::size_t i = 0; i < n; ++i) {
    pool_t::slot* s = pool.try_acquire();
    REQUIRE(s != nullptr);
    REQUIRE(s->pinned_in.size() == 10);
    REQUIRE(s->device_in.size() == 10);
    REQUIRE(s->device_out.size() == 3);
    REQUIRE(s->pinned_out.size() == 3);
    for (const void* p : {static_cast<const void*>(s->pinned_in.data()),
                          static_cast<const void*>(s->device_in.data()),
                          static_cast<const void*>(s->device_out.data()),
                          static_cast<const void*>(s->pinned_out.data())}) {
      REQUIRE(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
      REQUIRE(starts.insert(p).second);
    }
    indices.insert(s->index);
    held.push_back(s);
  }
  REQUIRE(indices.size() == n);
  REQUIRE(pool.try_acquire() == nullptr);  // exhausted
  pool.release(held.back());
  REQUIRE(pool.try_acquire() == held.back());
  for (auto* s : held) pool.release(s);

  // Misuse is refused, not silently corrupting the free list.
  REQUIRE_THROWS_WITH(pool.release(held.front()), Catch::Contains("released twice"));
  pool_t other{1, 1, 1};
  pool_t::slot* foreign = other.acquire();
  REQUIRE_THROWS_WITH(pool.release(foreign), Catch::Contains("does not belong to this pool"));
  other.release(foreign);
}

TEST_CASE(
    "slot_pool: a slot is not handed out again before the event behind its last use completes") {
  pool_t pool{1, 4, 4};
  gate g;
  host::stream lane;
  gate::opener open_on_exit{g};
  pool_t::slot* s = pool.acquire();
  REQUIRE(s != nullptr);
  const auto out = s->pinned_out;
  // The lane's last use of the slot writes into it, behind a closed gate.
  lane.ref().enqueue([&g, out] {
    g.wait();
    out[0] = 99;
  });
  pool.release(s, lane);
  pool_t::slot* early = pool.try_acquire();  // deterministic: the gate holds the event
  const bool pending = (early == nullptr);
  if (early != nullptr) pool.release(early);
  g.open();
  pool_t::slot* again = pool.acquire();  // waits for the event, then hands the slot back
  REQUIRE(pending);
  REQUIRE(again == s);
  REQUIRE(again->pinned_out[0] == 99);  // the lane's write is complete and visible
  pool.release(again);
}

TEST_CASE("slot_pool: a write past a slot's pinned input throws and the next slot is intact") {
  // 32 x 8-byte elements = 256 bytes: no padding, slot 1 starts where slot 0 ends.
  pool_t pool{2, 32, 1};
  pool_t::slot* a = pool.acquire();
  pool_t::slot* b = pool.acquire();
  if (b->pinned_in.data() < a->pinned_in.data()) std::swap(a, b);
  REQUIRE(b->pinned_in.data() == a->pinned_in.data() + 32);  // neighbours in one region
  for (std::size_t i = 0; i < 32; ++i) b->pinned_in[i] = 7;

  // A stage-in that writes 64 elements into a span of 32, element by element ...
  auto dst = a->pinned_in;
  std::size_t written = 0;
  REQUIRE_THROWS_WITH(
      [&] {
        for (std::size_t i = 0; i < 64; ++i, ++written) dst[i] = 1;
      }(),
      Catch::Contains("index 32 is outside a span of 32 elements") &&
          Catch::Contains("raise in_elems"));
  REQUIRE(written == 32);  // stopped at the first index outside, before it landed
  // ... or row by row: the whole row is refused, nothing of it is written.
  const std::vector<std::uint64_t> row(16, 9);
  REQUIRE_NOTHROW(dst.write_at(16, row));
  REQUIRE_THROWS_WITH(dst.write_at(24, row), Catch::Contains("16 element(s) at index 24"));
  REQUIRE_THROWS_AS(dst.write_at(33, std::span<const std::uint64_t>{}), conveyor::config_error);
  REQUIRE(dst[23] == 9);
  REQUIRE(dst[24] == 9);  // still the first write_at's: the refused one wrote nothing
  // Reads are checked the same way.
  const pool_t::pinned_span<const std::uint64_t> ro = dst;
  REQUIRE_THROWS_AS(ro[32], conveyor::config_error);

  for (std::size_t i = 0; i < 32; ++i) {
    CAPTURE(i);
    REQUIRE(b->pinned_in[i] == 7);
  }
  pool.release(a);
  pool.release(b);
}

TEST_CASE("slot_pool: close() cancels a blocked acquire and later ones") {
  pool_t pool{1, 1, 1};
  pool_t::slot* s = pool.acquire();
  std::atomic<pool_t::slot*> got{s};
  std::thread waiter{[&] { got.store(pool.acquire()); }};  // blocks: the only slot is out
  pool.close();
  waiter.join();
  REQUIRE(got.load() == nullptr);
  REQUIRE(pool.closed());
  REQUIRE(pool.acquire() == nullptr);
  REQUIRE(pool.try_acquire() == nullptr);
  pool.release(s);  // still accepted after close
  REQUIRE(pool.acquire() == nullptr);
}

TEST_CASE("slot_pool: many threads acquiring and releasing never share a slot") {
  constexpr int threads = 4;
  constexpr std::size_t slots = 3;
  pool_t pool{slots, 2, 2};
  std::array<std::atomic<int>, slots> owners{};
  std::atomic<bool> shared{false};
  std::array<host::stream, threads> lanes{};
  const std::size_t rounds = conveyor::test::scaled(20'000);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t i = 0; i < rounds; ++i) {
        pool_t::slot* s = pool.acquire();
        // relaxed: the pool's hand-over orders these; a second owner would see 1 here.
        if (owners[s->index].exchange(1, std::memory_order_relaxed) != 0) shared.store(true);
        s->pinned_in[0] = static_cast<std::uint64_t>(t);
        owners[s->index].store(0, std::memory_order_relaxed);
        if (i % 2 == 0) {
          pool.release(s);
        } else {
          copy_async(s->device_in, s->pinned_in, lanes[t]);
          pool.release(s, lanes[t]);
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  for (auto& l : lanes) l.synchronize();
  REQUIRE_FALSE(shared.load());
  std::size_t free_slots = 0;
  while (pool.try_acquire() != nullptr) ++free_slots;
  REQUIRE(free_slots == slots);  // none lost, none duplicated
}

// ---- jitter: the slot-pool path against its own broken variant -------------------------

namespace {

// Two lanes, each a producer thread and a jittered stream, share one pool. Per batch:
// host writes pinned_in; the lane copies it in, runs a "kernel" (x * 3 + 1), copies out,
// and checks pinned_out on the stream thread against the batch it was launched for.
// record_events = false releases slots without recording the lane's event (the missing
// wait), so a producer can overwrite a slot the lane has not read yet.
constexpr std::size_t k = 64;  // elements per slot

std::uint64_t run_lanes(bool record_events, std::uint64_t batches, std::uint64_t seed) {
  pool_t pool{4, k, k};
  std::atomic<std::uint64_t> corrupted{0};
  {
    std::array<host::stream, 2> lanes{host::stream{host::jitter{seed, 20us}},
                                      host::stream{host::jitter{seed + 1, 20us}}};
    std::vector<std::thread> producers;
    for (std::uint64_t lane = 0; lane < 2; ++lane) {
      producers.emplace_back([&, lane] {
        const host::stream& st = lanes[lane];
        for (std::uint64_t b = lane; b < batches; b += 2) {
          pool_t::slot* s = pool.acquire();
          const std::uint64_t base = b << 20;
          for (std::size_t j = 0; j < k; ++j) s->pinned_in[j] = base + j;
          copy_async(s->device_in, s->pinned_in, st);
          st.ref().enqueue([in = s->device_in, out = s->device_out] {
            for (std::size_t j = 0; j < k; ++j) out.unsafe_host()[j] = in.unsafe_host()[j] * 3 + 1;
          });
          copy_async(s->pinned_out, s->device_out, st);
          st.ref().enqueue([out = s->pinned_out, base, &corrupted] {
            for (std::size_t j = 0; j < k; ++j) {
              if (out[j] != (base + j) * 3 + 1) {
                corrupted.fetch_add(1, std::memory_order_relaxed);  // relaxed: a tally
                return;
              }
            }
          });
          if (record_events) {
            pool.release(s, st);
          } else {
            pool.release(s);  // BUG on purpose: the lane may still read and write the slot
          }
        }
      });
    }
    for (auto& p : producers) p.join();
    for (auto& l : lanes) l.synchronize();
  }
  return corrupted.load();
}

}  // namespace

TEST_CASE("slot_pool with jitter: the event-guarded path never corrupts over 100k batches") {
  const std::uint64_t batches = conveyor::test::scaled(100'000);
  CAPTURE(batches);
  REQUIRE(run_lanes(true, batches, 2024) == 0);
}

#if !defined(CONVEYOR_TEST_TSAN)
// TSan reports the deliberate race itself (halting the run), so this variant runs in the
// plain and ASan builds.
TEST_CASE("slot_pool with jitter: releasing without the lane's event is caught as corruption") {
  const std::uint64_t batches = conveyor::test::scaled(5'000);
  CAPTURE(batches);
  REQUIRE(run_lanes(false, batches, 2024) > 0);
}
#endif

TEST_CASE("slot_pool: acquire, release and stream work allocate nothing after construction") {
  constexpr std::size_t per_slot = 32;
  const std::uint64_t at_start = allocations.load(std::memory_order_relaxed);
  pool_t pool{3, per_slot, per_slot};
  REQUIRE(allocations.load(std::memory_order_relaxed) > at_start);  // the counter counts
  host::stream lane{host::jitter{5, 5us}};
  host::event done;
  std::uint64_t sum = 0;  // lane thread only, until synchronize()
  auto one_batch = [&](std::uint64_t b) {
    pool_t::slot* s = pool.acquire();
    for (std::size_t j = 0; j < per_slot; ++j) s->pinned_in[j] = b + j;
    copy_async(s->device_in, s->pinned_in, lane);
    memset_async(s->device_out, 0, lane);
    copy_async(s->device_out, s->device_in, lane);
    copy_async(s->pinned_out, s->device_out, lane);
    lane.ref().enqueue([out = s->pinned_out, &sum] {
      for (std::uint64_t x : out) sum += x;
    });
    pool.release(s, lane);
    done.record(lane);
    lane.ref().wait(done);
    if (!done.query()) done.synchronize();
  };
  one_batch(0);  // warm-up: first-use lazy initialization anywhere is not the hot path
  lane.synchronize();
  const std::uint64_t batches = conveyor::test::scaled(5'000);
  const std::uint64_t before = allocations.load(std::memory_order_relaxed);
  for (std::uint64_t b = 1; b <= batches; ++b) one_batch(b);
  lane.synchronize();
  const std::uint64_t after = allocations.load(std::memory_order_relaxed);
  REQUIRE(after == before);
  std::uint64_t expected = 0;
  for (std::uint64_t b = 0; b <= batches; ++b)
    expected += per_slot * b + per_slot * (per_slot - 1) / 2;
  REQUIRE(sum == expected);
}

TEST_CASE("slot_pool: the destructor waits for the last use of every slot") {
  gate g;
  host::stream lane;
  gate::opener open_on_exit{g};
  std::atomic<bool> destroying{false};
  std::thread opener{[&] {
    while (!destroying.load()) std::this_thread::yield();
    g.open();  // only once the pool's destructor is about to run
  }};
  {
    pool_t pool{2, 16, 16};
    pool_t::slot* s = pool.acquire();
    lane.ref().enqueue([&g, out = s->device_out] {
      g.wait();
      for (auto& x : out.unsafe_host()) x = 1;  // a use-after-free under ASan if not waited for
    });
    pool.release(s, lane);
    destroying.store(true);
  }
  opener.join();
  lane.synchronize();
  SUCCEED("the pool outlived the lane's last write into it");
}
