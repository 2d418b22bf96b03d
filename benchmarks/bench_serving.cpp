// bench_serving: a conveyor service under open-loop Poisson traffic at ~70% of its
// capacity, on the host runtime: clean, with 1% of the requests poisoned (the prepare
// stage throws on them; error_policy::isolate, a service's default), and with 5% of the
// requests given a deadline shorter than their queueing delay.
//
//   input<request> | prepare (150 us of CPU, 2 workers) | batch(16).max_delay(300 us)
//                  | gpu segment, host runtime (20 us + 5 us per item on the stream) | unbatch
//
// The capacity is measured first, in the same process (a flood: every request submitted
// as fast as the service takes them); every row then offers 70% of it, on an absolute
// Poisson schedule from one client thread (a late submit does not delay the next ones).
// Rows: serving/clean, serving/poisoned:1pct, serving/deadlines:5pct. Counters:
//   offered_per_s, served_per_s  requests offered / served with their result, per second
//   p50_ms, p95_ms, p99_ms       client latency (submit -> callback) of served requests
//   failed, expired              requests that failed alone / whose deadline passed
//   expired_reached_model        expired requests the model stage still worked on (must be 0)
//   capacity_per_s               the flood's rate, the 100% the rows offer 70% of
// Each row runs CONVEYOR_SERVING_SECONDS (default 3) of traffic per iteration. A row whose
// requests do not all come back (served + failed + expired), or whose served answers are
// wrong, reports an error.
//
//   ./build/benchmarks/bench_serving --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using R = conveyor::host::runtime;
using namespace std::chrono_literals;

constexpr std::chrono::microseconds prepare_cpu{150};
constexpr std::chrono::microseconds model_base{20};
constexpr std::chrono::microseconds model_per_item{5};
constexpr std::size_t max_batch = 16;
constexpr std::chrono::microseconds tight_deadline{100};

struct request {
  std::uint64_t id;
  std::int64_t sent_ns;
};

// Burns d of this thread's CPU time (work that a preempted thread does not get done).
void burn(std::chrono::microseconds d) {
  const std::int64_t end =
      conveyor::thread_cpu_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  while (conveyor::thread_cpu_ns() < end) {
  }
}

std::uint64_t spread(std::uint64_t id) {
  const std::uint64_t h = id * 0x9E3779B97F4A7C15ull;
  return (h ^ (h >> 29)) % 100;
}

enum class traffic { clean, poisoned, deadlines };
bool is_poisoned(traffic t, std::uint64_t id) { return t == traffic::poisoned && spread(id) == 0; }
bool is_tight(traffic t, std::uint64_t id) { return t == traffic::deadlines && spread(id) < 5; }

// What the clients saw. latency_ns is written by the result thread only (served
// requests); the counters by any thread that settles a request.
struct client_log {
  explicit client_log(std::size_t max_requests) : modeled(max_requests), expired_ids(max_requests) {
    latency_ns.reserve(max_requests);
  }
  std::vector<std::int64_t> latency_ns;
  std::vector<std::atomic<std::uint8_t>> modeled;      // the model stage worked on id
  std::vector<std::atomic<std::uint8_t>> expired_ids;  // id got deadline_error
  std::atomic<std::uint64_t> served{0}, wrong{0}, failed{0}, expired{0}, other{0}, settled{0};
};

// The service: ids in, id * 2 + 1 out (the "model" on the host runtime's stream).
auto make_service(traffic t, client_log* log) {
  auto stage_in = [](std::vector<request>& b, R::pinned_span<std::uint64_t> dst) {
    for (std::size_t i = 0; i < b.size(); ++i) dst[i] = b[i].id;
    return b.size();
  };
  auto compute = [log](conveyor::lane_batch<R, std::uint64_t, std::uint64_t>& l) {
    const std::size_t n = l.items;
    l.stream.enqueue([in = l.in, out = l.out, n, log] {
      burn(model_base + model_per_item * static_cast<int>(n));
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t id = in.unsafe_host()[i];
        if (log != nullptr && id < log->modeled.size())
          log->modeled[id].store(1, std::memory_order_relaxed);
        out.unsafe_host()[i] = id * 2 + 1;
      }
    });
    return n;
  };
  auto stage_out = [](std::vector<request>&& b, R::pinned_span<const std::uint64_t> r) {
    std::vector<std::pair<request, std::uint64_t>> out;
    out.reserve(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) out.emplace_back(b[i], r[i]);
    return out;
  };
  auto segment = conveyor::gpu<R, std::uint64_t, std::uint64_t>({.lanes = 2,
                                                                 .slots_per_lane = 2,
                                                                 .in_elems = max_batch,
                                                                 .out_elems = max_batch,
                                                                 .name = "model"},
                                                                stage_in, compute, stage_out);
  return conveyor::pipeline{
      conveyor::input<request>().capacity(4096) |
          conveyor::map([t](request r) {
            burn(prepare_cpu / 2);
            if (is_poisoned(t, r.id))
              throw std::invalid_argument("malformed request " + std::to_string(r.id));
            burn(prepare_cpu / 2);
            return r;
          })
              .workers(2)
              .name("prepare") |
          conveyor::batch(max_batch).max_delay(300us) | std::move(segment) | conveyor::unbatch(),
      conveyor::pipeline_options{.ring_capacity = 256}};
}

