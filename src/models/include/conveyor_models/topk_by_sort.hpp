// conveyor_models/topk_by_sort.hpp: per-row top-k (indices, and scores if wanted) written
// with Thrust over any execution policy, so that one algorithm runs on a lane's CUDA
// stream (thrust_topk.hpp) and on the host through Thrust's CPP backend (the tests'
// reference path, and the host runtime).
//
//   conveyor_models::topk_scratch t{scores_tmp, index_tmp, row_tmp};      // rows * cols each
//   conveyor_models::topk_rows_by_sort(thrust::cpp::par, scores, rows, cols, k, t,
//                                      out_index, out_scores);           // out_scores may be null
//
// Two stable sorts make a segmented one: all scores descending (carrying their flat
// index), then by row ascending (carrying score and index). Stability keeps each row's
// scores in descending order with ties by index, which is the order kernels::topk_rows
// and topk_rows_ref give; the first k of each row are its top-k. Scores must not be NaN.
// The policy decides where it runs and whether it synchronizes: see thrust_topk.hpp.
// Thread-safety: stateless; the scratch and outputs belong to one call at a time.
#pragma once

#include <thrust/copy.h>
#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CONVEYOR_MODELS_HD __host__ __device__
#else
#define CONVEYOR_MODELS_HD
#endif

namespace conveyor_models {

// Working memory for one call: rows * cols elements each, in the policy's memory.
struct topk_scratch {
  float* scores = nullptr;
  std::uint32_t* index = nullptr;
  std::uint32_t* row = nullptr;
};

namespace detail {

struct row_of {
  std::uint32_t cols;
  CONVEYOR_MODELS_HD std::uint32_t operator()(std::uint32_t flat) const { return flat / cols; }
};

// Output j (row j / k, rank j % k) from the row-sorted scratch.
struct pick_topk {
  const float* scores;
  const std::uint32_t* index;
  std::uint32_t cols, k;
  std::uint32_t* out_index;
  float* out_scores;  // null: indices only
  CONVEYOR_MODELS_HD void operator()(std::uint32_t j) const {
    const std::uint32_t r = j / k, from = r * cols + j % k;
    out_index[j] = index[from] - r * cols;
    if (out_scores != nullptr) out_scores[j] = scores[from];
  }
};

}  // namespace detail

// out_index[r * k + j] (and out_scores[r * k + j]) = the j-th best of row r of the
// row-major rows x cols scores. Needs 1 <= k <= cols and rows * cols < 2^32 (the caller
// checks: thrust_topk does).
template <class Policy>
void topk_rows_by_sort(Policy&& policy, const float* scores, std::size_t rows, std::size_t cols,
                       std::size_t k, topk_scratch t, std::uint32_t* out_index, float* out_scores) {
  const auto n = static_cast<std::uint32_t>(rows * cols);
  if (n == 0) return;
  thrust::copy(policy, scores, scores + n, t.scores);
  thrust::sequence(policy, t.index, t.index + n);
  thrust::stable_sort_by_key(policy, t.scores, t.scores + n, t.index, thrust::greater<float>());
  thrust::transform(policy, t.index, t.index + n, t.row,
                    detail::row_of{static_cast<std::uint32_t>(cols)});
  thrust::stable_sort_by_key(policy, t.row, t.row + n,
                             thrust::make_zip_iterator(t.scores, t.index));
  thrust::for_each_n(policy, thrust::counting_iterator<std::uint32_t>(0),
                     static_cast<std::uint32_t>(rows * k),
                     detail::pick_topk{t.scores, t.index, static_cast<std::uint32_t>(cols),
                                       static_cast<std::uint32_t>(k), out_index, out_scores});
}

}  // namespace conveyor_models
