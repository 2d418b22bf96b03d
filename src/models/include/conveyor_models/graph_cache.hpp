// conveyor_models/graph_cache.hpp: a bounded, least-recently-used cache of captured work
// (CUDA graphs in mlp) keyed by call and batch bucket, and the bucketing that lets
// dynamic batching replay a few graphs instead of capturing one per batch size.
//
//   graph_cache<int, cudaGraphExec_t, destroy_exec> cache{16};    // holds at most 16
//   const std::size_t rows = graph_bucket(items, max_items);       // 5 items -> 8 rows
//   if (cudaGraphExec_t* g = cache.find({call, rows})) launch(*g);  // a hit: now the newest
//   else cache.insert({call, rows}, capture(rows));  // a miss: evicts (destroys) the oldest
//   graph_cache_stats st = cache.stats();            // hits, misses, captures, evictions
//
// The bucket of n items is the next power of two, capped at max_items: a batch is padded
// to its bucket's rows and the padding rows' results are dropped, so batches of 1 .. 256
// need at most 9 graphs per call. Plain C++ (no CUDA): Evict is whatever destroys a value.
// Thread-safety: find / insert / clear from one thread at a time (one lane's thread);
// stats() from any thread (relaxed counters, exact once that thread is joined).
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <utility>

#include "conveyor/base/config.hpp"

namespace conveyor_models {

// Rows a batch of `items` is padded to: the next power of two, at most max_items; 0 for 0.
constexpr std::size_t graph_bucket(std::size_t items, std::size_t max_items) noexcept {
  if (items == 0) return 0;
  const std::size_t p = std::bit_ceil(items);
  return p < max_items ? p : max_items;
}

struct graph_cache_stats {
  std::uint64_t hits = 0;       // replays of a cached graph
  std::uint64_t misses = 0;     // calls that found none (run eagerly, then captured)
  std::uint64_t captures = 0;   // graphs captured and cached
  std::uint64_t evictions = 0;  // graphs destroyed to stay within the capacity
  std::uint64_t cached = 0;     // graphs held now

  graph_cache_stats& operator+=(const graph_cache_stats& o) noexcept {
    hits += o.hits;
    misses += o.misses;
    captures += o.captures;
    evictions += o.evictions;
    cached += o.cached;
    return *this;
  }
};

template <class Call, class Value, class Evict>
class graph_cache {
 public:
  struct key {
    Call call;
    std::size_t rows;  // the bucket
    auto operator<=>(const key&) const = default;
  };

  // @throws conveyor::config_error when capacity is 0.
  explicit graph_cache(std::size_t capacity, Evict evict = Evict{})
      : capacity_(capacity), evict_(std::move(evict)) {
    CONVEYOR_EXPECTS(capacity >= 1,
                     "graph cache: capacity must be >= 1 (got 0); set "
                     "graph_cache_capacity, or turn cuda_graphs off");
  }
  ~graph_cache() { clear(); }
  graph_cache(const graph_cache&) = delete;
  graph_cache& operator=(const graph_cache&) = delete;

  // The value cached for k, now the most recently used; nullptr (a miss) if none.
  // Counts a hit or a miss; allocates nothing.
  Value* find(const key& k) {
    const auto it = index_.find(k);
    if (it == index_.end()) {
      bump(misses_);
      return nullptr;
    }
    bump(hits_);
    order_.splice(order_.begin(), order_, it->second);  // to the front: newest
    return &it->second->second;
  }

  // Caches v under k (not cached: find(k) missed), evicting the least recently used
  // value first when full. @note allocates (a list node and a map node).
  Value& insert(const key& k, Value v) {
    if (index_.size() >= capacity_) evict_oldest();
    order_.emplace_front(k, std::move(v));
    index_.emplace(k, order_.begin());
    bump(captures_);
    return order_.front().second;
  }

  // Destroys every value (counters stay).
  void clear() noexcept {
    for (auto& [k, v] : order_) evict_(v);
    order_.clear();
    index_.clear();
    cached_.store(0, std::memory_order_relaxed);  // relaxed: a statistic
  }

  std::size_t size() const noexcept { return index_.size(); }
  std::size_t capacity() const noexcept { return capacity_; }
  bool contains(const key& k) const { return index_.contains(k); }

  graph_cache_stats stats() const noexcept {
    // relaxed: statistics; the lane thread is the only writer.
    return {hits_.load(std::memory_order_relaxed), misses_.load(std::memory_order_relaxed),
            captures_.load(std::memory_order_relaxed), evictions_.load(std::memory_order_relaxed),
            cached_.load(std::memory_order_relaxed)};
  }

 private:
  using entry = std::pair<key, Value>;

  void evict_oldest() {
    entry& oldest = order_.back();
    evict_(oldest.second);
    index_.erase(oldest.first);
    order_.pop_back();
    bump(evictions_);
  }

  // One writer: a relaxed load and store, no read-modify-write needed.
  void bump(std::atomic<std::uint64_t>& c) noexcept {
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    cached_.store(index_.size(), std::memory_order_relaxed);
  }

  std::size_t capacity_;
  Evict evict_;
  std::list<entry> order_;  // most recently used first
  std::map<key, typename std::list<entry>::iterator> index_;
  std::atomic<std::uint64_t> hits_{0}, misses_{0}, captures_{0}, evictions_{0}, cached_{0};
};

}  // namespace conveyor_models
