// latency_histogram: bucket layout, percentiles against exact nearest-rank percentiles of
// generated data within the documented relative error, concurrent conservation, merge,
// reset.
#include "conveyor/counters/histogram.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

using conveyor::metrics::latency_histogram;
namespace t = conveyor::test;

namespace {

// Nearest-rank percentile of sorted data for an integral p, in integer arithmetic.
std::int64_t exact_percentile(const std::vector<std::int64_t>& sorted, int p) {
  const std::size_t n = sorted.size();
  if (p == 0) return sorted.front();
  const std::size_t rank = (static_cast<std::size_t>(p) * n + 99) / 100;  // ceil(p*n/100)
  return sorted[std::max<std::size_t>(rank, 1) - 1];
}

void check_against_exact(std::vector<std::int64_t> data) {
  latency_histogram h;
  for (const auto v : data) h.record(v);
  std::sort(data.begin(), data.end());
  long double sum = 0;
  for (const auto v : data) sum += static_cast<long double>(v);

  REQUIRE(h.count() == data.size());
  REQUIRE(h.min() == data.front());
  REQUIRE(h.max() == data.back());
  REQUIRE(h.mean() == Approx(static_cast<double>(sum / data.size())).epsilon(1e-12));
  for (const int p : {0, 1, 10, 25, 50, 75, 90, 95, 99, 100}) {
    const std::int64_t exact = exact_percentile(data, p);
    const std::int64_t got = h.percentile(p);
    CAPTURE(p, exact, got, data.size());
    const double err = std::abs(static_cast<double>(got) - static_cast<double>(exact));
    REQUIRE(err <= latency_histogram::relative_error * static_cast<double>(exact));
  }
  REQUIRE(h.percentile(0) == h.min());
  REQUIRE(h.percentile(100) == h.max());
}

}  // namespace

TEST_CASE("latency_histogram: buckets tile 0 .. 2^63 with width <= lower / 64") {
  static_assert(noexcept(std::declval<latency_histogram&>().record(1)));
  for (std::size_t i = 0; i + 1 < latency_histogram::bucket_count; ++i) {
    CAPTURE(i);
    REQUIRE(latency_histogram::bucket_lower(i + 1) ==
            latency_histogram::bucket_lower(i) + latency_histogram::bucket_width(i));
    if (i >= latency_histogram::exact_limit)
      REQUIRE(latency_histogram::bucket_width(i) * 64 <= latency_histogram::bucket_lower(i));
  }
  const std::size_t last = latency_histogram::bucket_count - 1;
  REQUIRE(latency_histogram::bucket_lower(last) + (latency_histogram::bucket_width(last) - 1) ==
          latency_histogram::max_value);

  std::mt19937_64 rng{42};
  for (int k = 0; k < 100000; ++k) {
    const std::uint64_t v = rng() >> (1 + rng() % 63);  // every magnitude
    const std::size_t i = latency_histogram::bucket_index(v);
    CAPTURE(v, i);
    REQUIRE(i < latency_histogram::bucket_count);
    REQUIRE(latency_histogram::bucket_lower(i) <= v);
    REQUIRE(v - latency_histogram::bucket_lower(i) < latency_histogram::bucket_width(i));
  }
  for (std::uint64_t v = 0; v < 4096; ++v) {
    const std::size_t i = latency_histogram::bucket_index(v);
    REQUIRE(latency_histogram::bucket_lower(i) <= v);
    REQUIRE(v - latency_histogram::bucket_lower(i) < latency_histogram::bucket_width(i));
  }
}

TEST_CASE("latency_histogram: empty histogram reports zeros") {
  latency_histogram h;
  REQUIRE(h.count() == 0);
  REQUIRE(h.min() == 0);
  REQUIRE(h.max() == 0);
  REQUIRE(h.mean() == 0.0);
  REQUIRE(h.percentile(50) == 0);
}

TEST_CASE("latency_histogram: percentiles within relative error of exact ones") {
  std::mt19937_64 rng{7};
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 2, 3, 10, 999, 100000);
  const std::string shape =
      GENERATE(as<std::string>{}, "uniform", "lognormal", "constant", "small", "wide", "hours");
  CAPTURE(n, shape);
  std::vector<std::int64_t> data(n);
  if (shape == "uniform") {
    std::uniform_int_distribution<std::int64_t> d{1'000, 10'000'000};  // 1 us .. 10 ms
    for (auto& v : data) v = d(rng);
  } else if (shape == "lognormal") {
    std::lognormal_distribution<double> d{std::log(1e6), 1.0};  // median 1 ms
    for (auto& v : data) v = static_cast<std::int64_t>(d(rng));
  } else if (shape == "constant") {
    for (auto& v : data) v = 12'345'678;
  } else if (shape == "small") {  // the exact region and its edge
    std::uniform_int_distribution<std::int64_t> d{0, 300};
    for (auto& v : data) v = d(rng);
  } else if (shape == "wide") {  // 1 ns .. 2^45 ns (~10 h), log-uniform; sum fits in 64 bits
    for (auto& v : data) v = static_cast<std::int64_t>(rng() >> (19 + rng() % 45));
  } else {  // hours
    std::uniform_int_distribution<std::int64_t> d{3'600'000'000'000, 4 * 3'600'000'000'000};
    for (auto& v : data) v = d(rng);
  }
  check_against_exact(std::move(data));
}

