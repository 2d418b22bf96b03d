// The cuBLAS MLP (see conveyor_models/mlp.hpp). Plain C++ against the CUDA runtime and
// cuBLAS; the kernels it launches live in kernels.cu.
#include "conveyor_models/mlp.hpp"

#include <algorithm>
#include <compare>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include "conveyor/base/config.hpp"
#include "conveyor/runtime/cuda/check.hpp"
#include "conveyor/runtime/cuda/cublas.hpp"
#include "conveyor/runtime/cuda/device.hpp"
#include "conveyor_models/graph_cache.hpp"
#include "conveyor_models/kernels.hpp"
#include "conveyor_models/thrust_topk.hpp"

namespace conveyor_models {
namespace {

cudaDataType storage_type(precision p) noexcept {
  switch (p) {
    case precision::fp16:
      return CUDA_R_16F;
    case precision::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

cublasComputeType_t compute_type(precision p) noexcept {
  return p == precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

bool is16(precision p) noexcept { return storage_bytes(p) == 2; }

// What a lane's graphs compute, on the lane's own buffers (x in; logits or labels out).
enum class graph_call { forward, classify };

struct destroy_exec {
  void operator()(cudaGraphExec_t exec) const noexcept {
    CONVEYOR_CUDA_ASSERT(cudaGraphExecDestroy(exec));  // an exec still running is freed after
  }
};

}  // namespace

struct mlp::lane_state {
  lane_state(const mlp_options& o, int dev, const std::vector<layer>& w)
      : device(dev),
        weights(&w),
        acc(o.max_items * o.shape.max_width(), "mlp accumulator"),
        act0(o.max_items * o.shape.max_width() * storage_bytes(o.prec), "mlp activations"),
        act1(o.max_items * o.shape.max_width() * storage_bytes(o.prec), "mlp activations"),
        x(o.max_items * o.shape.input, "mlp normalized input"),
        logits(o.max_items * o.shape.classes, "mlp logits"),
        labels(o.cuda_graphs ? o.max_items : 0, "mlp labels"),
        graphs(o.cuda_graphs ? o.graph_cache_capacity : 1) {
    if (o.labels == label_method::thrust) topk.emplace(o.max_items, o.shape.classes, 1);
  }

  ~lane_state() { drop_graphs(); }  // before the handle and buffers they use go
  lane_state(const lane_state&) = delete;
  lane_state& operator=(const lane_state&) = delete;

  void drop_graphs() noexcept { graphs.clear(); }

  int device;                                     // where its buffers, handle and graphs live
  const std::vector<layer>* weights;              // the model's weights on that device
  conveyor::cuda::device_buffer<float> acc;       // a GEMM's float output
  conveyor::cuda::device_buffer<std::byte> act0;  // activations at the storage precision
  conveyor::cuda::device_buffer<std::byte> act1;
  conveyor::cuda::device_buffer<float> x;               // classify: normalized input
  conveyor::cuda::device_buffer<float> logits;          // classify: logits before argmax
  conveyor::cuda::device_buffer<std::uint32_t> labels;  // graphs: classify's padded labels
  graph_cache<graph_call, cudaGraphExec_t, destroy_exec> graphs;
  std::optional<thrust_topk> topk;  // label_method::thrust: logits -> labels
  // Last: destroyed first, while the workspace and scratch it may use still exist.
  std::optional<conveyor::cuda::cublas_handle> blas;
};

mlp::mlp(const mlp_options& o) : options_(o) {
  validate(o.shape);
  CONVEYOR_EXPECTS(o.lanes >= 1 && o.lanes <= 64, "mlp: lanes must be in [1, 64]");
  CONVEYOR_EXPECTS(o.max_items >= 1 && o.max_items <= (std::size_t{1} << 20),
                   "mlp: max_items must be in [1, 2^20]; set it to the largest batch");
  CONVEYOR_EXPECTS(o.norm.stddev > 0.0f, "mlp: norm.stddev must be > 0");
  CONVEYOR_EXPECTS(!o.cuda_graphs || o.workspace_bytes > 0,
                   "mlp: cuda_graphs needs a cuBLAS workspace (workspace_bytes > 0) so that "
                   "capturing cuBLAS calls allocates nothing");
  CONVEYOR_EXPECTS(!o.cuda_graphs || o.graph_cache_capacity >= 1,
                   "mlp: cuda_graphs needs graph_cache_capacity >= 1 (graphs kept per lane; "
                   "2 x log2(max_items) + 2 holds every bucket of both calls)");

  host_weights_ = weights_of(o);  // trained (o.weights) or seeded
  const int dev = conveyor::cuda::current_device();
  const std::vector<layer>& w = weights_on(dev);
  lanes_.reserve(o.lanes);
  for (std::size_t l = 0; l < o.lanes; ++l) lanes_.push_back(make_lane(dev, w));
}

// The weights on device dev, uploaded there at its first use (the current device).
// Upload through pinned staging on a stream of our own: no pageable copy, no legacy
// default stream. @note synchronizes.
const std::vector<mlp::layer>& mlp::weights_on(int dev) {
  const std::lock_guard<std::mutex> lock(weights_mutex_);
  for (const auto& [d, layers] : weights_)
    if (d == dev) return *layers;
  const mlp_options& o = options_;
  const mlp_weights& w = host_weights_;
  std::size_t most_w = 0, most_b = 0;
  for (std::size_t l = 0; l < o.shape.layers; ++l) {
    most_w = std::max(most_w, w.w[l].size() * storage_bytes(o.prec));
    most_b = std::max(most_b, w.b[l].size());
  }
  conveyor::cuda::stream upload;
  conveyor::cuda::pinned_buffer<std::byte> w_staging(most_w, "mlp weight staging");
  conveyor::cuda::pinned_buffer<float> b_staging(most_b, "mlp bias staging");
  auto layers = std::make_unique<std::vector<layer>>();
  for (std::size_t l = 0; l < o.shape.layers; ++l) {
    layer ly{conveyor::cuda::device_buffer<std::byte>(w.w[l].size() * storage_bytes(o.prec),
                                                      "mlp weights"),
             conveyor::cuda::device_buffer<float>(w.b[l].size(), "mlp bias")};
    std::byte* dst = w_staging.data();
    if (is16(o.prec)) {
      for (float v : w.w[l]) {
        const std::uint16_t bits = o.prec == precision::fp16 ? to_fp16_bits(v) : to_bf16_bits(v);
        std::memcpy(dst, &bits, sizeof bits);
        dst += sizeof bits;
      }
    } else {
      std::memcpy(dst, w.w[l].data(), w.w[l].size() * sizeof(float));
    }
    std::memcpy(b_staging.data(), w.b[l].data(), w.b[l].size() * sizeof(float));
    copy_async(ly.w.span(), w_staging.span().subspan(0, ly.w.size()), upload);
    copy_async(ly.b.span(), b_staging.span().subspan(0, ly.b.size()), upload);
    upload.synchronize();  // the staging buffers are reused for the next layer
    layers->push_back(std::move(ly));
  }
  weights_.emplace_back(dev, std::move(layers));
  return *weights_.back().second;
}

// A lane's scratch on device dev (current). @note allocates, synchronizes.
std::unique_ptr<mlp::lane_state> mlp::make_lane(int dev, const std::vector<layer>& w) {
  auto lane = std::make_unique<lane_state>(options_, dev, w);
  // A graph pads its batch to a bucket and reads x's rows past the batch: they hold an
  // earlier batch's inputs, or these zeros, never uninitialized memory.
  if (options_.cuda_graphs) {
    conveyor::cuda::stream zero;
    memset_async(lane->x.span(), 0, zero);
    zero.synchronize();
  }
  return lane;
}

mlp::~mlp() = default;

void mlp::bind(std::size_t lane, conveyor::cuda::stream_ref s) {
  CONVEYOR_EXPECTS(lane < lanes_.size(),
                   "mlp: lane " + std::to_string(lane) + " but the model was built for " +
                       std::to_string(lanes_.size()) + " lanes; set mlp_options::lanes");
  if (const lane_state& current = *lanes_[lane]; current.blas && current.blas->bound_stream() == s)
    return;  // bound to s, on its device, already
  // On another device than its scratch (a gpu segment's lanes over several devices bind
  // on theirs): the lane's buffers and the weights are made there first.
  const int dev = conveyor::cuda::current_device();
  if (lanes_[lane]->device != dev) lanes_[lane] = make_lane(dev, weights_on(dev));
  lane_state& l = *lanes_[lane];
  l.drop_graphs();
  l.blas.reset();
  l.blas.emplace(s, options_.workspace_bytes);
  // cuBLAS's default math mode; TF32 comes from the compute type, per call.
  CONVEYOR_CUBLAS_TRY(cublasSetMathMode(l.blas->native(), CUBLAS_DEFAULT_MATH));
}

mlp::lane_state& mlp::lane_for(std::size_t lane, conveyor::cuda::stream_ref s) {
  bind(lane, s);
  return *lanes_[lane];
}

std::size_t mlp::graphs_cached(std::size_t lane) const {
  CONVEYOR_EXPECTS(lane < lanes_.size(), "mlp::graphs_cached: no such lane");
  return options_.cuda_graphs ? lanes_[lane]->graphs.size() : 0;
}

graph_cache_stats mlp::graph_stats() const noexcept {
  graph_cache_stats total;
  if (options_.cuda_graphs)
    for (const auto& l : lanes_) total += l->graphs.stats();
  return total;
}

void mlp::enqueue_forward(const float* in, float* out, std::size_t items, cudaStream_t s,
                          lane_state& l) {
  const mlp_shape& sh = options_.shape;
  const precision p = options_.prec;
  const cudaDataType ab = storage_type(p);
  const cublasComputeType_t ct = compute_type(p);
  const float alpha = 1.0f, beta = 0.0f;
  std::byte* act[2] = {l.act0.data(), l.act1.data()};
  const void* x = in;
  int next = 0;
  if (is16(p)) {  // the first layer reads 16-bit storage too
    kernels::to_storage16(in, reinterpret_cast<std::uint16_t*>(act[0]), items * sh.input, p, s);
    x = act[0];
    next = 1;
  }
  for (std::size_t i = 0; i < sh.layers; ++i) {
    const int k = static_cast<int>(sh.in_features(i)), n = static_cast<int>(sh.out_features(i));
    const int m = static_cast<int>(items);
    // Row-major activations X (items x k) are column-major X^T (k x items); row-major
    // W (n x k) is column-major W^T (k x n). acc^T (n x items) = W * X^T: op(A) = A^T.
    CONVEYOR_CUBLAS_TRY(cublasGemmEx(l.blas->native(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha,
                                     (*l.weights)[i].w.data(), ab, k, x, ab, k, &beta, l.acc.data(),
                                     CUDA_R_32F, n, ct, CUBLAS_GEMM_DEFAULT));
    const bool last = i + 1 == sh.layers;
    if (last) {
      kernels::bias_act(l.acc.data(), (*l.weights)[i].b.data(), items, sh.out_features(i), false,
                        out, precision::fp32, s);
    } else {
      kernels::bias_act(l.acc.data(), (*l.weights)[i].b.data(), items, sh.out_features(i), true,
                        act[next], p, s);
      x = act[next];
      next = 1 - next;
    }
  }
}

void mlp::enqueue_classify(const std::uint8_t* pixels, std::uint32_t* labels, std::size_t items,
                           cudaStream_t s, lane_state& l) {
  const mlp_shape& sh = options_.shape;
  kernels::normalize(pixels, l.x.data(), items * sh.input, options_.norm, s);
  enqueue_classify_normalized(l.x.data(), labels, items, s, l);
}

void mlp::enqueue_classify_normalized(const float* x, std::uint32_t* labels, std::size_t items,
                                      cudaStream_t s, lane_state& l) {
  enqueue_forward(x, l.logits.data(), items, s, l);
  kernels::argmax_rows(l.logits.data(), items, options_.shape.classes, labels, s);
}

// label_method::thrust: the lane's logits (items rows, forward's output) -> labels, with
// Thrust on s (par_nosync over the lane's own arena: only enqueues).
void mlp::thrust_labels(lane_state& l, device_span<std::uint32_t> labels, std::size_t items,
                        conveyor::cuda::stream_ref s) {
  l.topk->run(device_span<const float>(l.logits.span()).subspan(0, items * options_.shape.classes),
              items, labels.subspan(0, items), {}, s);
}

// With cuda_graphs: the work of (call, bucket) on the lane's own buffers, from a cached
// graph, or run eagerly and captured (a miss). x holds the batch's inputs by now; rows
// past `items` are padding, computed and never copied out.
void mlp::run_graph(lane_state& l, int call, std::size_t items, cudaStream_t s) {
  const std::size_t rows = graph_bucket(items, options_.max_items);
  const auto c = static_cast<graph_call>(call);
  const auto enqueue = [&] {
    if (c == graph_call::forward)
      enqueue_forward(l.x.data(), l.logits.data(), rows, s, l);
    else
      enqueue_classify_normalized(l.x.data(), l.labels.data(), rows, s, l);
  };
  if (cudaGraphExec_t* exec = l.graphs.find({c, rows})) {
    CONVEYOR_CUDA_TRY(cudaGraphLaunch(*exec, s));
    return;
  }
  // A new bucket: run it eagerly (this batch's result; it also loads every kernel the
  // work needs, so lazy module loading never happens inside a capture), then capture
  // the same work for the next batches. Capturing executes nothing.
  enqueue();
  // Thread-local mode: only this thread's unsafe calls would break the capture; the
  // pipeline's other threads keep querying and synchronizing events meanwhile.
  CONVEYOR_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    CONVEYOR_CUDA_LOG(cudaStreamEndCapture(s, &graph));  // leave capture mode, then rethrow
    if (graph != nullptr) CONVEYOR_CUDA_LOG(cudaGraphDestroy(graph));
    throw;
  }
  CONVEYOR_CUDA_TRY(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0ULL);
  CONVEYOR_CUDA_ASSERT(cudaGraphDestroy(graph));
  CONVEYOR_CUDA_TRY(status);
  l.graphs.insert({c, rows}, exec);
}

namespace {
// The checks every entry point makes on the calling thread, before enqueueing anything.
void check_call(const mlp_options& o, const char* call, std::size_t items, std::size_t in_have,
                std::size_t in_per_item, std::size_t out_have, std::size_t out_per_item) {
  CONVEYOR_EXPECTS(items <= o.max_items,
                   "mlp: a batch of " + std::to_string(items) + " items, above max_items " +
                       std::to_string(o.max_items) + "; raise mlp_options::max_items");
  CONVEYOR_EXPECTS(in_have >= items * in_per_item && out_have >= items * out_per_item,
                   std::string("mlp::") + call + ": input or output span too small for " +
                       std::to_string(items) + " items");
}
}  // namespace

void mlp::forward(device_span<const float> in, device_span<float> out, std::size_t items,
                  conveyor::cuda::stream_ref s, std::size_t lane) {
  const mlp_shape& sh = options_.shape;
  check_call(options_, "forward", items, in.size(), sh.input, out.size(), sh.classes);
  lane_state& l = lane_for(lane, s);
  if (items == 0) return;
  if (!options_.cuda_graphs) {
    enqueue_forward(in.data(), out.data(), items, s.native(), l);
    return;
  }
  copy_async(l.x.span().subspan(0, items * sh.input), in.subspan(0, items * sh.input), s);
  run_graph(l, static_cast<int>(graph_call::forward), items, s.native());
  copy_async(out.subspan(0, items * sh.classes),
             device_span<const float>(l.logits.span()).subspan(0, items * sh.classes), s);
}

void mlp::classify(device_span<const std::uint8_t> pixels, device_span<std::uint32_t> labels,
                   std::size_t items, conveyor::cuda::stream_ref s, std::size_t lane) {
  check_call(options_, "classify", items, pixels.size(), options_.shape.input, labels.size(), 1);
  lane_state& l = lane_for(lane, s);
  if (items == 0) return;
  if (!options_.cuda_graphs && !l.topk) {
    enqueue_classify(pixels.data(), labels.data(), items, s.native(), l);
    return;
  }
  kernels::normalize(pixels.data(), l.x.data(), items * options_.shape.input, options_.norm,
                     s.native());
  finish_classify(l, labels, items, s);
}

// classify() from inputs normalized into l.x: the graph or eager forward pass, and the
// labels by the options' method.
void mlp::finish_classify(lane_state& l, device_span<std::uint32_t> labels, std::size_t items,
                          conveyor::cuda::stream_ref s) {
  if (!l.topk) {  // cuda_graphs: argmax inside the graph
    run_graph(l, static_cast<int>(graph_call::classify), items, s.native());
    copy_labels(l, labels, items, s);
    return;
  }
  if (options_.cuda_graphs)
    run_graph(l, static_cast<int>(graph_call::forward), items, s.native());
  else
    enqueue_forward(l.x.data(), l.logits.data(), items, s.native(), l);
  thrust_labels(l, labels, items, s);
}

void mlp::classify(device_span<const float> normalized, device_span<std::uint32_t> labels,
                   std::size_t items, conveyor::cuda::stream_ref s, std::size_t lane) {
  check_call(options_, "classify", items, normalized.size(), options_.shape.input, labels.size(),
             1);
  lane_state& l = lane_for(lane, s);
  if (items == 0) return;
  if (!options_.cuda_graphs && !l.topk) {
    enqueue_classify_normalized(normalized.data(), labels.data(), items, s.native(), l);
    return;
  }
  const std::size_t n = items * options_.shape.input;
  copy_async(l.x.span().subspan(0, n), normalized.subspan(0, n), s);
  finish_classify(l, labels, items, s);
}

void mlp::copy_labels(lane_state& l, device_span<std::uint32_t> labels, std::size_t items,
                      conveyor::cuda::stream_ref s) {
  copy_async(labels.subspan(0, items),
             device_span<const std::uint32_t>(l.labels.span()).subspan(0, items), s);
}

}  // namespace conveyor_models