// The flood: n requests submitted as fast as the service takes them; requests per second.
double measure_capacity() {
  auto svc = make_service(traffic::clean, nullptr);
  svc.start();
  constexpr std::uint64_t n = 20000;
  std::atomic<std::uint64_t> done{0};
  const auto t0 = clock_type::now();
  for (std::uint64_t id = 0; id < n; ++id)
    svc.submit(request{id, 0},
               [&done](conveyor::outcome<std::pair<request, std::uint64_t>>) noexcept {
                 done.fetch_add(1, std::memory_order_relaxed);
               });
  while (done.load(std::memory_order_relaxed) < n) std::this_thread::sleep_for(100us);
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  svc.stop(conveyor::stop_mode::drain);
  return static_cast<double>(n) / s;
}

double capacity() {
  static const double c = measure_capacity();
  return c;
}

double seconds_per_row() {
  const char* s = std::getenv("CONVEYOR_SERVING_SECONDS");
  const double v = s != nullptr ? std::strtod(s, nullptr) : 3.0;
  return v > 0 ? v : 3.0;
}

double percentile_ms(std::vector<std::int64_t>& v, double p) {
  if (v.empty()) return 0.0;
  const auto k = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return static_cast<double>(v[k]) * 1e-6;
}

void serving(benchmark::State& state, traffic t) {
  const double cap = capacity();
  const double rate = 0.7 * cap;
  const double seconds = seconds_per_row();
  for (auto _ : state) {
    const auto max_requests = static_cast<std::size_t>(4 * rate * seconds) + 64;
    auto log = std::make_unique<client_log>(max_requests);
    auto svc = make_service(t, log.get());
    svc.start();
    std::mt19937_64 rng{7};
    std::exponential_distribution<double> gap{rate};
    const auto start = clock_type::now();
    auto next = start;
    std::uint64_t sent = 0;
    while (next - start < std::chrono::duration<double>(seconds) && sent < max_requests) {
      std::this_thread::sleep_until(next);
      const std::uint64_t id = sent++;
      client_log* lg = log.get();
      const auto done = [lg,
                         id](conveyor::outcome<std::pair<request, std::uint64_t>>&& o) noexcept {
        if (o) {
          lg->latency_ns.push_back(conveyor::now_ns() - o->first.sent_ns);
          lg->served.fetch_add(1, std::memory_order_relaxed);
          if (o->second != id * 2 + 1) lg->wrong.fetch_add(1, std::memory_order_relaxed);
        } else {
          try {
            (void)o.value();
          } catch (const conveyor::stage_error&) {
            lg->failed.fetch_add(1, std::memory_order_relaxed);
          } catch (const conveyor::deadline_error&) {
            lg->expired.fetch_add(1, std::memory_order_relaxed);
            lg->expired_ids[id].store(1, std::memory_order_relaxed);
          } catch (...) {
            lg->other.fetch_add(1, std::memory_order_relaxed);
          }
        }
        lg->settled.fetch_add(1, std::memory_order_release);
      };
      const request r{id, conveyor::now_ns()};
      if (is_tight(t, id))
        svc.submit(r, tight_deadline, done);
      else
        svc.submit(r, done);
      next +=
          std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(gap(rng)));
    }
    const double offered_s = std::chrono::duration<double>(clock_type::now() - start).count();
    while (log->settled.load(std::memory_order_acquire) < sent) std::this_thread::sleep_for(1ms);
    const double elapsed = std::chrono::duration<double>(clock_type::now() - start).count();
    const conveyor::report rep = svc.stop(conveyor::stop_mode::drain);
    // An expired request that the model stage worked on would be work after the check
    // (the model is the last stage: a request it works on is served).
    std::uint64_t expired_reached_model = 0, want_failed = 0;
    for (std::uint64_t id = 0; id < sent; ++id) {
      want_failed += is_poisoned(t, id) ? 1 : 0;
      if (log->expired_ids[id].load(std::memory_order_relaxed) != 0 &&
          log->modeled[id].load(std::memory_order_relaxed) != 0)
        ++expired_reached_model;
    }
    const std::uint64_t served = log->served.load(), failed = log->failed.load(),
                        expired = log->expired.load();
    if (served + failed + expired != sent || log->other.load() != 0 || log->wrong.load() != 0 ||
        failed != want_failed || rep.failed != failed || rep.expired != expired ||
        expired_reached_model != 0) {
      state.SkipWithError("requests lost, answers wrong, or expired requests reached the model");
      break;
    }
    state.counters["capacity_per_s"] = cap;
    state.counters["offered_per_s"] = static_cast<double>(sent) / offered_s;
    state.counters["served_per_s"] = static_cast<double>(served) / elapsed;
    state.counters["p50_ms"] = percentile_ms(log->latency_ns, 50);
    state.counters["p95_ms"] = percentile_ms(log->latency_ns, 95);
    state.counters["p99_ms"] = percentile_ms(log->latency_ns, 99);
    state.counters["failed"] = static_cast<double>(failed);
    state.counters["expired"] = static_cast<double>(expired);
    state.counters["expired_reached_model"] = static_cast<double>(expired_reached_model);
  }
}

BENCHMARK_CAPTURE(serving, clean, traffic::clean)
    ->Name("serving/clean")
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(serving, poisoned, traffic::poisoned)
    ->Name("serving/poisoned:1pct")
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(serving, deadlines, traffic::deadlines)
    ->Name("serving/deadlines:5pct")
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
