// conveyor_models/thrust_topk.hpp: per-row top-k on a GPU lane's stream, written with
// Thrust, that keeps the lane asynchronous.
//
//   conveyor_models::thrust_topk topk{max_rows, classes, 5};     // per lane, before the run
//   [&](conveyor::lane_batch<R, float, std::uint32_t>& l) {      // the gpu segment's compute
//     model.forward(l.in, logits[l.lane], l.items, l.stream, l.lane);
//     topk[l.lane].run(logits[l.lane], l.items, l.out, {}, l.stream);   // only enqueues
//     return l.items * 5; }
//
// Thrust and the lane's stream (the rule the GPU segment's header points to):
// - Run algorithms with thrust::cuda::par_nosync(alloc).on(l.stream). The default policy
//   (thrust::device) and plain .on(stream) synchronize after each algorithm; par_nosync
//   does not, where correctness allows.
// - Give it an allocator over memory allocated before the run. Algorithms that need
//   temporary storage (sort, reduce_by_key, unique, copy_if, ...) otherwise get it from
//   cudaMalloc / cudaFree, and cudaFree waits for the whole device: every lane stalls.
// - Algorithms that return a value to the host (reduce, count, find, min_element,
//   inner_product, equal, ...) wait for the stream whatever the policy: in a compute
//   functor, use their device-side forms (reduce_by_key, a transform, or CUB's
//   DeviceReduce into device memory) and read the result in stage-out.
// A compute functor that waits anyway shows in the report: its lanes' "enqueue ms" as long
// as their "compute ms", and the verdict says so first.
//
// thrust_topk allocates its scratch and a temporary-storage arena on the current device at
// construction, sized by running the algorithm once for max_rows under an allocator that
// records what Thrust asks for; run() only enqueues. Temporary storage is handed out
// stack-wise and reused by the next call, which stream order makes safe on one stream.
// Results: the order of kernels::topk_rows (by score, ties by index).
// Thread-safety: one instance per lane; run() from one thread at a time, with one stream
// (the arena is reused in stream order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "conveyor/runtime/cuda/memory.hpp"
#include "conveyor/runtime/cuda/stream.hpp"

namespace conveyor_models {

class thrust_topk {
 public:
  // Scratch for rows * cols scores, for any rows <= max_rows. @note allocates on the
  // current device and synchronizes it (the sizing run): make it before the run.
  // @throws conveyor::config_error on bad sizes; conveyor::cuda_error.
  thrust_topk(std::size_t max_rows, std::size_t cols, std::size_t k);
  ~thrust_topk();
  thrust_topk(thrust_topk&&) noexcept;
  thrust_topk& operator=(thrust_topk&&) noexcept;

  // Enqueues on s: index[r * k + j] (and top_scores[r * k + j] when top_scores is not
  // empty) = the j-th best column of row r, for r < rows. Returns at once.
  // @throws conveyor::config_error when rows or a span is out of range;
  //         conveyor::cuda_error.
  void run(conveyor::cuda::device_span<const float> scores, std::size_t rows,
           conveyor::cuda::device_span<std::uint32_t> index,
           conveyor::cuda::device_span<float> top_scores, conveyor::cuda::stream_ref s);

  std::size_t max_rows() const noexcept { return max_rows_; }
  std::size_t cols() const noexcept { return cols_; }
  std::size_t k() const noexcept { return k_; }
  // The temporary-storage arena's size, and the most of it one call has used.
  std::size_t arena_bytes() const noexcept;
  std::size_t arena_peak_bytes() const noexcept;

 private:
  struct state;
  std::size_t max_rows_, cols_, k_;
  std::unique_ptr<state> s_;
};

}  // namespace conveyor_models
