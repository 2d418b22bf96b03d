// conveyor/stage/concepts.hpp: what makes a type a stage of a chain.
//
//   static_assert(conveyor::head_stage<decltype(conveyor::input<int>())>);
//   static_assert(conveyor::stage_for<decltype(conveyor::map(f)), int>);  // f(int) -> value
//
// A head stage (a source, or a service's input) starts a chain: it takes nothing and
// produces out_type. Every other stage says, through accepts<In>, which input it takes,
// and, through output<In>, what it then produces (void for a sink).
// Thread-safety: compile-time only.
#pragma once

namespace conveyor {

template <class S>
concept head_stage = requires {
  typename S::out_type;
  requires S::starts_chain;
};

template <class S, class In>
concept stage_for = !head_stage<S> && S::template accepts<In>;

}  // namespace conveyor
