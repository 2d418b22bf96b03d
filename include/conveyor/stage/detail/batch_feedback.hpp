// conveyor/stage/detail/batch_feedback.hpp: the way back from the end of a pipeline to a
// batch stage with a latency target: when each batch's first item was delivered.
//
//   detail::batch_feedback fb;                          // one per batch stage with a target
//   ctl.batch_feedback = &fb;                           // setup: the terminal stage reports
//   fb.sent(seq, {cut_ns, t0_ns, n});                   // the batcher, as a batch leaves
//   auto b = fb.claim(seq);  deliver(item);  if (b) fb.returned(*b, now_ns());   // the end
//   while (auto o = fb.take()) controller.completed(*o);                        // the batcher
//
// An envelope carries only its items' identities (detail::item_meta), so the batcher keys
// what it knows of a batch (its cut time, its first item's entry time, its size) by the
// sequence number of the batch's first item, in a table of `slots` entries; the terminal
// stage looks each item it delivers up there (one load: a miss for every item but a
// batch's first) and, for a batch's first, sends the outcome back through a small ring
// that the batcher drains before each batch. Sequence numbers are unique per run (a
// service's ticket is reused, its number is not), so an entry left behind by a batch
// whose first item failed or expired is never matched by another item: it is overwritten
// later. Two batches whose keys share a slot, or a full return ring, lose a sample, never
// mix two: the controller works from samples.
//
// Thread-safety: sent() and take() from one thread (the batcher's); claim() and
// returned() from any number of threads (the terminal stage's workers).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "conveyor/ring/mpmc_ring.hpp"
#include "conveyor/stage/detail/latency_controller.hpp"

namespace conveyor::detail {

class batch_feedback {
 public:
  static constexpr std::size_t slots = 1024;
  static constexpr std::size_t returns = 256;  // outcomes not yet taken by the batcher

  struct sent_batch {
    std::int64_t cut_ns = 0;
    std::int64_t t0_ns = 0;  // the first item's entry into the pipeline
    std::uint64_t size = 0;
    std::int64_t spread_ns = 0;  // the last item's arrival at the batch after the first's
  };

  // The batcher: a batch whose first item has sequence number seq left at b.cut_ns.
  void sent(std::uint64_t seq, const sent_batch& b) noexcept {
    entry& e = entries_[slot_of(seq)];
    // A seqlock without fences, as latency_samples: mark the entry as being written, then
    // the fields, then the key.
    // relaxed: the release stores of the fields below order the mark before them.
    e.key.store(writing, std::memory_order_relaxed);
    // release (each field): a claim() whose acquire load reads one of these values also
    // sees the mark (or a later key), so its compare-exchange of the old key fails: it
    // cannot pair these fields with the key before.
    e.cut_ns.store(b.cut_ns, std::memory_order_release);
    e.t0_ns.store(b.t0_ns, std::memory_order_release);
    e.size.store(b.size, std::memory_order_release);
    e.spread_ns.store(b.spread_ns, std::memory_order_release);
    // release: a claim() that reads this key reads these fields (or later ones, which
    // its compare-exchange then finds out).
    e.key.store(key_of(seq), std::memory_order_release);
  }

  // The terminal stage, before delivering item seq: the batch it was the first of, taken
  // out of the table (exactly one claim gets it); nullopt for every other item.
  std::optional<sent_batch> claim(std::uint64_t seq) noexcept {
    entry& e = entries_[slot_of(seq)];
    const std::uint64_t key = key_of(seq);
    // acquire: pairs with sent()'s release store of the key: the fields it wrote before
    // are visible below.
    if (e.key.load(std::memory_order_acquire) != key) return std::nullopt;
    // acquire (each): pairs with the release stores of a later sent(), if these loads
    // read one: its mark then happens-before the compare-exchange, which fails.
    sent_batch b{e.cut_ns.load(std::memory_order_acquire), e.t0_ns.load(std::memory_order_acquire),
                 e.size.load(std::memory_order_acquire),
                 e.spread_ns.load(std::memory_order_acquire)};
    std::uint64_t expected = key;
    // relaxed: the read-modify-write reads the latest key: it succeeds only if no later
    // sent() has marked the entry (whose mark would precede any field value of that
    // sent() read above), and only one of several claimers succeeds. Nothing is
    // published through it.
    if (!e.key.compare_exchange_strong(expected, empty, std::memory_order_relaxed,
                                       std::memory_order_relaxed))
      return std::nullopt;
    return b;
  }

  // The terminal stage, after delivering the claimed batch's first item at done_ns.
  void returned(const sent_batch& b, std::int64_t done_ns) noexcept {
    // The ring's own release/acquire hand the outcome to take(); a full ring drops it.
    (void)back_.try_push(
        batch_outcome{static_cast<std::size_t>(b.size), b.cut_ns, done_ns, done_ns - b.t0_ns});
  }

  // The batcher: an outcome that came back, oldest first; nullopt: none waiting.
  std::optional<batch_outcome> take() noexcept { return back_.try_pop(); }

 private:
  static constexpr std::uint64_t empty = 0;
  static constexpr std::uint64_t writing = ~std::uint64_t{0};
  static std::uint64_t key_of(std::uint64_t seq) noexcept { return seq + 1; }  // never empty
  // Batches' first items are a batch size apart: a multiplicative hash spreads them over
  // the table whatever the size.
  static std::size_t slot_of(std::uint64_t seq) noexcept {
    return static_cast<std::size_t>((seq * 0x9E3779B97F4A7C15ull) >> 54) & (slots - 1);
  }
  static_assert(slots == 1024, "slot_of keeps the top 10 bits");

  struct entry {
    std::atomic<std::uint64_t> key{empty};
    std::atomic<std::int64_t> cut_ns{0};
    std::atomic<std::int64_t> t0_ns{0};
    std::atomic<std::uint64_t> size{0};
    std::atomic<std::int64_t> spread_ns{0};
  };
  std::unique_ptr<entry[]> entries_ = std::make_unique<entry[]>(slots);
  mpmc_ring<batch_outcome> back_{returns};
};

}  // namespace conveyor::detail