TEST_CASE("latency_histogram: a single value is reported exactly") {
  const std::int64_t v = GENERATE(as<std::int64_t>{}, 0, 1, 127, 128, 129, 1'000'003,
                                  std::numeric_limits<std::int64_t>::max());
  latency_histogram h;
  h.record(v);
  for (const double p : {0.0, 0.001, 50.0, 99.99, 100.0}) REQUIRE(h.percentile(p) == v);
  REQUIRE(h.min() == v);
  REQUIRE(h.max() == v);
}

TEST_CASE("latency_histogram: negative values count as zero") {
  latency_histogram h;
  h.record(-5);
  h.record(10);
  REQUIRE(h.min() == 0);
  REQUIRE(h.count() == 2);
  REQUIRE(h.sum() == 10);
}

TEST_CASE("latency_histogram: 4 concurrent writers conserve count, sum, min and max") {
  latency_histogram h;
  const std::uint64_t per_thread = t::scaled(500'000);
  constexpr int threads = 4;
  std::vector<std::thread> ts;
  for (int k = 0; k < threads; ++k) {
    ts.emplace_back([&h, k, per_thread] {
      for (std::uint64_t i = 0; i < per_thread; ++i)
        h.record(static_cast<std::int64_t>((i * 2654435761u + k) % 50'000'000 + 1));
    });
  }
  for (auto& th : ts) th.join();

  std::uint64_t sum = 0;
  std::uint64_t mx = 0;
  std::uint64_t mn = ~std::uint64_t{0};
  latency_histogram serial;
  for (int k = 0; k < threads; ++k) {
    for (std::uint64_t i = 0; i < per_thread; ++i) {
      const std::uint64_t v = (i * 2654435761u + k) % 50'000'000 + 1;
      sum += v;
      mx = std::max(mx, v);
      mn = std::min(mn, v);
      serial.record(static_cast<std::int64_t>(v));
    }
  }
  REQUIRE(h.count() == threads * per_thread);
  REQUIRE(h.sum() == sum);
  REQUIRE(static_cast<std::uint64_t>(h.max()) == mx);
  REQUIRE(static_cast<std::uint64_t>(h.min()) == mn);
  for (const double p : {1.0, 50.0, 95.0, 99.0, 99.9})
    REQUIRE(h.percentile(p) == serial.percentile(p));  // same buckets, same answers
}

TEST_CASE("latency_histogram: merge equals recording both, reset empties") {
  std::mt19937_64 rng{3};
  std::lognormal_distribution<double> d{std::log(5e5), 1.5};
  latency_histogram a, b, both;
  for (int i = 0; i < 20000; ++i) {
    const auto v = static_cast<std::int64_t>(d(rng));
    (i % 3 == 0 ? a : b).record(v);
    both.record(v);
  }
  a.merge(b);
  REQUIRE(a.count() == both.count());
  REQUIRE(a.sum() == both.sum());
  REQUIRE(a.min() == both.min());
  REQUIRE(a.max() == both.max());
  for (const double p : {0.0, 10.0, 50.0, 90.0, 99.0, 100.0})
    REQUIRE(a.percentile(p) == both.percentile(p));

  a.reset();
  REQUIRE(a.count() == 0);
  REQUIRE(a.percentile(50) == 0);
  a.record(77);
  REQUIRE(a.min() == 77);
  REQUIRE(a.max() == 77);
}

TEST_CASE("latency_histogram: a weighted record stands for that many equal records") {
  std::mt19937_64 rng{5};
  std::lognormal_distribution<double> d{std::log(2e5), 1.2};
  std::uniform_int_distribution<std::uint64_t> w{1, 64};
  latency_histogram weighted, repeated;
  for (int i = 0; i < 5000; ++i) {
    const auto v = static_cast<std::int64_t>(d(rng));
    const std::uint64_t n = w(rng);
    weighted.record(v, n);
    for (std::uint64_t k = 0; k < n; ++k) repeated.record(v);
  }
  REQUIRE(weighted.count() == repeated.count());
  REQUIRE(weighted.sum() == repeated.sum());
  REQUIRE(weighted.min() == repeated.min());
  REQUIRE(weighted.max() == repeated.max());
  for (const double p : {0.0, 1.0, 25.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0}) {
    CAPTURE(p);
    REQUIRE(weighted.percentile(p) == repeated.percentile(p));
  }
}
