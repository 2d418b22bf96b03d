// conveyor/counters/trace.hpp: bounded trace-event buffer: per track, a ring of the last
// N spans and counter samples. Export: trace_export.hpp (Chrome trace-event JSON).
//
//   metrics::trace_buffer trace{16384};                      // events kept per track
//   auto& t = trace.add_track("map normalize #1");           // setup: before writers run
//   t.span("normalize", phase.start_ns, phase.end_ns);       // that track's writer only
//   t.counter("ring normalize", ring.size_approx(), now);    // same writer
//   metrics::write_chrome_trace(std::cerr, trace);           // any thread (trace_export.hpp)
//
// Memory is fixed at add_track(): 40 bytes x events_per_track per track, however long
// the run; the oldest events are overwritten. Writers never lock and never allocate.
// Event names are `const char*` that must outlive the buffer (string literals, or names
// owned by the pipeline that owns the buffer); they are stored as pointers, not copied.
//
// Thread-safety: add_track() during setup only (not concurrently with anything else on
// the buffer). Each track has exactly one writer thread at a time (a stage worker, a
// lane thread). Readers (for_each_event, write_chrome_trace) may run from any thread at
// any time, also while writers run: every slot is a seqlock (Boehm, "Can seqlocks get
// along with programming language memory models?", 2012) with atomic fields, in the
// fence-free form (release stores / acquire loads of the fields instead of fences, which
// costs nothing on x86 and which ThreadSanitizer understands), so a reader skips a slot
// that is being overwritten instead of reading a torn event. While
// writers run, an export therefore holds each track's most recent events minus at most
// the few being overwritten during the read; after writers stop it is exact.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/base/clock.hpp"
#include "conveyor/base/config.hpp"

namespace conveyor::metrics {

enum class trace_event_kind : std::uint32_t { span = 1, counter = 2 };

// One event as a reader sees it.
struct trace_event {
  trace_event_kind kind = trace_event_kind::span;
  const char* name = nullptr;
  std::int64_t ts_ns = 0;   // span: start; counter: sample time
  std::int64_t dur_ns = 0;  // span only
  double value = 0.0;       // counter only
};

class trace_track {
 public:
  trace_track(const trace_track&) = delete;
  trace_track& operator=(const trace_track&) = delete;

  // Writer thread only. A span is [start_ns, end_ns); spans of one track must not
  // partially overlap (nest or follow each other), which sequential work satisfies.
  void span(const char* name, std::int64_t start_ns, std::int64_t end_ns) noexcept {
    write(trace_event_kind::span, name, start_ns,
          static_cast<std::uint64_t>(end_ns > start_ns ? end_ns - start_ns : 0));
  }
  void span(const char* name, interval iv) noexcept { span(name, iv.start_ns, iv.end_ns); }
  void counter(const char* name, double value, std::int64_t ts_ns) noexcept {
    write(trace_event_kind::counter, name, ts_ns, std::bit_cast<std::uint64_t>(value));
  }

  const std::string& name() const noexcept { return name_; }
  std::size_t capacity() const noexcept { return capacity_; }
  // Events ever written (also those overwritten since). Any thread.
  std::uint64_t written() const noexcept {
    // acquire: pairs with the release store in write(); see for_each_event().
    return written_.load(std::memory_order_acquire);
  }

  // Calls f(const trace_event&) for each event still held, oldest first, skipping any
  // slot overwritten during the call. Any thread.
  template <class F>
  void for_each_event(F&& f) const {
    const std::uint64_t n = written();
    const std::uint64_t first = n > capacity_ ? n - capacity_ : 0;
    for (std::uint64_t i = first; i < n; ++i) {
      const slot& s = slots_[i % capacity_];
      const std::uint64_t expected = 2 * i + 2;  // "event i, complete"
      // acquire: pairs with the final release store of seq in write(): if we see event
      // i complete, its fields as of that store are visible to the loads below.
      const std::uint64_t s1 = s.seq.load(std::memory_order_acquire);
      if (s1 != expected) continue;  // already overwritten by a newer event
      trace_event e;
      // acquire (each field): pairs with the release store of that field in write(); if
      // a load returns a newer event's value, the seq load below is ordered after it and
      // sees that event's odd marker, so the slot is rejected.
      e.kind = static_cast<trace_event_kind>(s.kind.load(std::memory_order_acquire));
      e.name = s.name.load(std::memory_order_acquire);
      e.ts_ns = s.ts.load(std::memory_order_acquire);
      const std::uint64_t payload = s.payload.load(std::memory_order_acquire);
      // relaxed: ordered after the acquire loads above.
      if (s.seq.load(std::memory_order_relaxed) != s1) continue;  // torn: skip
      if (e.kind == trace_event_kind::span) {
        e.dur_ns = static_cast<std::int64_t>(payload);
      } else {
        e.value = std::bit_cast<double>(payload);
      }
      f(std::as_const(e));
    }
  }

