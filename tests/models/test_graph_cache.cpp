// graph_cache and graph_bucket (src/models): the bounded LRU cache behind mlp's CUDA
// graphs, with a counted stand-in for a graph exec, on the host.
#include "conveyor_models/graph_cache.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "conveyor/base/error.hpp"

namespace cm = conveyor_models;

namespace {

// A "graph exec": an id; destroying one records it.
struct destroy_log {
  std::vector<int>* destroyed;
  void operator()(int id) const noexcept { destroyed->push_back(id); }
};
using cache_t = cm::graph_cache<int, int, destroy_log>;

}  // namespace

TEST_CASE("graph_bucket: the next power of two, capped at max_items") {
  CHECK(cm::graph_bucket(0, 64) == 0);
  CHECK(cm::graph_bucket(1, 64) == 1);
  CHECK(cm::graph_bucket(2, 64) == 2);
  CHECK(cm::graph_bucket(3, 64) == 4);
  CHECK(cm::graph_bucket(5, 64) == 8);
  CHECK(cm::graph_bucket(33, 64) == 64);
  CHECK(cm::graph_bucket(64, 64) == 64);
  CHECK(cm::graph_bucket(90, 100) == 100);  // never above max_items: the buffers' rows
  CHECK(cm::graph_bucket(100, 100) == 100);
  static_assert(cm::graph_bucket(17, 256) == 32);
  for (std::size_t n = 1; n <= 1000; ++n) {
    const std::size_t b = cm::graph_bucket(n, 1000);
    CAPTURE(n, b);
    REQUIRE(b >= n);
    REQUIRE(b <= 1000);
    REQUIRE(b < 2 * n);  // at most half of a bucket is padding
  }
}

TEST_CASE("graph_cache: hits, misses and captures are counted, the LRU value is evicted") {
  std::vector<int> destroyed;
  {
    cache_t cache{2, destroy_log{&destroyed}};
    REQUIRE(cache.capacity() == 2);
    REQUIRE(cache.find({0, 8}) == nullptr);  // miss
    cache.insert({0, 8}, 100);
    REQUIRE(cache.find({0, 16}) == nullptr);  // miss
    cache.insert({0, 16}, 101);
    REQUIRE(cache.find({0, 8}) != nullptr);  // hit: {0, 8} is now the newest
    REQUIRE(*cache.find({0, 8}) == 100);     // hit
    REQUIRE(cache.find({1, 8}) == nullptr);  // another call, same rows: a miss
    cache.insert({1, 8}, 102);               // full: evicts {0, 16}, the least recent
    REQUIRE(destroyed == std::vector<int>{101});
    REQUIRE(cache.size() == 2);
    REQUIRE(cache.contains({0, 8}));
    REQUIRE(cache.contains({1, 8}));
    REQUIRE_FALSE(cache.contains({0, 16}));

    const cm::graph_cache_stats st = cache.stats();
    CHECK(st.hits == 2);
    CHECK(st.misses == 3);
    CHECK(st.captures == 3);
    CHECK(st.evictions == 1);
    CHECK(st.cached == 2);

    cache.clear();  // destroys the rest; the counters stay
    CHECK(cache.size() == 0);
    CHECK(cache.stats().cached == 0);
    CHECK(cache.stats().captures == 3);
    cache.insert({2, 4}, 103);
  }
  // Every value destroyed exactly once: evicted, cleared, or at destruction.
  REQUIRE(std::multiset<int>(destroyed.begin(), destroyed.end()) ==
          std::multiset<int>{100, 101, 102, 103});
}

TEST_CASE("graph_cache: dynamic batch sizes replay a few buckets, within the capacity") {
  const std::size_t max_items = 64;
  const std::size_t capacity = GENERATE(3u, 16u);
  CAPTURE(capacity);
  std::vector<int> destroyed;
  cache_t cache{capacity, destroy_log{&destroyed}};
  std::uint64_t x = 12345, calls = 0;
  int next_id = 0;
  for (int i = 0; i < 10'000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;  // batch sizes 1 .. 64
    const std::size_t items = 1 + (x >> 33) % max_items;
    const cm::graph_cache<int, int, destroy_log>::key k{0, cm::graph_bucket(items, max_items)};
    if (cache.find(k) == nullptr) cache.insert(k, next_id++);
    ++calls;
    REQUIRE(cache.size() <= capacity);
  }
  const cm::graph_cache_stats st = cache.stats();
  CAPTURE(st.hits, st.misses, st.captures, st.evictions);
  REQUIRE(st.hits + st.misses == calls);
  REQUIRE(st.captures == st.misses);
  REQUIRE(st.evictions == destroyed.size());
  REQUIRE(st.cached == cache.size());
  if (capacity >= 7) {  // 7 buckets (1, 2, 4 .. 64) fit: each captured once, then replayed
    REQUIRE(st.captures == 7);
    REQUIRE(st.evictions == 0);
  } else {  // too small: graphs are evicted and captured again, but never more are held
    REQUIRE(st.evictions == st.captures - capacity);
  }
}

TEST_CASE("graph_cache: a zero capacity is refused with what to change") {
  std::vector<int> destroyed;
  REQUIRE_THROWS_AS(cache_t(0, destroy_log{&destroyed}), conveyor::config_error);
  REQUIRE_THROWS_WITH(cache_t(0, destroy_log{&destroyed}), Catch::Contains("graph_cache_capacity"));
}
