// conveyor/ring/wait_timing.hpp: what a ring's blocking calls spent waiting, for a caller
// that measures its waits without reading the clock around each one.
//
//   conveyor::wait_timing t;
//   auto v = ring.pop(nullptr, &t);     // or ring.push(std::move(x), &t)
//   // t.rounds: spin rounds; t.slow_ns: time in yields and sleeps; t.end_ns: when the
//   // last slow path ended (steady clock, ns; 0: none)
//
// The spin is counted in rounds (a re-check and a pause each; the caller knows what a
// round costs from the waits it times itself); the slow path reads the clock anyway, to
// tune the spin, and hands those readings out. Accumulates over several waits.
// Thread-safety: a plain value, one thread's.
#pragma once

#include <cstdint>

namespace conveyor {

struct wait_timing {
  std::uint32_t rounds = 0;  // spin rounds (a re-check and a pause each), every wait
  std::int64_t slow_ns = 0;  // time past the spins: in yields and sleeps
  std::int64_t end_ns = 0;   // steady clock at the end of the last slow path; 0: none
};

}  // namespace conveyor
