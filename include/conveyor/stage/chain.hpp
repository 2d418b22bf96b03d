// conveyor/stage/chain.hpp: composing stages with `|`, checked at compile time.
//
//   auto chain = conveyor::source(read) | conveyor::map(decode) | conveyor::sink(write);
//
// Each stage's output type must be the next stage's input. When it is not, the build
// stops in conveyor::detail::check_connection<Out, Next> with a static_assert; the
// compiler's "required from here" line names both types: Out (what the previous stage
// produces) and Next (the stage that cannot take it).
// Thread-safety: compile-time only.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "conveyor/stage/concepts.hpp"

namespace conveyor {

// A stage placed in a chain, with the input type it receives there.
template <class Stage, class In>
struct bound_stage {
  using stage_type = Stage;
  using in_type = In;
  using out_type = typename Stage::template output<In>;
  Stage stage;
};

// A source (or input) at the head of a chain: no input.
template <class Stage>
struct bound_stage<Stage, void> {
  using stage_type = Stage;
  using in_type = void;
  using out_type = typename Stage::out_type;
  Stage stage;
};

// An ordered list of stages whose types connect. Built with operator|.
template <class... Bound>
struct chain {
  std::tuple<Bound...> stages;
  using out_type =
      typename std::tuple_element_t<sizeof...(Bound) - 1, std::tuple<Bound...>>::out_type;
};

namespace detail {

template <class Out, class Next>
constexpr bool check_connection() {
  static_assert(!std::is_void_v<Out>,
                "conveyor: nothing can follow a sink: it produces no output (Out is void)");
  if constexpr (!std::is_void_v<Out>) {
    static_assert(stage_for<Next, Out>,
                  "conveyor: stage type mismatch: the next stage (Next) cannot take what the "
                  "previous stage produces (Out); change one of them so they agree");
    return stage_for<Next, Out>;
  } else {
    return false;
  }
}

}  // namespace detail

// head | stage
template <class Head, class Next>
  requires head_stage<std::decay_t<Head>> && (!head_stage<std::decay_t<Next>>)
auto operator|(Head&& head, Next&& next) {
  using h = bound_stage<std::decay_t<Head>, void>;
  return chain<h>{std::tuple<h>{h{std::forward<Head>(head)}}} | std::forward<Next>(next);
}

// chain | stage
template <class... Bound, class Next>
  requires(!head_stage<std::decay_t<Next>>)
auto operator|(chain<Bound...>&& c, Next&& next) {
  using out = typename chain<Bound...>::out_type;
  using stage = std::decay_t<Next>;
  if constexpr (detail::check_connection<out, stage>()) {
    using b = bound_stage<stage, out>;
    return chain<Bound..., b>{
        std::tuple_cat(std::move(c.stages), std::tuple<b>{b{std::forward<Next>(next)}})};
  } else {
    return std::move(c);  // unreachable: check_connection failed the build
  }
}

}  // namespace conveyor
