// conveyor/pipeline/detail/wiring.hpp: how a chain of stages becomes running nodes and the
// rings between them: which kind of ring each hop gets (spsc, mpmc, lanes), and the node
// each stage kind runs as.
//
//   auto node = detail::make_node(std::move(stage), ctl, in_link, out_link, &latency);
//   detail::ring_ends e{detail::output_pushers(a), detail::input_poppers(b)};
//   auto lanes = detail::plan_lanes(candidates, pushers, poppers);
//
// Thread-safety: setup only (the pipeline's constructor).
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "conveyor/base/box.hpp"
#include "conveyor/stage/batch.hpp"
#include "conveyor/stage/detail/control.hpp"
#include "conveyor/stage/detail/latency_samples.hpp"
#include "conveyor/stage/detail/link.hpp"
#include "conveyor/stage/gpu.hpp"
#include "conveyor/stage/map.hpp"
#include "conveyor/stage/sink.hpp"
#include "conveyor/stage/source.hpp"

namespace conveyor::detail {

template <class T>
struct is_input : std::false_type {};
template <class T>
struct is_input<input_stage<T>> : std::true_type {};
template <class T>
struct is_sink : std::false_type {};
template <class F>
struct is_sink<sink_stage<F>> : std::true_type {};

// make_node: the running counterpart of each stage kind.
template <class F>
auto make_node(source_stage<F>&& s, control& ctl, void*,
               link<typename source_stage<F>::out_type>* out, latency_recorder*) {
  return make_box<source_node<F>>(std::move(s), ctl, out);
}
template <class F, class In, class Out>
auto make_node(map_stage<F>&& s, control& ctl, link<In>* in, link<Out>* out, latency_recorder*) {
  return make_box<map_node<F, In>>(std::move(s), ctl, in, out);
}
template <class In, class Out>
auto make_node(batch_stage&& s, control& ctl, link<In>* in, link<Out>* out, latency_recorder*) {
  return make_box<batch_node<In>>(std::move(s), ctl, in, out);
}
template <class In, class Out>
auto make_node(unbatch_stage&& s, control& ctl, link<In>* in, link<Out>* out, latency_recorder*) {
  return make_box<unbatch_node<In>>(std::move(s), ctl, in, out);
}
template <class R, class IE, class OE, class SI, class C, class SO, class In, class Out>
auto make_node(gpu_stage<R, IE, OE, SI, C, SO>&& s, control& ctl, link<In>* in, link<Out>* out,
               latency_recorder*) {
  return make_box<gpu_node<R, IE, OE, SI, C, SO, In>>(std::move(s), ctl, in, out);
}
template <class F, class In>
auto make_node(sink_stage<F>&& s, control& ctl, link<In>* in, void*, latency_recorder* lat) {
  using node = decltype(make_sink_node(std::move(s), ctl, in, lat));
  // terminal_node is not movable once built: construct it in place.
  return box<node>(new node(make_sink_node(std::move(s), ctl, in, lat)));
}

// How many threads of a stage push to its output ring at the same time, and pop from its
// input ring at the same time: where both ends of a ring are 1, it is an spsc_ring.
template <class F>
std::size_t output_pushers(const source_stage<F>&) {
  return 1;
}
template <class T>
std::size_t output_pushers(const input_stage<T>&) {
  return any_threads;
}  // submit() callers
template <class F>
std::size_t output_pushers(const map_stage<F>& s) {
  return s.is_ordered() ? 1 : s.workers();  // ordered: one emitter at a time
}
inline std::size_t output_pushers(const batch_stage&) { return 1; }
inline std::size_t output_pushers(const unbatch_stage&) { return 1; }
template <class R, class IE, class OE, class SI, class C, class SO>
std::size_t output_pushers(const gpu_stage<R, IE, OE, SI, C, SO>&) {
  return 1;  // results leave through the reorder buffer's one emitter at a time
}

template <class F>
std::size_t input_poppers(const map_stage<F>& s) {
  return s.workers();
}
inline std::size_t input_poppers(const batch_stage&) { return 1; }
inline std::size_t input_poppers(const unbatch_stage&) { return 1; }
template <class R, class IE, class OE, class SI, class C, class SO>
std::size_t input_poppers(const gpu_stage<R, IE, OE, SI, C, SO>& s) {
  return s.options().lanes;  // one enqueue thread per lane
}
template <class F>
std::size_t input_poppers(const sink_stage<F>& s) {
  return s.workers();
}

// An ordered map with several workers may run on lanes (detail/link.hpp): each worker
// its own lane in and out, when the stages on both sides deal and take items in order.
template <class Stage>
std::size_t lane_workers(const Stage&) {
  return 0;
}
template <class F>
std::size_t lane_workers(const map_stage<F>& s) {
  return s.is_ordered() && s.workers() > 1 ? s.workers() : 0;
}

// Which stages run on lanes: lanes[i] = workers of stage i if it does, else 0. A
// candidate needs the stage before it to push in order from one thread (or to run on
// lanes itself) and the one after it to pop from one thread (or to run on lanes; the
// last stage of a service hands its results to one thread). Dropping a candidate can
// only drop its neighbours, so the first pass that drops none is the answer.
template <std::size_t N>
std::array<std::size_t, N> plan_lanes(const std::array<std::size_t, N>& candidates,
                                      const std::array<std::size_t, N>& pushers,
                                      const std::array<std::size_t, N>& poppers) {
  std::array<std::size_t, N> lanes = candidates;
  for (bool dropped = true; dropped;) {
    dropped = false;
    for (std::size_t i = 0; i < N; ++i) {
      if (lanes[i] == 0) continue;
      const bool before = i > 0 && (lanes[i - 1] != 0 || pushers[i - 1] == 1);
      const bool after = i + 1 == N || lanes[i + 1] != 0 || poppers[i + 1] == 1;
      if (!before || !after) {
        lanes[i] = 0;
        dropped = true;
      }
    }
  }
  return lanes;
}

}  // namespace conveyor::detail
