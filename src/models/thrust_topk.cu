// thrust_topk (see conveyor_models/thrust_topk.hpp): topk_rows_by_sort on the CUDA
// backend, with par_nosync and an arena allocator so that run() only enqueues.
#include "conveyor_models/thrust_topk.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>
#include <thrust/system/cuda/execution_policy.h>

#include "conveyor/base/config.hpp"
#include "conveyor/runtime/cuda/check.hpp"
#include "conveyor_models/topk_by_sort.hpp"

namespace conveyor_models {
namespace {

constexpr std::size_t arena_align = 256;  // what cudaMalloc gives; CUB asks for it too

std::size_t round_up(std::size_t n) { return (n + arena_align - 1) / arena_align * arena_align; }

// Thrust's temporary storage. Sizing mode (no arena yet): real cudaMalloc / cudaFree,
// allowed in the constructor, recording the most bytes live at once (rounded as the
// arena rounds them). Arena mode: a stack over memory allocated before the run, reset
// when nothing is live; a request that does not fit throws instead of allocating.
struct arena {
  std::byte* base = nullptr;
  std::size_t size = 0;
  std::size_t top = 0;  // sizing mode: bytes live now
  std::size_t live = 0;
  std::size_t peak = 0;

  char* allocate(std::size_t n) {
    const std::size_t need = round_up(std::max<std::size_t>(n, 1));
    if (base == nullptr) {  // sizing
      void* p = nullptr;
      CONVEYOR_CUDA_TRY(cudaMalloc(&p, need));
      top += need;
      ++live;
      peak = std::max(peak, top);
      return static_cast<char*>(p);
    }
    CONVEYOR_EXPECTS(top + need <= size,
                     "thrust_topk: Thrust asked for " + std::to_string(n) +
                         " bytes of temporary storage with " + std::to_string(size - top) +
                         " of the " + std::to_string(size) +
                         "-byte arena left; this call's shape needs more than the "
                         "constructor's sizing run (max_rows) did");
    char* p = reinterpret_cast<char*>(base + top);
    top += need;
    ++live;
    peak = std::max(peak, top);
    return p;
  }

  void deallocate(char* p, std::size_t n) noexcept {
    if (base == nullptr) {
      CONVEYOR_CUDA_LOG(cudaFree(p));
      top -= round_up(std::max<std::size_t>(n, 1));
    }
    // Arena mode: the stack empties when the last block goes (Thrust frees a call's
    // blocks before it returns); the memory is reused in stream order.
    if (--live == 0) top = 0;
  }
};

// The allocator Thrust's policy copies: a handle to the arena.
struct arena_allocator {
  using value_type = char;
  arena* a;
  char* allocate(std::ptrdiff_t n) { return a->allocate(static_cast<std::size_t>(n)); }
  void deallocate(char* p, std::size_t n) noexcept { a->deallocate(p, n); }
};

}  // namespace

struct thrust_topk::state {
  explicit state(std::size_t n)
      : scores(n, "thrust_topk scores"), index(n, "thrust_topk index"), row(n, "thrust_topk row") {}
  conveyor::cuda::device_buffer<float> scores;
  conveyor::cuda::device_buffer<std::uint32_t> index;
  conveyor::cuda::device_buffer<std::uint32_t> row;
  conveyor::cuda::device_buffer<std::byte> arena_memory{0, "thrust_topk arena"};
  arena temp;

  topk_scratch scratch() { return {scores.data(), index.data(), row.data()}; }
};

thrust_topk::thrust_topk(std::size_t max_rows, std::size_t cols, std::size_t k)
    : max_rows_(max_rows), cols_(cols), k_(k) {
  CONVEYOR_EXPECTS(max_rows >= 1 && cols >= 1, "thrust_topk: max_rows and cols must be >= 1");
  CONVEYOR_EXPECTS(k >= 1 && k <= cols, "thrust_topk: k must be in [1, cols]");
  CONVEYOR_EXPECTS(max_rows <= std::numeric_limits<std::uint32_t>::max() / cols,
                   "thrust_topk: max_rows * cols must be below 2^32 (32-bit indices)");
  s_ = std::make_unique<state>(max_rows * cols);
  // The sizing run, on a stream of our own over the scratch's own (zeroed) scores: what
  // the largest call asks Thrust for, then that much arena and a margin.
  cudaStream_t sizing = nullptr;
  CONVEYOR_CUDA_TRY(cudaStreamCreateWithFlags(&sizing, cudaStreamNonBlocking));
  try {
    const std::size_t n = max_rows * cols;
    CONVEYOR_CUDA_TRY(cudaMemsetAsync(s_->row.data(), 0, n * sizeof(std::uint32_t), sizing));
    conveyor::cuda::device_buffer<std::uint32_t> out(max_rows * k, "thrust_topk sizing out");
    topk_rows_by_sort(thrust::cuda::par_nosync(arena_allocator{&s_->temp}).on(sizing),
                      reinterpret_cast<const float*>(s_->row.data()), max_rows, cols, k,
                      s_->scratch(), out.data(), nullptr);
    CONVEYOR_CUDA_TRY(cudaStreamSynchronize(sizing));
  } catch (...) {
    CONVEYOR_CUDA_LOG(cudaStreamDestroy(sizing));
    throw;
  }
  CONVEYOR_CUDA_TRY(cudaStreamDestroy(sizing));
  const std::size_t bytes = s_->temp.peak + s_->temp.peak / 4 + 4 * arena_align;
  s_->arena_memory = conveyor::cuda::device_buffer<std::byte>(bytes, "thrust_topk arena");
  s_->temp = arena{s_->arena_memory.data(), bytes, 0, 0, 0};
}

thrust_topk::~thrust_topk() = default;
thrust_topk::thrust_topk(thrust_topk&&) noexcept = default;
thrust_topk& thrust_topk::operator=(thrust_topk&&) noexcept = default;

std::size_t thrust_topk::arena_bytes() const noexcept { return s_ ? s_->temp.size : 0; }
std::size_t thrust_topk::arena_peak_bytes() const noexcept { return s_ ? s_->temp.peak : 0; }

void thrust_topk::run(conveyor::cuda::device_span<const float> scores, std::size_t rows,
                      conveyor::cuda::device_span<std::uint32_t> index,
                      conveyor::cuda::device_span<float> top_scores, conveyor::cuda::stream_ref s) {
  CONVEYOR_EXPECTS(s_ != nullptr, "thrust_topk::run: a moved-from thrust_topk");
  CONVEYOR_EXPECTS(rows <= max_rows_, "thrust_topk::run: " + std::to_string(rows) +
                                          " rows, above max_rows " + std::to_string(max_rows_));
  CONVEYOR_EXPECTS(scores.size() >= rows * cols_ && index.size() >= rows * k_ &&
                       (top_scores.empty() || top_scores.size() >= rows * k_),
                   "thrust_topk::run: need rows * cols scores and rows * k outputs");
  topk_rows_by_sort(thrust::cuda::par_nosync(arena_allocator{&s_->temp}).on(s.native()),
                    scores.data(), rows, cols_, k_, s_->scratch(), index.data(),
                    top_scores.empty() ? nullptr : top_scores.data());
  // Thrust checks its own launches and throws thrust::system_error; a launch error it
  // let through is caught here, before the caller records events behind it.
  CONVEYOR_CUDA_TRY(cudaPeekAtLastError());
}

}  // namespace conveyor_models
