// SPDX-License-Identifier: Apache-2.0
#pragma once
// Strategy::run's plumbing on each replica's thread: what fn receives for each argument (a
// component, a shared value, a variable's handle, or a copy staged on the replica's device), the
// call itself in either of fn's two forms, and the handler that turns a replica's exception into
// its error and cancels the others.

#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <mirror/backend/collective_cancelled.hpp>
#include <mirror/detail/access.hpp>
#include <mirror/detail/timeline.hpp>
#include <mirror/flight_recorder.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/rethrow_first.hpp>
#include <mirror/detail/staged_argument.hpp>
#include <mirror/mirrored_variable.hpp>
#include <mirror/sync_on_read_variable.hpp>

namespace mirror::detail {

template <class T> struct is_variable : std::false_type {};
template <class T> struct is_variable<MirroredVariable<T>> : std::true_type {};
template <class T> struct is_variable<SyncOnReadVariable<T>> : std::true_type {};

/// What replica r holds for one argument of run (docs/guide.md\#run-and-the-values-it-returns): a
/// reference to its component or copy, a reference to a shared value, or (variables) a
/// replica-local handle.
template <class A, class Context>
decltype(auto) hold_for_replica(A&& a, int r, Context& ctx) {
  using D = std::remove_cvref_t<A>;
  if constexpr (is_variable<D>::value) {
    static_assert(std::is_lvalue_reference_v<A> && !std::is_const_v<std::remove_reference_t<A>>,
                  "mirror::Strategy::run(fn, args...): pass a variable as a non-const lvalue (it is updated "
                  "through the handle fn receives)");
    return access::handle_for(a, r, ctx);
  } else if constexpr (is_per_replica<D>::value) {
    if constexpr (std::is_lvalue_reference_v<A> && !std::is_const_v<std::remove_reference_t<A>>) {
      return a[static_cast<std::size_t>(r)];  // T&
    } else {
      return std::as_const(a)[static_cast<std::size_t>(r)];  // const T&
    }
  } else if constexpr (is_mirrored<D>::value) {
    return std::as_const(a)[static_cast<std::size_t>(r)];
  } else {
    return std::as_const(a);
  }
}

/// Whether run can keep replica results of type R in the runtime's per-replica result areas
/// (threads::runtime::result_area): the runtime has them, and an optional<R> fits and moves
/// without throwing. (A concept, so that runtimes without `result_bytes` just fail it.)
template <class Rt, class R>
concept keeps_results_in_areas = requires(Rt& rt) {
  { rt.result_area(0) } -> std::same_as<void*>;
  { Rt::result_bytes } -> std::convertible_to<std::size_t>;
} && sizeof(std::optional<R>) <= Rt::result_bytes && alignof(std::optional<R>) <= 16 &&
                                 std::is_nothrow_move_constructible_v<R>;

/// The lvalue fn receives for what a replica holds (a reference, or a value held in run's frame).
template <class H>
using as_lvalue_t = std::conditional_t<std::is_reference_v<H>, H, H&>;

/// What replica r's fn receives for argument a: `hold_for_replica`, except that on a
/// device the replicas' threads cannot read, a shared host value is first copied to replica r's
/// device (docs/cuda.md\#host-arguments-of-run; mirror/detail/staged_argument.hpp).
template <class Rt, class A, class Context>
decltype(auto) hold_argument(Rt& rt, A& a, int r, Context& ctx, std::size_t& slot) {
  using D = std::remove_cvref_t<A>;
  constexpr bool shared_host_value = !Rt::host_addressable && !is_variable<D>::value &&
                                     !is_per_replica<D>::value && !is_mirrored<D>::value;
  static_assert(!(shared_host_value && staging_refused<D>),
                "mirror::Strategy::run: a shared argument holds host arrays beside members that cannot be "
                "copied to the replicas' devices (only arrays, arithmetic values, enums, pointers, device views "
                "and tuples/pairs/arrays/Hana structs of them can), so part of it would stay in host memory; "
                "pass the other members in a separate argument, or wrap the value in a plain struct to "
                "pass it to fn as it is (mirror/detail/staged_argument.hpp)");
  if constexpr (shared_host_value && staged_on_device<D>) {
    return stage_to_device(rt, r, std::as_const(a), slot);
  } else {
    return hold_for_replica(a, r, ctx);
  }
}

/// Calls replica r's fn with its context and what it holds of each argument, in whichever of the
/// two forms fn takes: fn(ctx, args...) or fn(args...).
template <class Rt, class F, class Context, class... Args>
decltype(auto) call_fn(Rt& rt, F& fn, Context& ctx, int r, Args&... args) {
  [[maybe_unused]] std::size_t slot = 0;
  // Braced: the arguments are held (and staged) left to right.
  [[maybe_unused]] std::tuple<decltype(hold_argument(rt, args, r, ctx, slot))...> held{
      hold_argument(rt, args, r, ctx, slot)...};
  (void)r;  // unused when fn takes no arguments
  if constexpr (std::is_invocable_v<F&, Context&, as_lvalue_t<decltype(hold_argument(rt, args, r, ctx, slot))>...>) {
    return std::apply([&](auto&... h) -> decltype(auto) { return fn(ctx, h...); }, held);
  } else if constexpr (std::is_invocable_v<F&, as_lvalue_t<decltype(hold_argument(rt, args, r, ctx, slot))>...>) {
    return std::apply([&](auto&... h) -> decltype(auto) { return fn(h...); }, held);
  } else {
    static_assert(sizeof(F) == 0,
                  "mirror::Strategy::run(fn, args...): fn must be callable as fn(ctx, args...) or "
                  "fn(args...), where a PerReplica<T> argument arrives as T&, a Mirrored<T> as "
                  "const T&, a variable as a handle (auto&), and any other argument as const& (on "
                  "devices::Cuda a shared nest of host arrays as its device views: auto&)");
  }
}

/// Runs replica r's part of a run, keeping what it throws as r's error: the runtime's other
/// replicas are cancelled at once, and on a multi-worker runtime the other workers are told
/// (`first_replica`: the global id of this worker's replica 0).
template <class Rt, class Body>
void guarded(Rt& rt, replica_errors& errors, int r, int first_replica, Body&& body) noexcept {
  // Errors built outside fn's collectives (on replica 0's thread: the caller's) name no collective.
  struct leave_fn {
    ~leave_fn() {
      current_position = {};
      current_recorder = nullptr;
      if (trace_track* t = current_track) {
        trace_event fn;
        fn.begin = t->fn_begin;
        fn.end = trace_now();
        fn.kind = trace_kind::fn;
        t->push(fn);
        current_track = nullptr;
      }
    }
  } leave;
  try {
    body();
  } catch (const backend::collective_cancelled_rethrow_me&) {
    // another replica failed first; its error is the one reported
  } catch (...) {
    keep_current_exception(errors, static_cast<std::size_t>(r));
    rt.cancel();
    // Other workers may wait for this one in a cross-worker collective: tell them now.
    if constexpr (spans_workers<Rt>) {
      // (Its text says where in fn, read here while the thread's position is still this fn's.)
      rt.workers()->report_failure(first_replica + r, with_failure_site(errors[static_cast<std::size_t>(r)]));
    }
  }
}

}  // namespace mirror::detail
