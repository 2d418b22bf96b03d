// topk_rows_by_sort, the Thrust top-k the GPU lanes run (conveyor_models/thrust_topk.hpp),
// through Thrust's CPP backend: the same algorithm against topk_rows_ref, ties included.
// Built where the CUDA toolkit (and so Thrust) is found; needs no GPU.
#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "conveyor_models/reference.hpp"
#include "conveyor_models/topk_by_sort.hpp"

namespace cm = conveyor_models;

TEST_CASE("thrust top-k (CPP backend): the reference's order, ties by index") {
  const std::size_t cols =
      GENERATE(std::size_t{1}, std::size_t{10}, std::size_t{33}, std::size_t{1000});
  const std::size_t rows = GENERATE(std::size_t{1}, std::size_t{7}, std::size_t{64});
  CAPTURE(cols, rows);
  std::mt19937 rng(static_cast<std::uint32_t>(cols * 131 + rows));
  // Few distinct values, so that most rows hold ties.
  std::uniform_int_distribution<int> level(-8, 8);
  std::vector<float> scores(rows * cols);
  for (float& x : scores) x = static_cast<float>(level(rng)) * 0.25f;
  for (std::size_t c = 0; c < cols; ++c) scores[c] = 1.0f;  // row 0: all tied

  std::vector<float> s(rows * cols);
  std::vector<std::uint32_t> idx(rows * cols), row(rows * cols);
  for (std::size_t k : {std::size_t{1}, std::min<std::size_t>(5, cols), cols}) {
    CAPTURE(k);
    std::vector<std::uint32_t> got(rows * k, 0xdeadbeef), want(rows * k);
    std::vector<float> got_scores(rows * k, -1e30f);
    cm::topk_rows_by_sort(thrust::cpp::par, scores.data(), rows, cols, k,
                          {s.data(), idx.data(), row.data()}, got.data(), got_scores.data());
    cm::topk_rows_ref(scores, rows, cols, k, want);
    REQUIRE(got == want);
    for (std::size_t j = 0; j < rows * k; ++j)
      REQUIRE(got_scores[j] == scores[(j / k) * cols + got[j]]);
    // Indices only: the same indices.
    std::vector<std::uint32_t> only(rows * k, 0xdeadbeef);
    cm::topk_rows_by_sort(thrust::cpp::par, scores.data(), rows, cols, k,
                          {s.data(), idx.data(), row.data()}, only.data(), nullptr);
    REQUIRE(only == want);
  }
}

TEST_CASE("thrust top-k (CPP backend): no rows writes nothing") {
  std::vector<std::uint32_t> out(4, 7);
  cm::topk_rows_by_sort(thrust::cpp::par, static_cast<const float*>(nullptr), 0, 10, 1,
                        cm::topk_scratch{}, out.data(), nullptr);
  REQUIRE(out == std::vector<std::uint32_t>(4, 7));
}