 private:
  friend class trace_buffer;

  trace_track(std::string name, std::size_t capacity)
      : name_(std::move(name)), capacity_(capacity), slots_(std::make_unique<slot[]>(capacity)) {}

  void write(trace_event_kind kind, const char* name, std::int64_t ts,
             std::uint64_t payload) noexcept {
    slot& s = slots_[pos_];
    const std::uint64_t i = next_;
    // relaxed: ordered before the field stores below by their release.
    s.seq.store(2 * i + 1, std::memory_order_relaxed);
    // release (each field): pairs with the acquire load of that field in
    // for_each_event(); a reader that sees this value also sees the odd marker above.
    s.kind.store(static_cast<std::uint32_t>(kind), std::memory_order_release);
    s.name.store(name, std::memory_order_release);
    s.ts.store(ts, std::memory_order_release);
    s.payload.store(payload, std::memory_order_release);
    // release: pairs with the acquire load of seq in for_each_event().
    s.seq.store(2 * i + 2, std::memory_order_release);
    next_ = i + 1;
    if (++pos_ == capacity_) pos_ = 0;
    // release: pairs with the acquire load in written(); a reader that sees n events
    // sees slot seqs at least as new as event n-1's completion.
    written_.store(next_, std::memory_order_release);
  }

  struct slot {
    std::atomic<std::uint64_t> seq{0};  // 2i+1 while event i is written, 2i+2 when done
    std::atomic<std::int64_t> ts{0};
    std::atomic<std::uint64_t> payload{0};  // span: duration ns; counter: double bits
    std::atomic<const char*> name{nullptr};
    std::atomic<std::uint32_t> kind{0};
  };

  const std::string name_;
  const std::size_t capacity_;
  std::unique_ptr<slot[]> slots_;
  // Writer-private position (the writer is the only thread touching these two).
  std::size_t pos_ = 0;
  std::uint64_t next_ = 0;
  alignas(cache_line_size) std::atomic<std::uint64_t> written_{0};
};

class trace_buffer {
 public:
  static constexpr std::size_t default_events_per_track = 16384;

  // origin_ns: the time exported as 0 (default: now). @throws config_error unless
  // 1 <= events_per_track <= 2^26.
  explicit trace_buffer(std::size_t events_per_track = default_events_per_track,
                        std::int64_t origin_ns = now_ns())
      : events_per_track_(check(events_per_track)), origin_ns_(origin_ns) {}

  trace_buffer(const trace_buffer&) = delete;
  trace_buffer& operator=(const trace_buffer&) = delete;

  // Setup only (allocates): a new track, exported as its own thread, in this order.
  // The reference stays valid for the buffer's lifetime.
  trace_track& add_track(std::string name) {
    tracks_.push_back(
        std::unique_ptr<trace_track>(new trace_track(std::move(name), events_per_track_)));
    return *tracks_.back();
  }

  std::size_t track_count() const noexcept { return tracks_.size(); }
  trace_track& track(std::size_t i) noexcept { return *tracks_[i]; }
  const trace_track& track(std::size_t i) const noexcept { return *tracks_[i]; }
  std::size_t events_per_track() const noexcept { return events_per_track_; }
  std::int64_t origin_ns() const noexcept { return origin_ns_; }

 private:
  static std::size_t check(std::size_t n) {
    CONVEYOR_EXPECTS(n >= 1 && n <= (std::size_t{1} << 26),
                     "trace_buffer: events_per_track must be in [1, 2^26] (40 bytes each)");
    return n;
  }

  std::size_t events_per_track_;
  std::int64_t origin_ns_;
  std::vector<std::unique_ptr<trace_track>> tracks_;
};

}  // namespace conveyor::metrics
