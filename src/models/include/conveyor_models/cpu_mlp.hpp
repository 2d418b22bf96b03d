// conveyor_models/cpu_mlp.hpp: the example MLP on conveyor's host runtime: the CPU
// reference, enqueued on a host stream, with the same calls as the cuBLAS model
// (conveyor_models::mlp), so examples and benchmarks run on machines without a GPU.
//
//   using R = conveyor::host::runtime;
//   conveyor_models::cpu_mlp model{{.shape = shape, .lanes = 2, .max_items = 64}};
//   [&](conveyor::lane_batch<R, std::uint8_t, std::uint32_t>& l) {      // gpu segment compute
//     model.classify(l.in, l.out, l.items, l.stream, l.lane);           // only enqueues
//     return l.items; }
//
// forward()/classify() check their arguments on the calling thread, then enqueue the
// reference computation on the stream (it runs on the stream's thread, in stream order,
// into per-lane scratch allocated at construction: nothing is allocated per batch).
// Results are bit-for-bit those of reference_mlp at the same precision.
// Thread-safety: calls for different lanes may come from different threads; one lane's
// calls must go to one stream (its scratch is used in that stream's order). The model
// must outlive the work it enqueued (synchronize the streams, or end the pipeline, first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/base/config.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor_models/reference.hpp"

namespace conveyor_models {

class cpu_mlp {
 public:
  using runtime = conveyor::host::runtime;
  template <class T>
  using device_span = conveyor::host::device_span<T>;

  // The weights: o.weights, or make_weights(o.shape, o.seed) when it is null.
  // @throws conveyor::config_error on a bad shape, zero lanes or zero max_items.
  explicit cpu_mlp(const mlp_options& o) : options_(o), ref_(weights_of(o), o.prec) {
    CONVEYOR_EXPECTS(o.lanes >= 1 && o.lanes <= 64, "cpu_mlp: lanes must be in [1, 64]");
    CONVEYOR_EXPECTS(o.max_items >= 1 && o.max_items <= (std::size_t{1} << 20),
                     "cpu_mlp: max_items must be in [1, 2^20]; set it to the largest batch");
    CONVEYOR_EXPECTS(o.norm.stddev > 0.0f, "cpu_mlp: norm.stddev must be > 0");
    scratch_.reserve(o.lanes);
    for (std::size_t l = 0; l < o.lanes; ++l)
      scratch_.push_back(std::make_unique<std::vector<float>>(ref_.scratch_floats(o.max_items)));
  }

  const mlp_options& options() const noexcept { return options_; }
  const reference_mlp& reference() const noexcept { return ref_; }

  // Enqueues out[0 .. items * classes) = logits of in[0 .. items * input) on s.
  // @note blocks only while s's queue is full (host::stream_ref::enqueue).
  // @throws conveyor::config_error (on the calling thread) when a span, items or lane is
  //         out of range.
  void forward(device_span<const float> in, device_span<float> out, std::size_t items,
               conveyor::host::stream_ref s, std::size_t lane) {
    check(in.size(), items * options_.shape.input, out.size(), items * options_.shape.classes,
          items, lane);
    s.enqueue([this, in, out, items, lane] {
      ref_.forward(in.unsafe_host(), out.unsafe_host(), items, *scratch_[lane]);
    });
  }

  // Enqueues normalize -> forward -> argmax on s: labels[0 .. items) from
  // pixels[0 .. items * input). @throws as forward().
  void classify(device_span<const std::uint8_t> pixels, device_span<std::uint32_t> labels,
                std::size_t items, conveyor::host::stream_ref s, std::size_t lane) {
    check(pixels.size(), items * options_.shape.input, labels.size(), items, items, lane);
    s.enqueue([this, pixels, labels, items, lane] {
      ref_.classify(pixels.unsafe_host(), options_.norm, labels.unsafe_host(), items,
                    *scratch_[lane]);
    });
  }

  // Enqueues forward -> argmax on s from inputs already normalized (on the CPU): for a
  // pipeline that normalizes in a CPU stage and ships floats. @throws as forward().
  void classify(device_span<const float> normalized, device_span<std::uint32_t> labels,
                std::size_t items, conveyor::host::stream_ref s, std::size_t lane) {
    check(normalized.size(), items * options_.shape.input, labels.size(), items, items, lane);
    s.enqueue([this, normalized, labels, items, lane] {
      ref_.classify(normalized.unsafe_host(), labels.unsafe_host(), items, *scratch_[lane]);
    });
  }

 private:
  void check(std::size_t in_have, std::size_t in_need, std::size_t out_have, std::size_t out_need,
             std::size_t items, std::size_t lane) const {
    CONVEYOR_EXPECTS(lane < scratch_.size(),
                     "cpu_mlp: lane " + std::to_string(lane) + " but the model was built for " +
                         std::to_string(scratch_.size()) + " lanes; set mlp_options::lanes");
    CONVEYOR_EXPECTS(items <= options_.max_items,
                     "cpu_mlp: a batch of " + std::to_string(items) + " items, above max_items " +
                         std::to_string(options_.max_items) + "; raise mlp_options::max_items");
    CONVEYOR_EXPECTS(
        in_have >= in_need && out_have >= out_need,
        "cpu_mlp: input or output span too small for " + std::to_string(items) + " items");
  }

  mlp_options options_;
  reference_mlp ref_;
  std::vector<std::unique_ptr<std::vector<float>>> scratch_;  // per lane
};

}  // namespace conveyor_models
