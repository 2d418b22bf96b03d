// online_serving: conveyor as a long-lived service. Requests arrive one at a time (a
// Poisson process: exponential gaps at a given mean rate), each is submit()ted with a
// callback that receives its response; a dynamic batcher groups whatever has arrived —
// up to a maximum size, or after a maximum delay since the batch's first request — and
// the model classifies the batch. At the end: P50 / P95 / P99 latency as the clients saw
// it (submit -> callback).
// Traffic is not all clean: 1% of the requests are malformed (the prepare stage throws on
// them) and 2% carry a deadline shorter than the batcher's delay. A malformed request
// fails alone (its callback gets the stage_error; error_policy::isolate is a service's
// default), a request whose deadline passes is dropped before the next stage works on it
// (deadline_error), and every other request is served and spot-checked.
//
//   conveyor::input<request>() | prepare x2 | batch(32).max_delay(2 ms) | MLP (gpu x2 lanes) | unbatch
//   svc.start();  warm_up(svc, 32);   // batches of every size, twice, results dropped
//   svc.submit(req, [&](conveyor::outcome<response> r) noexcept { ... });
//   svc.submit(req, 100us, [&](conveyor::outcome<response> r) noexcept { ... });  // a deadline
//   svc.stop(conveyor::stop_mode::drain);
// (svc.submit(req) returns a std::future instead, at the cost of allocations per request.)
//
// With a GPU the model is conveyor_models::mlp (cuBLAS); without one the host runtime
// runs conveyor_models::cpu_mlp, and the program says so.
//
//   ./build/examples/online_serving [requests_per_second] [seconds] [max_delay_us]
//                                   [p99_target_us]
//
// With p99_target_us > 0 the batcher holds a latency target instead of the fixed delay:
// batch(max).target_p99(p99_target_us) chooses its delay and batch size while it runs, and
// the report shows what it chose and whether the target held.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "conveyor/pipeline.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor_models/model.hpp"
#include "conveyor_models/reference.hpp"

namespace {

namespace cm = conveyor_models;
using clock_type = std::chrono::steady_clock;

// Each request carries the time it was sent, and its response carries it back.
struct request {
  std::uint64_t id;
  clock_type::time_point sent;
};

// Which requests are malformed (1 in 100) and which carry a tight deadline (2 in 100):
// spread by a hash of the id, so the callback can tell from the id alone.
std::uint64_t spread(std::uint64_t id) {
  std::uint64_t h = id * 0x9E3779B97F4A7C15ull;
  return (h ^ (h >> 29)) % 100;
}
constexpr std::uint64_t warm_up_ids = std::uint64_t{1} << 40;  // clean, after every client's
bool malformed(std::uint64_t id) { return id < warm_up_ids && spread(id) == 0; }
bool tight(std::uint64_t id) { return id < warm_up_ids && (spread(id) == 1 || spread(id) == 2); }
constexpr std::chrono::microseconds tight_deadline{100};
struct tensor {
  std::uint64_t id;
  clock_type::time_point sent;
  std::vector<std::uint8_t> px;
};
struct response {
  std::uint64_t id;
  clock_type::time_point sent;
  std::uint32_t cls;
};

// What the clients saw, written by the responses' callbacks: on the pipeline's result
// thread for served requests, on the thread of the stage that failed on a request or
// found it expired, on the thread in stop() for requests that did not complete. Those
// threads take turns on it under a mutex.
struct client_log {
  std::mutex m;
  std::vector<double> latency_ms;  // submit -> callback, per served request
  std::vector<response> spot;      // a few responses, checked against the CPU reference after
  std::uint64_t served = 0, failed_alone = 0, expired = 0, unexpected = 0;

