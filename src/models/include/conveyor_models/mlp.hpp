// conveyor_models/mlp.hpp: the example MLP on the GPU: cuBLAS GEMMs (cublasGemmEx at
// fp32, tf32, fp16 or bf16 with float accumulation) with a bias + ReLU kernel between
// layers, plus the preprocessing and argmax kernels, one cuBLAS handle per lane.
//
//   using R = conveyor::cuda::runtime;
//   conveyor_models::mlp model{{.shape = shape, .prec = conveyor_models::precision::fp16,
//                               .lanes = 2, .max_items = 64, .cuda_graphs = true}};
//   [&](conveyor::lane_batch<R, std::uint8_t, std::uint32_t>& l) {      // gpu segment compute
//     model.classify(l.in, l.out, l.items, l.stream, l.lane);           // only enqueues
//     return l.items; }
//
// The weights (options' trained ones, or make_weights(shape, seed): weights_of()) are
// uploaded at construction, to the current device; a lane bound on another device (a gpu
// segment's lanes over several devices bind on theirs) gets its scratch there, and the
// weights are uploaded there once, at its first bind. Each lane gets its own cuBLAS handle bound to that lane's stream with its
// own workspace (cublasSetWorkspace), and its own scratch; the handle is made on the
// lane's first call, or by bind() before the pipeline starts: do that (as the examples do,
// in the gpu segment's .streams() factory), since the workspace allocation synchronizes
// the device, and under another lane's graph capture it is best kept out of the run.
// With cuda_graphs, a call pads its batch to a bucket (the next power of two, at most
// max_items) and runs the model on the lane's own buffers: the input is copied (or
// normalized) into them, the bucket's graph runs (one cudaGraphLaunch instead of ~3
// launches per layer), and the batch's rows are copied out; the padding rows' results
// are dropped. A bucket's first call runs eagerly and captures the graph then; each lane
// keeps at most graph_cache_capacity graphs (least recently used evicted), and
// graph_stats() counts hits, misses, captures and evictions. Capture is
// legal because every cuBLAS handle has its own workspace (cublasSetWorkspace).
// labels = label_method::thrust labels rows with the Thrust top-1 (thrust_topk.hpp) on
// the lane's stream instead of the argmax kernel; with cuda_graphs the forward pass is
// the graph and Thrust runs after it.
// forward()/classify() only enqueue on the stream; nothing synchronizes.
// Thread-safety: calls for different lanes may come from different threads at once; one
// lane's calls must come from one thread at a time (cuBLAS's rule for a handle). The
// model must outlive the work it enqueued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "conveyor/runtime/cuda/memory.hpp"
#include "conveyor/runtime/cuda/runtime.hpp"
#include "conveyor/runtime/cuda/stream.hpp"
#include "conveyor_models/graph_cache.hpp"
#include "conveyor_models/reference.hpp"

namespace conveyor_models {

class mlp {
 public:
  using runtime = conveyor::cuda::runtime;
  template <class T>
  using device_span = conveyor::cuda::device_span<T>;

  // Uploads the weights (on a stream of its own, synchronized before returning) and
  // allocates every lane's scratch on the current device.
  // @note blocks until the weights are on the device.
  // @throws conveyor::config_error on bad options; conveyor::cuda_error.
  explicit mlp(const mlp_options& o);
  ~mlp();
  mlp(const mlp&) = delete;
  mlp& operator=(const mlp&) = delete;

  const mlp_options& options() const noexcept { return options_; }

  // Makes lane's cuBLAS handle on s now (else on the lane's first call). Calling it again
  // with another stream replaces the handle and drops the lane's captured graphs.
  // @note may allocate (and so synchronize the device): call it before the run.
  void bind(std::size_t lane, conveyor::cuda::stream_ref s);

  // Enqueues out[0 .. items * classes) = logits of in[0 .. items * input) on s.
  // @throws conveyor::config_error when a span, items or lane is out of range;
  //         conveyor::cuda_error.
  void forward(device_span<const float> in, device_span<float> out, std::size_t items,
               conveyor::cuda::stream_ref s, std::size_t lane);

  // Enqueues normalize -> forward -> argmax on s: labels[0 .. items) from
  // pixels[0 .. items * input); only the labels are written. @throws as forward().
  void classify(device_span<const std::uint8_t> pixels, device_span<std::uint32_t> labels,
                std::size_t items, conveyor::cuda::stream_ref s, std::size_t lane);
  // Enqueues forward -> argmax on s from inputs normalized already (on the CPU): for a
  // pipeline that normalizes in a CPU stage and ships floats. @throws as forward().
  void classify(device_span<const float> normalized, device_span<std::uint32_t> labels,
                std::size_t items, conveyor::cuda::stream_ref s, std::size_t lane);

  // Graphs a lane holds now (0 without cuda_graphs).
  std::size_t graphs_cached(std::size_t lane) const;
  // Graph hits, misses, captures, evictions and graphs held, summed over the lanes (all
  // zero without cuda_graphs). Any thread; exact once the lanes' threads are joined.
  graph_cache_stats graph_stats() const noexcept;

 private:
  struct lane_state;
  struct layer {
    conveyor::cuda::device_buffer<std::byte> w;  // out x in, row-major, at options_.prec
    conveyor::cuda::device_buffer<float> b;
  };

  lane_state& lane_for(std::size_t lane, conveyor::cuda::stream_ref s);
  void enqueue_forward(const float* in, float* out, std::size_t items, cudaStream_t s,
                       lane_state& l);
  void enqueue_classify(const std::uint8_t* pixels, std::uint32_t* labels, std::size_t items,
                        cudaStream_t s, lane_state& l);
  void enqueue_classify_normalized(const float* x, std::uint32_t* labels, std::size_t items,
                                   cudaStream_t s, lane_state& l);
  void run_graph(lane_state& l, int call, std::size_t items, cudaStream_t s);
  void copy_labels(lane_state& l, device_span<std::uint32_t> labels, std::size_t items,
                   conveyor::cuda::stream_ref s);
  void finish_classify(lane_state& l, device_span<std::uint32_t> labels, std::size_t items,
                       conveyor::cuda::stream_ref s);
  void thrust_labels(lane_state& l, device_span<std::uint32_t> labels, std::size_t items,
                     conveyor::cuda::stream_ref s);

  const std::vector<layer>& weights_on(int device);
  std::unique_ptr<lane_state> make_lane(int device, const std::vector<layer>& weights);

  mlp_options options_;
  mlp_weights host_weights_;  // for the devices that lanes bind on later
  std::mutex weights_mutex_;  // binds of lanes on new devices may come from several threads
  std::vector<std::pair<int, std::unique_ptr<std::vector<layer>>>> weights_;  // per device
  std::vector<std::unique_ptr<lane_state>> lanes_;
};

}  // namespace conveyor_models
