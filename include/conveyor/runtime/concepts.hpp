// conveyor/runtime/concepts.hpp: what a runtime is, as a C++20 concept, so the pipeline
// is written once over conveyor::host::runtime and conveyor::cuda::runtime.
//
//   template <conveyor::runtime R> class lane {
//     typename R::stream stream_;                        // move-only owner
//     typename R::template pinned_buffer<float> in_;     // pinned_span<float> via in_.span()
//   };
//   static_assert(conveyor::runtime<conveyor::host::runtime>);
//
// A runtime R provides: stream (move-only, default-constructible, converts to stream_ref),
// stream_ref (copyable, not constructible from int or nullptr; wait/synchronize/query), event
// (move-only, explicit from event_timing [, event_wait]; record/query/synchronize,
// elapsed_ms by ADL),
// pinned_buffer/pinned_span and device_buffer/device_span (distinct, trivially copyable
// spans; pinned ones have host element access, device ones none), and copy_async /
// memset_async found by ADL that take only those spans, never a std::vector or a pointer;
// and devices: R::device_count(), R::current_device(), R::set_device(id) (per thread).
// Thread-safety: compile-time only.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "conveyor/runtime/event_timing.hpp"

namespace conveyor {
namespace detail {

template <class S, class Ref>
concept runtime_stream =
    std::default_initializable<S> && std::movable<S> && !std::copyable<S> &&
    std::is_nothrow_destructible_v<S> && std::is_nothrow_move_constructible_v<S> &&
    std::convertible_to<const S&, Ref> && requires(const S& s) {
      { s.ref() } noexcept -> std::same_as<Ref>;
      s.synchronize();
      s.native();
    };

template <class Ref, class E>
concept runtime_stream_ref =
    std::copyable<Ref> && std::equality_comparable<Ref> && !std::constructible_from<Ref, int> &&
    !std::constructible_from<Ref, std::nullptr_t> && !std::default_initializable<Ref> &&
    requires(const Ref r, const E& e) {
      r.synchronize();
      r.wait(e);
      { r.query() } -> std::same_as<bool>;
      r.native();
    };

template <class E, class Ref>
concept runtime_event =
    std::movable<E> && !std::copyable<E> && std::is_nothrow_destructible_v<E> &&
    std::constructible_from<E, event_timing> &&
    std::constructible_from<E, event_timing, event_wait> && !std::convertible_to<event_timing, E> &&
    requires(E& e, const E& ce, Ref r) {
      e.record(r);
      { ce.query() } -> std::same_as<bool>;
      ce.synchronize();
      { elapsed_ms(ce, ce) } -> std::same_as<float>;
    };

template <class Span, class T>
concept runtime_span = std::is_trivially_copyable_v<Span> && std::default_initializable<Span> &&
                       requires(const Span s, std::size_t n) {
                         { s.data() } -> std::same_as<T*>;
                         { s.size() } -> std::same_as<std::size_t>;
                         { s.size_bytes() } -> std::same_as<std::size_t>;
                         { s.subspan(n, n) } -> std::same_as<Span>;
                       };

template <class Buf, class Span, class T>
concept runtime_buffer =
    std::movable<Buf> && !std::copyable<Buf> && std::constructible_from<Buf, std::size_t> &&
    std::constructible_from<Buf, std::size_t, std::string_view> &&
    !std::convertible_to<std::size_t, Buf> && requires(const Buf& b) {
      { b.span() } -> std::same_as<Span>;
      { b.data() } -> std::same_as<T*>;
      { b.size() } -> std::same_as<std::size_t>;
      { b.size_bytes() } -> std::same_as<std::size_t>;
    };

template <class R, class T>
concept runtime_memory =
    runtime_span<typename R::template pinned_span<T>, T> &&
    runtime_span<typename R::template device_span<T>, T> &&
    runtime_buffer<typename R::template pinned_buffer<T>, typename R::template pinned_span<T>, T> &&
    runtime_buffer<typename R::template device_buffer<T>, typename R::template device_span<T>, T> &&
    // span<T> -> span<const T>, and nothing else converts into or between them
    std::convertible_to<typename R::template pinned_span<T>,
                        typename R::template pinned_span<const T>> &&
    std::convertible_to<typename R::template device_span<T>,
                        typename R::template device_span<const T>> &&
    !std::convertible_to<typename R::template pinned_span<const T>,
                         typename R::template pinned_span<T>> &&
    !std::same_as<typename R::template pinned_span<T>, typename R::template device_span<T>> &&
    !std::convertible_to<typename R::template pinned_span<T>,
                         typename R::template device_span<T>> &&
    !std::convertible_to<typename R::template device_span<T>,
                         typename R::template pinned_span<T>> &&
    !std::convertible_to<T*, typename R::template pinned_span<T>> &&
    !std::convertible_to<std::vector<T>&, typename R::template pinned_span<const T>> &&
    !std::convertible_to<std::span<T>, typename R::template pinned_span<const T>> &&
    // pinned memory is host memory; device memory has no host element access
    requires(typename R::template pinned_span<T> p) {
      { p[0] } -> std::same_as<T&>;
      { p.host() } -> std::same_as<std::span<T>>;
    } && !requires(typename R::template device_span<T> d) { d[0]; } &&
    !requires(typename R::template device_span<T> d) { d.host(); } &&
    !requires(typename R::template device_span<T> d) { d.begin(); } &&
    // transfers take only the runtime's own spans
    requires(typename R::template pinned_span<T> p, typename R::template device_span<T> d,
             typename R::template pinned_span<const T> cp,
             typename R::template device_span<const T> cd, typename R::stream_ref s) {
      copy_async(d, cp, s);  // H2D
      copy_async(p, cd, s);  // D2H
      copy_async(d, cd, s);  // D2D
      copy_async(d, p, s);   // T -> const T on the source
      memset_async(d, 0, s);
    } &&
    !requires(typename R::template device_span<T> d, std::vector<T>& v, typename R::stream_ref s) {
      copy_async(d, v, s);
    } &&
    !requires(typename R::template device_span<T> d, const T* v, typename R::stream_ref s) {
      copy_async(d, v, s);
    } &&
    !requires(typename R::template device_span<T> d, std::span<const T> v,
              typename R::stream_ref s) { copy_async(d, v, s); } &&
    !requires(std::vector<T>& v, typename R::template device_span<const T> d,
              typename R::stream_ref s) { copy_async(v, d, s); };

}  // namespace detail

template <class R>
concept runtime =
    requires {
      { R::name } -> std::convertible_to<std::string_view>;
      { R::device_count() } -> std::same_as<int>;
      { R::current_device() } -> std::same_as<int>;
      R::set_device(0);
      typename R::stream;
      typename R::stream_ref;
      typename R::event;
    } && detail::runtime_stream<typename R::stream, typename R::stream_ref> &&
    detail::runtime_stream_ref<typename R::stream_ref, typename R::event> &&
    detail::runtime_event<typename R::event, typename R::stream_ref> &&
    detail::runtime_memory<R, float> && detail::runtime_memory<R, std::byte>;

}  // namespace conveyor