  void record(std::uint64_t id, conveyor::outcome<response>& r) noexcept {
    const std::lock_guard lock{m};
    if (!r) {
      try {
        (void)r.value();
      } catch (const conveyor::stage_error& e) {
        if (malformed(id) && e.stage() == "prepare") {
          ++failed_alone;
          return;
        }
      } catch (const conveyor::deadline_error&) {
        if (tight(id)) {
          ++expired;
          return;
        }
      } catch (...) {
      }
      ++unexpected;
      return;
    }
    if (malformed(id)) {
      ++unexpected;
      return;
    }
    ++served;
    // Reserved up front for every request the run can send: no allocation here.
    latency_ms.push_back(
        std::chrono::duration<double, std::milli>(clock_type::now() - r->sent).count());
    if (r->id % 97 == 0 && spot.size() < spot.capacity()) spot.push_back(*r);
  }
};

// Before the clients come: bursts of every batch size from 1 to max_batch, twice (the
// lanes take turns), each waited for, their results dropped: the first batches of a
// service pay for the first use of its GPU path. Without this, on an H100 the requests of
// the first ~100 ms waited 60-180 ms (client P99 72-148 ms at 20000 req/s; with it 2.6 ms).
// Which first use costs it was not isolated; not CUDA's lazy module loading (EAGER did not
// help). Returns the requests sent.
template <class Service>
std::uint64_t warm_up(Service& svc, std::size_t max_batch) {
  std::atomic<std::uint64_t> done{0};
  std::uint64_t sent = 0;
  for (int round = 0; round < 2; ++round)
    for (std::size_t k = 1; k <= max_batch; ++k) {
      for (std::size_t i = 0; i < k; ++i, ++sent)  // ids after every client's
        svc.submit(request{warm_up_ids + sent, clock_type::now()},
                   [&done](conveyor::outcome<response>) noexcept {
                     done.fetch_add(1, std::memory_order_relaxed);  // only counted
                   });
      while (done.load(std::memory_order_relaxed) < sent) std::this_thread::yield();
    }
  return sent;
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0.0;
  const auto k = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

template <class R>
int serve(double rate, double seconds, std::chrono::microseconds max_delay,
          std::chrono::microseconds p99_target, cm::mlp_options o, std::size_t max_batch,
          std::size_t lanes) {
  const std::size_t n = o.shape.input;
  o.lanes = lanes;
  o.max_items = max_batch;
  cm::model_t<R> model{o};
  const cm::reference_mlp check{cm::make_weights(o.shape, o.seed), o.prec};

  auto segment = conveyor::gpu<R, std::uint8_t, std::uint32_t>(
      {.lanes = lanes,
       .slots_per_lane = 2,
       .in_elems = max_batch * n,
       .out_elems = max_batch,
       .name = "mlp"},
      [n](std::vector<tensor>& b, typename R::template pinned_span<std::uint8_t> dst) {
        for (std::size_t i = 0; i < b.size(); ++i)
          dst.write_at(i * n, b[i].px);  // checked: throws rather than overrun the slot
        return b.size() * n;
      },
      [&model](conveyor::lane_batch<R, std::uint8_t, std::uint32_t>& l) {
        model.classify(l.in, l.out, l.items, l.stream, l.lane);
        return l.items;
      },
      [](std::vector<tensor>&& b, typename R::template pinned_span<const std::uint32_t> cls) {
        std::vector<response> out;
        out.reserve(b.size());
        for (std::size_t i = 0; i < b.size(); ++i) out.push_back({b[i].id, b[i].sent, cls[i]});
        return out;
      });
  segment.streams(cm::lane_streams<R>(model));
  conveyor::pipeline svc{
      conveyor::input<request>() |
      conveyor::map([n](request r) {  // decode: the request's pixels
        if (malformed(r.id))
          throw std::invalid_argument("request " + std::to_string(r.id) + ": malformed image");
        tensor t{r.id, r.sent, std::vector<std::uint8_t>(n)};
        cm::make_pixels(r.id, t.px);
        return t;
      })
          .workers(2)
          .ordered()
          .name("prepare") |
      (p99_target.count() > 0 ? conveyor::batch(max_batch).target_p99(p99_target)
                              : conveyor::batch(max_batch).max_delay(max_delay)) |
      std::move(segment) | conveyor::unbatch()};

  // Room for every request the run can send: the arrivals are capped at 4x the mean.
  const auto max_requests = static_cast<std::size_t>(4 * rate * seconds) + 64;
  client_log log;
  log.latency_ms.reserve(max_requests);
  log.spot.reserve(max_requests / 97 + 1);
  svc.start();
  const std::uint64_t warm = warm_up(svc, max_batch);

  // Poisson arrivals: exponential gaps with mean 1 / rate, on an absolute schedule (a
  // late submit does not push the following arrivals back).
  std::mt19937_64 rng{2024};
  std::exponential_distribution<double> gap{rate};
  const auto start = clock_type::now();
  auto next = start;
  std::uint64_t sent = 0;
  while (next - start < std::chrono::duration<double>(seconds) && sent < max_requests) {
    std::this_thread::sleep_until(next);
    // The callback captures a pointer and the id: std::function keeps it without
    // allocating.
    const std::uint64_t id = sent++;
    const auto done = [&log, id](conveyor::outcome<response> r) noexcept { log.record(id, r); };
    if (tight(id))
      svc.submit(request{id, clock_type::now()}, tight_deadline, done);
    else
      svc.submit(request{id, clock_type::now()}, done);
    next +=
        std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(gap(rng)));
  }
  const conveyor::report r = svc.stop(conveyor::stop_mode::drain);
  const double elapsed = std::chrono::duration<double>(clock_type::now() - start).count();

  std::uint64_t wrong = 0;  // spot-check a few answers against the CPU reference
  {
    std::vector<std::uint8_t> px(n);
    std::vector<float> scratch(check.scratch_floats(1));
    for (const response& x : log.spot) {
      std::uint32_t want = 0;
      cm::make_pixels(x.id, px);
      check.classify(px, o.norm, std::span(&want, 1), 1, scratch);
      wrong += want != x.cls;
    }
  }
  std::vector<double>& latency_ms = log.latency_ms;

  std::printf("warm-up: %llu requests in bursts of 1 .. %zu, twice (not in the client figures)\n",
              static_cast<unsigned long long>(warm), max_batch);
  std::printf("offered %.0f req/s for %.1f s: %llu requests, %.0f req/s served\n", rate, seconds,
              static_cast<unsigned long long>(sent),
              static_cast<double>(r.completed - warm) / elapsed);
  std::printf(
      "served %llu; malformed: %llu failed alone (stage_error from 'prepare'); tight "
      "deadlines (%lld us): %llu expired; unexpected outcomes: %llu\n",
      static_cast<unsigned long long>(log.served),
      static_cast<unsigned long long>(log.failed_alone),
      static_cast<long long>(tight_deadline.count()), static_cast<unsigned long long>(log.expired),
      static_cast<unsigned long long>(log.unexpected));
  const std::string rule = p99_target.count() > 0
                               ? "P99 target " + std::to_string(p99_target.count()) + " us"
                               : "max delay " + std::to_string(max_delay.count()) + " us";
  std::printf(
      "dynamic batching (warm-up included): max %zu, %s; mean batch %.1f, "
      "%llu of %llu batches left on the delay\n",
      max_batch, rule.c_str(), r.batching ? r.batching->mean_size : 0.0,
      static_cast<unsigned long long>(r.batching ? r.batching->flushed_on_timeout : 0),
      static_cast<unsigned long long>(r.batching ? r.batching->batches : 0));
  std::printf("served latency (submit -> result):  P50 %.2f ms   P95 %.2f ms   P99 %.2f ms\n",
              percentile(latency_ms, 50), percentile(latency_ms, 95), percentile(latency_ms, 99));
  std::printf("spot checks against the CPU reference: %s\n\n",
              wrong == 0 ? "all equal" : "SOME DIFFER");
  std::cout << r;
  // Every request accounted for: served, failed alone (malformed ones, and only those),
  // or expired (tight ones only); the served answers right.
  std::uint64_t want_malformed = 0;
  for (std::uint64_t id = 0; id < sent; ++id) want_malformed += malformed(id) ? 1 : 0;
  const bool ok = log.unexpected == 0 && log.failed_alone == want_malformed &&
                  log.served + log.failed_alone + log.expired == sent &&
                  r.completed == warm + log.served && r.failed == log.failed_alone &&
                  r.expired == log.expired && wrong == 0;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const double rate = argc > 1 ? std::strtod(argv[1], nullptr) : 2000.0;
    const double seconds = argc > 2 ? std::strtod(argv[2], nullptr) : 2.0;
    const std::chrono::microseconds max_delay{argc > 3 ? std::strtoll(argv[3], nullptr, 10) : 2000};
    const std::chrono::microseconds p99_target{argc > 4 ? std::strtoll(argv[4], nullptr, 10) : 0};
    if (!(rate > 0) || !(seconds > 0) || max_delay.count() < 0 || p99_target.count() < 0) {
      std::fprintf(stderr,
                   "usage: online_serving [requests_per_second > 0] [seconds > 0] "
                   "[max_delay_us >= 0] [p99_target_us >= 0 (0: none, the fixed delay)]\n");
      return 2;
    }
    cm::mlp_options o;
#if CONVEYOR_HAS_CUDA
    if (conveyor::cuda::device_count() > 0) {
      std::printf("online_serving: runtime cuda (cuBLAS MLP)\n");
      o.shape = {.input = 784, .hidden = 1024, .layers = 4, .classes = 10};
      return serve<conveyor::cuda::runtime>(rate, seconds, max_delay, p99_target, o, 64, 2);
    }
    std::printf("online_serving: no CUDA device answers: running on the host runtime\n");
#else
    std::printf("online_serving: built without CUDA: running on the host runtime\n");
#endif
    o.shape = {.input = 256, .hidden = 128, .layers = 3, .classes = 10};
    return serve<conveyor::host::runtime>(rate, seconds, max_delay, p99_target, o, 32, 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "online_serving: %s\n", e.what());
    return 1;
  }
}
