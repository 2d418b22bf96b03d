// conveyor_models/model.hpp: the example MLP for a given conveyor runtime, so that one
// program (an example, the inference benchmark) is written once over R.
//
//   template <class R> void demo(const conveyor_models::mlp_options& o) {
//     conveyor_models::model_t<R> model{o};     // cpu_mlp on host::runtime, mlp on cuda::runtime
//     ... model.classify(l.in, l.out, l.items, l.stream, l.lane); ...
//   }
//
// conveyor_models::mlp (CUDA) is available when the program is built against conveyor::cuda
// (CONVEYOR_HAS_CUDA) and linked with conveyor_models; cpu_mlp always is.
// Thread-safety: compile-time only.
#pragma once

#include "conveyor/config.hpp"
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

}  // namespace conveyor_models
