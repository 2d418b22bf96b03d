// conveyor_models/model.hpp: the example MLP for a given conveyor runtime, so that one
// program (an example, the inference benchmark) is written once over R.
//
//   template <class R> void demo(const conveyor_models::mlp_options& o) {
//     conveyor_models::model_t<R> model{o};     // cpu_mlp on host::runtime, mlp on cuda::runtime
//     ... model.classify(l.in, l.out, l.items, l.stream, l.lane); ...
//     segment.streams(conveyor_models::lane_streams<R>(model));
//   }
//
// conveyor_models::mlp (CUDA) is available when the program is built against conveyor::cuda
// (CONVEYOR_HAS_CUDA) and linked with conveyor_models; cpu_mlp always is.
// Thread-safety: compile-time only.
#pragma once

#include <cstddef>

#include "conveyor/base/config.hpp"
#include "conveyor/runtime/host/runtime.hpp"
#include "conveyor_models/cpu_mlp.hpp"

#if CONVEYOR_HAS_CUDA
#include "conveyor/runtime/cuda/runtime.hpp"
#include "conveyor_models/mlp.hpp"
#endif

namespace conveyor_models {

template <class R>
struct model_for;  // no model for this runtime

template <>
struct model_for<conveyor::host::runtime> {
  using type = cpu_mlp;
};

#if CONVEYOR_HAS_CUDA
template <>
struct model_for<conveyor::cuda::runtime> {
  using type = mlp;
};
#endif

template <class R>
using model_t = typename model_for<R>::type;

// The gpu segment's stream factory for a model: each lane gets a new stream with the
// model's per-lane state bound to it before the run (on CUDA the lane's cuBLAS handle
// and workspace, whose allocation mid-run would synchronize the device; cpu_mlp has
// nothing to bind).
//   segment.streams(conveyor_models::lane_streams<R>(model));   // model outlives the run
template <class R, class Model>
auto lane_streams(Model& model) {
  return [&model](std::size_t lane) {
    static_cast<void>(model);  // used only where the model binds
    typename R::stream s;
    if constexpr (requires { model.bind(lane, s); }) model.bind(lane, s);
    return s;
  };
}

}  // namespace conveyor_models
