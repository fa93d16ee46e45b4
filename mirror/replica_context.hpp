// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ReplicaContext<Strategy>`: what `fn` sees of its replica inside `Strategy::run`.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <mirror/source_location.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>
#include <mirror/concepts/nest.hpp>
#include <mirror/detail/access.hpp>
#include <mirror/detail/async_queue.hpp>
#include <mirror/backend/collective.hpp>
#include <mirror/detail/timeline.hpp>
#include <mirror/flight_recorder.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/backend/generic_collectives.hpp>
#include <mirror/detail/gathered.hpp>
#include <mirror/detail/leaf_math.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/detail/replica_collectives.hpp>
#include <mirror/gradient_buckets.hpp>
#include <mirror/pending.hpp>
#include <mirror/per_replica.hpp>
#include <mirror/reduce_op.hpp>
#include <mirror/synced.hpp>
#include <mirror/axis.hpp>

namespace mirror {

/// The replica context passed to `fn` by `Strategy::run` when `fn` takes it first. Its type
/// depends on the strategy, so user code spells it `auto&`. Valid only during that call, and only
/// on that replica's thread.
///
/// Collectives (`all_reduce`, `broadcast`, `merge_call`) must be called by every replica, in the
/// same order, with the same nest types and leaf sizes. A disagreement is a `mirror::shape_error`
/// on every replica, raised before any value changes; a replica that returns from `fn` without
/// reaching a collective the others wait in makes them throw `mirror::timeout_error` naming it.
///
/// Every collective takes a last, defaulted `mirror::source_location` that callers leave out: the
/// errors above name each replica's call site as FILE:LINE (docs/errors.md\#call-sites). A
/// wrapper that calls collectives for its own callers may pass its caller's location on.
template <class Strategy>
class ReplicaContext {
 public:
  /// This replica's id, 0 .. num_replicas_in_sync() - 1 (on worker w of a multi-worker
  /// strategy with R local replicas: w*R + the local index).
  int replica_id_in_sync_group() const noexcept {
    return strategy_->worker_index() * strategy_->num_local_replicas() + self_;
  }
  /// The number of replicas running `fn` together.
  int num_replicas_in_sync() const noexcept { return strategy_->num_replicas_in_sync(); }

  /// A value that is not a nest: a compile error that says why (`mirror::nest`).
  template <class T>
    requires(!nest<T>)
  void all_reduce(ReduceOp, T&&, mirror::source_location = mirror::source_location::current()) {
    static_assert(detail::explain_not_nest<T>());
  }

  /// Reduces `value` across replicas with `op`, leaf by leaf; every replica gets the result.
  ///
  /// **Requires**: every replica passes a nest of the same type with leaves of the same sizes.
  /// **Effects**: owning leaves (`std::vector`, `std::array`, scalars) are reduced in a copy that
  /// is returned; view leaves (`std::span<E>`) are reduced in place, in every replica's own buffer,
  /// and allocate nothing. All leaves of one element type go through the strategy's ops policy
  /// as one fused collective.
  /// **Errors**: `mirror::shape_error` (on every replica) when replicas disagree.
  /// **Communication**: the ops policy's; see its header.
  /// **Example**: `auto total = ctx.all_reduce(mirror::ReduceOp::sum, std::span<float>(grads));`
  template <nest T>
  Synced<std::remove_cvref_t<T>> all_reduce(ReduceOp op, T&& value,
                                            mirror::source_location where = mirror::source_location::current()) {
    using N = std::remove_cvref_t<T>;
    require_reachable_leaves<N>();
    const recorded in_recorder(*this);
    N result(std::forward<T>(value));
    for_each_reduced_type(op, result, where, [&]<class E>(const detail::collective_header* header) {
      collectives_.template all_reduce_leaves<E>(self_, op, detail::leaves_of<E>(result), header);
    });
    return detail::access::synced(std::move(result));
  }

  /// Every replica's `value` concatenated along the first dimension, in replica order (TF's
  /// `ReplicaContext.all_gather`); every replica gets the same result.
  ///
  /// **Requires**: every replica passes a nest of the same type; its leaves may differ in their
  /// first dimension (a vector's length, a matrix's rows), not in the rest (a matrix's columns).
  /// **Returns**: the nest with each leaf holding every replica's, one after another: a
  /// `std::vector` or `mirror::matrix` leaf stays what it is, a scalar or `std::array` leaf
  /// becomes a `std::vector` (`ctx.all_gather(1.0f, axis0)` is a `Synced<std::vector<float>>` of
  /// N). View leaves cannot grow: gather spans with `all_gather(in, out, axis0)`.
  /// **Errors**: `mirror::shape_error` (on every replica, before anything is copied) when the
  /// replicas disagree on the nest or on a matrix's columns.
  /// **Communication**: every replica's leaves are copied into every replica's result once.
  /// **Example**: `auto all_ids = ctx.all_gather(std::vector<int>{id}, mirror::axis0);`
  template <nest T>
  Synced<detail::gathered_t<std::remove_cvref_t<T>>> all_gather(
      T&& value, axis_t<0>, mirror::source_location where = mirror::source_location::current()) {
    using N = std::remove_cvref_t<T>;
    static_assert(detail::gatherable<N>(),
                  "mirror::ReplicaContext::all_gather(value, axis0): the result must hold every replica's leaves, but "
                  "the value has a view leaf (std::span, matrix_view), which cannot grow: gather a span with "
                  "ctx.all_gather(std::span<const E> in, std::span<E> out, axis0), or a Hana struct with a scalar or "
                  "std::array member, whose type cannot change: make the member a std::vector, or gather a std::tuple");
    require_reachable_leaves<N>();
    const recorded in_recorder(*this);
    using G = detail::gathered_t<N>;
    constexpr std::size_t K = detail::leaf_count<N>();
    std::array<std::size_t, K> counts{}, widths{}, kinds{};
    const void* data = nullptr;  // the one leaf's elements (K == 1), which may travel with the counts
    std::size_t data_bytes = 0;
    std::size_t k = 0;
    detail::for_each_leaf(
        [&](const auto& l) {
          const auto e = detail::elements_of(l);
          counts[k] = e.size();
          if constexpr (K == 1) data = e.data(), data_bytes = e.size_bytes();
          kinds[k] = detail::element_kind_of<leaf_element_t<decltype(l)>>().code();
          widths[k++] = detail::row_width(l);
        },
        value);
    const std::vector<std::size_t>& all =
        gather_counts<N>(counts, widths, kinds, detail::any_size, where, bytes_of(value), data, data_bytes);
    G result{};
    k = 0;
    detail::for_each_leaf([&](auto& out) { detail::size_gathered(out, total_of(all, K, k), widths[k]); ++k; }, result);
    detail::for_each_type(detail::element_types_t<N>{}, [&]<class E>() {
      constexpr auto at = detail::leaf_positions<N, E>();
      std::vector<std::size_t> counts_of_e(all.size() / K * at.size());
      for (std::size_t r = 0; r < all.size() / K; ++r) {
        for (std::size_t j = 0; j < at.size(); ++j) counts_of_e[r * at.size() + j] = all[r * K + at[j]];
      }
      collectives_.template all_gather_leaves<E>(self_, detail::leaves_of<E>(std::as_const(value)), counts_of_e,
                                                 detail::leaves_of<E>(result), nullptr);
    });
    return detail::access::synced(std::move(result));
  }

  /// The span form of `all_gather`: every replica's `in` into `out`, in replica order, with no
  /// allocation on host devices (a device that stages host memory copies `in` to the device and
  /// never writes it back). **Requires**: `out.size()` is the sum of every replica's `in.size()`, on every
  /// replica (else `mirror::shape_error`, on every replica, before anything is copied); `out`
  /// does not overlap any replica's `in`, except that `in` may be exactly this replica's own
  /// part of `out` (in place: the parts of the replicas before it, then it).
  template <class E>
  void all_gather(std::span<const E> in, std::span<E> out, axis_t<0>,
                  mirror::source_location where = mirror::source_location::current()) {
    require_reachable_leaves<std::span<E>>();
    const recorded in_recorder(*this);
    const std::array<std::size_t, 1> counts{in.size()}, widths{1}, kinds{detail::element_kind_of<E>().code()};
    const std::vector<std::size_t>& all =
        gather_counts<std::span<E>>(counts, widths, kinds, out.size(), where, in.size_bytes(), in.data(),
                                    in.size_bytes());
    const std::array<std::span<const E>, 1> ins{in};
    const std::array<std::span<E>, 1> outs{out};
    collectives_.template all_gather_leaves<E>(self_, ins, all, outs, nullptr);
  }
  /// (For a non-const `in`: the same.)
  template <class E>
  void all_gather(std::span<E> in, std::span<E> out, axis_t<0> axis,
                  mirror::source_location where = mirror::source_location::current()) {
    all_gather(std::span<const E>(in), out, axis, where);
  }

  /// A value that is not a nest: a compile error that says why (`mirror::nest`).
  template <class T>
    requires(!nest<T>)
  void reduce_scatter(ReduceOp, T&&, mirror::source_location = mirror::source_location::current()) {
    static_assert(detail::explain_not_nest<T>());
  }

  /// Replica r receives cut r of the `op`-reduction of every replica's `value`: each leaf of n
  /// elements is cut by the batch-split rule (the first n mod N replicas get one element more).
  ///
  /// **Requires**: 1-D leaves (`std::vector`, `std::span`; a scalar or `std::array` is a compile
  /// error), of the same lengths on every replica.
  /// **Returns**: a plain value (it differs per replica; returned from fn it becomes a
  /// `PerReplica`): a `std::vector` leaf becomes a vector of the cut's length; a span leaf is
  /// reduced in place into this replica's own cut (the rest of the span is left as it was) and
  /// the returned span views that cut. Bitwise the same as the cut's elements of `all_reduce`
  /// under the same policy (except `ops::NcclAllReduce` with floating-point sum, prod or mean on
  /// three replicas or more, where NCCL may order the two differently: backends/nccl).
  /// **Errors**: `mirror::shape_error` (on every replica, before any value changes) when replicas
  /// disagree on the nest or the lengths.
  /// **Communication**: the ops policy's; the CPU default reads every replica's cut once and
  /// writes the result once ((N+1)·S bytes in all for S bytes per replica).
  /// **Example**: `auto mine = ctx.reduce_scatter(mirror::ReduceOp::sum, std::span<float>(grads));`
  template <nest T>
  std::remove_cvref_t<T> reduce_scatter(ReduceOp op, T&& value,
                                        mirror::source_location where = mirror::source_location::current()) {
    using N = std::remove_cvref_t<T>;
    require_cuttable_leaves<N>();
    require_reachable_leaves<N>();
    const recorded in_recorder(*this);
    std::optional<N> copy;
    N& in = input_of(value, copy);
    N result{};
    for_each_scattered_type(op, in, result, where, [&]<class E>(const detail::collective_header* header) {
      collectives_.template reduce_scatter_leaves<E>(self_, op, detail::leaves_of<E>(in), detail::leaves_of<E>(result),
                                                     header);
    });
    return result;
  }

  /// A value that is not a nest: a compile error that says why (`mirror::nest`).
  template <class T>
    requires(!nest<T>)
  void broadcast(T&&, int = 0, mirror::source_location = mirror::source_location::current()) {
    static_assert(detail::explain_not_nest<T>());
  }

  /// Every replica gets replica `from`'s `value` (`from` is a global replica id on a multi-worker
  /// strategy: worker `from / R` sends it to every other worker).
  ///
  /// **Requires**: `0 <= from < num_replicas_in_sync()` (else `mirror::error`, which `run`
  /// reports as it is, as it does the collectives' other errors); the same
  /// nest type on every replica. Resizable leaves (`std::vector`) take `from`'s size; other
  /// leaves must already have it (`mirror::shape_error` otherwise).
  /// **Effects**: returns a copy of replica `from`'s value; view leaves receive it in place.
  /// **Communication**: one copy of every leaf from `from` to each other replica. Up to 64 bytes
  /// of host leaves none of which is resizable travel in the call's one exchange (one
  /// synchronisation instead of three).
  template <nest T>
  Synced<std::remove_cvref_t<T>> broadcast(T&& value, int from = 0,
                                           mirror::source_location where = mirror::source_location::current()) {
    using N = std::remove_cvref_t<T>;
    require_reachable_leaves<N>();
    if (from < 0 || from >= num_replicas_in_sync()) {
      throw error(detail::format("mirror::ReplicaContext::broadcast(value, from = %d) at %s on replica %d: "
                                 "from must be a replica id in 0..%d",
                                 from, detail::site_text(where).c_str(), replica_id_in_sync_group(),
                                 num_replicas_in_sync() - 1));
    }
    const recorded in_recorder(*this);
    N result(std::forward<T>(value));
    if constexpr (Strategy::multi_worker) {
      // Within the source's worker, from its replica; then that worker's replica 0 sends it to
      // every other worker's replica 0; then each worker shares it locally.
      // One collective of fn, whatever the steps: they share its number.
      const int local = strategy_->num_local_replicas();
      const int root = from / local;
      const std::uint64_t sequence = enter(detail::collective_kind::broadcast, from, where, bytes_of(result));
      {
        // Nothing is written until every replica of every worker agrees on the call.
        const auto shape = broadcast_shape(result);
        collectives_.check_broadcast(
            self_, make_header<N>(detail::collective_kind::broadcast, from, shape, where, sequence), root);
      }
      if (strategy_->worker_index() == root) {
        result = local_broadcast(std::move(result), from % local, sequence, where);
      }
      collectives_.cross_broadcast(self_, result, root);
      return detail::access::synced(local_broadcast(std::move(result), 0, sequence, where));
    } else {
      const std::uint64_t sequence = enter(detail::collective_kind::broadcast, from, where, bytes_of(result));
      return detail::access::synced(local_broadcast(std::move(result), from, sequence, where));
    }
  }

 private:
  /// Every collective's check that the replicas can reach the value's leaves: a host-addressable
  /// runtime (devices::Threads) combines them with CPU loads and stores, so GPU memory cannot be.
  template <class N>
  static constexpr void require_reachable_leaves() {
    static_assert(!(Strategy::runtime_type::host_addressable && detail::has_device_leaf<N>()),
                  "mirror::ReplicaContext: the value of this collective (all_reduce, all_gather, reduce_scatter, "
                  "broadcast) holds device-resident leaves (GPU memory) but this strategy's device reads replicas' "
                  "memory on the CPU; use devices::Cuda, or host leaves");
  }

  /// What a broadcast's replicas must agree on: each leaf's size, except a resizable leaf's
  /// (any_size), which takes the source's.
  template <class N>
  static std::array<std::size_t, detail::leaf_count<N>()> broadcast_shape(N& value) {
    std::array<std::size_t, detail::leaf_count<N>()> shape{};
    std::size_t k = 0;
    detail::for_each_leaf(
        [&](auto& l) {
          using L = std::remove_cvref_t<decltype(l)>;
          shape[k++] = leaf_traits<L>::resizable ? detail::any_size : leaf_traits<L>::elements(l).size();
        },
        value);
    return shape;
  }

  /// broadcast among this process's replicas, `from` a local replica index; `sequence` is the
  /// user's broadcast's number in fn, `where` its call site.
  template <class N>
  N local_broadcast(N result, int from, std::uint64_t sequence, const mirror::source_location& where) {
    constexpr std::size_t K = detail::leaf_count<N>();
    std::array<std::size_t, K> sizes{};
    std::size_t k = 0, bytes = 0;
    detail::for_each_leaf(
        [&](auto& l) {
          const auto e = detail::elements_of(l);
          sizes[k++] = e.size();
          bytes += e.size_bytes();
        },
        result);
    const auto shape = broadcast_shape(result);
    const detail::collective_header header =
        make_header<N>(detail::collective_kind::broadcast, from, shape, where, sequence);
    if constexpr (!detail::has_device_leaf<N>() && !detail::has_resizable_leaf<N>()) {
      // A few bytes ride in the exchange itself (Strategy::broadcast_bytes). No leaf is
      // resizable, so the call's check covers every size the choice depends on: replicas whose
      // sizes differ may choose differently, but all of them then get the check's shape_error
      // from the first exchange, before anything is written.
      if (bytes <= collectives_type::small_broadcast_bytes) {
        typename collectives_type::small_broadcast_line packed{};
        // (An empty leaf may have no address at all: memcpy must not see it.)
        const auto each_leaf = [&](auto&& move) {
          std::size_t at = 0;
          detail::for_each_leaf(
              [&](auto& l) {
                const auto e = detail::elements_of(l);
                if (!e.empty()) move(static_cast<void*>(e.data()), packed.data + at, e.size_bytes());
                at += e.size_bytes();
              },
              result);
        };
        if (self_ == from) each_leaf([](void* leaf, unsigned char* slot, std::size_t n) { std::memcpy(slot, leaf, n); });
        collectives_.broadcast_bytes(self_, from, header, packed);
        if (self_ != from) each_leaf([](void* leaf, unsigned char* slot, std::size_t n) { std::memcpy(leaf, slot, n); });
        return result;
      }
    }
    // The source's sizes are read from its frame; it waits in the copy exchange below meanwhile.
    const std::size_t* root_sizes = collectives_.exchange_sizes(self_, header, sizes.data());
    if (self_ != from) {
      k = 0;
      detail::for_each_leaf(
          [&](auto& l) {
            using L = std::remove_cvref_t<decltype(l)>;
            if constexpr (leaf_traits<L>::resizable) leaf_traits<L>::resize(l, root_sizes[k]);
            ++k;
          },
          result);
    }
    detail::for_each_type(detail::element_types_t<N>{}, [&]<class E>() {
      collectives_.template broadcast_leaves<E>(self_, from, detail::leaves_of<E>(result));
    });
    return result;
  }

 public:
  /// \name Non-blocking collectives (docs/guide.md\#overlapping-communication)
  /// Each starts its collective and returns a `mirror::Pending` whose `wait()` gives what the
  /// blocking form returns, with the same bits. Collectives are matched across replicas in the
  /// order they are started, blocking ones included; several may be outstanding, and they
  /// complete in that order. A span leaf belongs to the collective until `wait()`. The blocking
  /// form's errors are thrown by the start call or by `wait()`, on every replica.
  ///
  /// **Progress**: on `devices::Cluster` (`ops::Hierarchical`), `all_reduce_async` does the
  /// local phase at the start and leaves the cross-worker step to the worker's communication
  /// thread while `fn` goes on; so does `reduce_scatter_async` with one local replica (with
  /// several it completes in the start call). On `devices::Cuda` with `ops::NcclAllReduce`, both
  /// enqueue NCCL's work on the replica's communication stream and `wait()` makes the replica's
  /// stream wait for it (no host wait, as every collective there completes in stream order), so
  /// kernels enqueued in between run beside NCCL. Everywhere else, and for `all_gather_async` and
  /// `broadcast_async`, the collective completes inside the start call (the replicas' own threads, or their streams, do the
  /// reduction) and `wait()` only hands over the result.
  ///@{

  /// A value that is not a nest: a compile error that says why (`mirror::nest`).
  template <class T>
    requires(!nest<T>)
  void all_reduce_async(ReduceOp, T&&, mirror::source_location = mirror::source_location::current()) {
    static_assert(detail::explain_not_nest<T>());
  }

  /// `all_reduce`, started. **Example**:
  /// `auto p = ctx.all_reduce_async(mirror::ReduceOp::sum, std::span<float>(grads)); ...; p.wait();`
  template <nest T>
  Pending<Synced<std::remove_cvref_t<T>>> all_reduce_async(
      ReduceOp op, T&& value, mirror::source_location where = mirror::source_location::current()) {
    using N = std::remove_cvref_t<T>;
    if constexpr (collectives_type::starts_all_reduce) {
      return start_all_reduce<N>(op, std::forward<T>(value), where);
    } else {
      return Pending<Synced<N>>(all_reduce(op, std::forward<T>(value), where));
    }
  }

  /// `reduce_scatter`, started: `wait()` gives this replica's cut.
  template <nest T>
  Pending<std::remove_cvref_t<T>> reduce_scatter_async(
      ReduceOp op, T&& value, mirror::source_location where = mirror::source_location::current()) {
    using N = std::remove_cvref_t<T>;
    if constexpr (collectives_type::starts_reduce_scatter) {
      return start_reduce_scatter<N>(op, std::forward<T>(value), where);
    } else {
      return Pending<N>(reduce_scatter(op, std::forward<T>(value), where));
    }
  }

  /// `all_gather(value, axis0)`, started.
  template <nest T>
  Pending<Synced<detail::gathered_t<std::remove_cvref_t<T>>>> all_gather_async(
      T&& value, axis_t<0> axis, mirror::source_location where = mirror::source_location::current()) {
    return Pending<Synced<detail::gathered_t<std::remove_cvref_t<T>>>>(all_gather(std::forward<T>(value), axis, where));
  }

  /// `broadcast`, started.
  template <nest T>
  Pending<Synced<std::remove_cvref_t<T>>> broadcast_async(
      T&& value, int from = 0, mirror::source_location where = mirror::source_location::current()) {
    return Pending<Synced<std::remove_cvref_t<T>>>(broadcast(std::forward<T>(value), from, where));
  }

  /// A value that is not a nest: a compile error that says why (`mirror::nest`).
  template <class T>
    requires(!nest<T>)
  void gradient_buckets(ReduceOp, T&, std::size_t, mirror::source_location = mirror::source_location::current()) {
    static_assert(detail::explain_not_nest<T>());
  }

  /// A DDP-style bucketed all-reduce of `grads`, a nest of gradient buffers (1-D `std::span` or
  /// `std::vector` leaves), reduced in place with `op` (mirror/gradient_buckets.hpp).
  template <nest T>
  GradientBuckets<T> gradient_buckets(ReduceOp op, T& grads, std::size_t bucket_bytes,
                                      mirror::source_location where = mirror::source_location::current()) {
    return GradientBuckets<T>(*this, op, grads, bucket_bytes, where);
  }

  /// The same buckets, reduce-scattered: afterwards this replica's cut of each leaf holds the
  /// reduced gradient's cut, for a variable's `update_sharded(step, buckets, states...)`.
  template <nest T>
  GradientBuckets<T, true> gradient_buckets(ReduceOp op, T& grads, std::size_t bucket_bytes, sharded_t,
                                            mirror::source_location where = mirror::source_location::current()) {
    return GradientBuckets<T, true>(*this, op, grads, bucket_bytes, where);
  }
  ///@}

  /// Runs `fn(strategy, PerReplica<Args>...)` once, in cross-replica context, with every
  /// replica's arguments gathered; every replica gets its result as `Synced` (or nothing when
  /// `fn` returns void). Inside `fn`, `strategy.reduce(...)` and `strategy.broadcast(...)` work.
  ///
  /// **Requires**: every replica calls it at the same point with the same argument types.
  /// **Effects**: the arguments are copied once into the `PerReplica` values; `fn` runs on
  /// replica 0's thread while the others wait.
  /// **Errors**: an exception from `fn` propagates out of `run` (as `replica_error` on replica 0
  /// unless it is a `mirror::error`).
  /// **Call site**: with up to four arguments the call's location is captured, as for the other
  /// collectives (a pack cannot be followed by a defaulted parameter, so each count is an
  /// overload); with more, messages name "an unknown call site".
  template <class F>
  auto merge_call(F&& fn, mirror::source_location where = mirror::source_location::current()) {
    return merge_call_at(where, std::forward<F>(fn));
  }
  /// (merge_call with one argument)
  template <class F, class A1>
  auto merge_call(F&& fn, A1&& a1, mirror::source_location where = mirror::source_location::current()) {
    return merge_call_at(where, std::forward<F>(fn), std::forward<A1>(a1));
  }
  /// (merge_call with two arguments)
  template <class F, class A1, class A2>
  auto merge_call(F&& fn, A1&& a1, A2&& a2, mirror::source_location where = mirror::source_location::current()) {
    return merge_call_at(where, std::forward<F>(fn), std::forward<A1>(a1), std::forward<A2>(a2));
  }
  /// (merge_call with three arguments)
  template <class F, class A1, class A2, class A3>
  auto merge_call(F&& fn, A1&& a1, A2&& a2, A3&& a3, mirror::source_location where = mirror::source_location::current()) {
    return merge_call_at(where, std::forward<F>(fn), std::forward<A1>(a1), std::forward<A2>(a2),
                         std::forward<A3>(a3));
  }
  /// (merge_call with four arguments)
  template <class F, class A1, class A2, class A3, class A4>
  auto merge_call(F&& fn, A1&& a1, A2&& a2, A3&& a3, A4&& a4,
                  mirror::source_location where = mirror::source_location::current()) {
    return merge_call_at(where, std::forward<F>(fn), std::forward<A1>(a1), std::forward<A2>(a2),
                         std::forward<A3>(a3), std::forward<A4>(a4));
  }
  /// (merge_call with five arguments or more: no call site)
  template <class F, class... Args>
    requires(sizeof...(Args) > 4)
  auto merge_call(F&& fn, Args&&... args) {
    return merge_call_at(mirror::source_location{}, std::forward<F>(fn), std::forward<Args>(args)...);
  }

 private:
  template <class F, class... Args>
  auto merge_call_at(const mirror::source_location& where, F&& fn, Args&&... args) {
    using Result = std::invoke_result_t<F&, Strategy&, PerReplica<std::decay_t<Args>>...>;
    static_assert(!detail::is_synced<Result>::value,
                  "mirror::ReplicaContext::merge_call(fn, args...): fn runs in cross-replica context "
                  "and must return a plain value (merge_call wraps it in Synced)");
    const recorded in_recorder(*this);
    const auto mine = std::forward_as_tuple(std::as_const(args)...);
    using Args_tuple = decltype(mine);
    const std::array<std::size_t, 0> no_sizes{};
    const detail::collective_header header = make_header<std::tuple<F, std::decay_t<Args>...>>(
        detail::collective_kind::merge_call, 0, no_sizes, where);
    auto gather = [&](std::span<const void* const> all) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple<PerReplica<std::decay_t<Args>>...>(
            PerReplica<std::decay_t<Args>>(collect<I, Args_tuple>(all))...);
      }(std::index_sequence_for<Args...>{});
    };
    if constexpr (std::is_void_v<Result>) {
      collectives_.merge(self_, header, static_cast<const void*>(&mine), [&](std::span<const void* const> all) {
        std::apply([&](auto&&... pr) { fn(*strategy_, std::move(pr)...); }, gather(all));
        return static_cast<const void*>(nullptr);
      });
    } else {
      std::optional<Result> result;
      const void* produced = collectives_.merge(
          self_, header, static_cast<const void*>(&mine), [&](std::span<const void* const> all) {
            result.emplace(std::apply([&](auto&&... pr) { return fn(*strategy_, std::move(pr)...); }, gather(all)));
            return static_cast<const void*>(&*result);
          });
      Synced<Result> out = detail::access::synced(Result(*static_cast<const Result*>(produced)));
      collectives_.end_merge(self_);
      return out;
    }
  }

  using collectives_type = detail::replica_collectives<typename Strategy::runtime_type, typename Strategy::ops_type>;
  template <class, bool> friend class GradientBuckets;

  /// An all_reduce_async in flight where the ops policy starts it (collectives_type::starts_all_reduce):
  /// the nest (its owning leaves live here until wait()) and each element type's started part.
  template <class N, class Types = detail::element_types_t<N>>
  class all_reduce_in_flight;
  template <class N, class... Es>
  class all_reduce_in_flight<N, detail::type_list<Es...>> final : public detail::async_result<Synced<N>> {
   public:
    explicit all_reduce_in_flight(N v) : nest(std::move(v)) {}
    bool done() const noexcept override {
      return std::apply([](const auto&... p) { return (true && ... && p.done()); }, parts);
    }
    N nest;
    // Per element type, the collectives layer's started part (for that type's leaves of N).
    template <class E>
    using part = typename collectives_type::template started_all_reduce<
        E, std::tuple_size_v<decltype(detail::leaves_of<E>(std::declval<N&>()))>>::type;
    std::tuple<part<Es>...> parts;

   protected:
    void complete() override {
      std::apply([](auto&... p) { (p.finish(), ...); }, parts);
      this->value.emplace(detail::access::synced(std::move(nest)));
    }
  };

  template <class N, class T>
  Pending<Synced<N>> start_all_reduce(ReduceOp op, T&& value, const mirror::source_location& where) {
    require_reachable_leaves<N>();
    const recorded in_recorder(*this);
    auto started = std::make_unique<all_reduce_in_flight<N>>(N(std::forward<T>(value)));
    N& result = started->nest;
    for_each_reduced_type(op, result, where, [&]<class E>(const detail::collective_header* header) {
      std::get<typename all_reduce_in_flight<N>::template part<E>>(started->parts) =
          collectives_.template all_reduce_start<E>(self_, op, detail::leaves_of<E>(result), header);
    });
    return Pending<Synced<N>>(std::move(started), async_);
  }

  /// A reduce_scatter_async in flight where the ops policy starts it
  /// (collectives_type::starts_reduce_scatter): the input nest (its owning leaves live here until
  /// wait()), the result (cuts: views into a span input, or vectors of the cut's length) and
  /// each element type's started part.
  template <class N, class Types = detail::element_types_t<N>>
  class reduce_scatter_in_flight;
  template <class N, class... Es>
  class reduce_scatter_in_flight<N, detail::type_list<Es...>> final : public detail::async_result<N> {
   public:
    explicit reduce_scatter_in_flight(N v) : input(std::move(v)) {}
    bool done() const noexcept override {
      return std::apply([](const auto&... p) { return (true && ... && p.done()); }, parts);
    }
    N input;
    N result{};
    // Per element type, the collectives layer's started part (for that type's leaves of N).
    template <class E>
    using part = typename collectives_type::template started_reduce_scatter<
        E, std::tuple_size_v<decltype(detail::leaves_of<E>(std::declval<N&>()))>>::type;
    std::tuple<part<Es>...> parts;

   protected:
    void complete() override {
      std::apply([](auto&... p) { (p.finish(), ...); }, parts);
      this->value.emplace(std::move(result));
    }
  };

  template <class N, class T>
  Pending<N> start_reduce_scatter(ReduceOp op, T&& value, const mirror::source_location& where) {
    require_cuttable_leaves<N>();
    require_reachable_leaves<N>();
    const recorded in_recorder(*this);
    auto started = std::make_unique<reduce_scatter_in_flight<N>>(N(std::forward<T>(value)));
    for_each_scattered_type(op, started->input, started->result, where,
                            [&]<class E>(const detail::collective_header* header) {
                              std::get<typename reduce_scatter_in_flight<N>::template part<E>>(started->parts) =
                                  collectives_.template reduce_scatter_start<E>(
                                      self_, op, detail::leaves_of<E>(started->input),
                                      detail::leaves_of<E>(started->result), header);
                            });
    return Pending<N>(std::move(started), async_);
  }

  /// reduce_scatter's leaves are 1-D and can hold a cut of any length.
  template <class N>
  static constexpr void require_cuttable_leaves() {
    static_assert([]<class... Ls>(detail::type_list<Ls...>) {
                    return (true && ... && (leaf_traits<Ls>::rank == 1 && (leaf_traits<Ls>::resizable || leaf_traits<Ls>::is_view) &&
                                            !detail::is_fixed_extent_span<Ls>::value));
                  }(detail::leaf_types_t<N>{}),
                  "mirror::ReplicaContext::reduce_scatter(op, value): every leaf must be 1-D and hold a cut of any "
                  "length: std::vector or std::span (a scalar has nothing to cut, a std::array cannot change its "
                  "length, a matrix is not 1-D: pass its elements as a std::span; a std::span<E, Extent> of a fixed "
                  "extent cannot view a cut of another length: pass a std::span<E>)");
  }

  /// The reduce-scatter (blocking or started) of `in` into `result` up to the ops policy: each
  /// leaf of `result` made this replica's cut (a view into a span of `in`, or a vector of the
  /// cut's length), the agreement header, then `each.template operator()<E>(header)` for every
  /// element type E of N, the header riding on the first type's collective (null for the others).
  template <class N, class Each>
  void for_each_scattered_type(ReduceOp op, N& in, N& result, const mirror::source_location& where, Each&& each) {
    std::array<std::size_t, detail::leaf_count<N>()> sizes{};
    const int n = num_replicas_in_sync(), g = replica_id_in_sync_group();
    std::size_t k = 0;
    detail::for_each_leaf(
        [&](auto& l, auto& out) {
          using L = std::remove_cvref_t<decltype(l)>;
          sizes[k] = leaf_traits<L>::elements(l).size();
          const auto cut = backend::cut_of(sizes[k++], n, g);
          if constexpr (leaf_traits<L>::is_view) {
            out = L(leaf_traits<L>::elements(l).data() + cut.first, cut.second);
          } else {
            leaf_traits<L>::resize(out, cut.second);
          }
        },
        in, result);
    const detail::collective_header header =
        make_header<N>(detail::collective_kind::reduce_scatter, static_cast<int>(op), sizes, where, 0, bytes_of(in));
    const detail::collective_header* first = &header;
    detail::for_each_type(detail::element_types_t<N>{}, [&]<class E>() {
      each.template operator()<E>(first);
      first = nullptr;
    });
  }

  /// The all-reduce of `result` (blocking or started) up to the ops policy: its agreement header,
  /// then `each.template operator()<E>(header)` for every element type E of N, the header
  /// riding on the first type's collective (null for the others).
  template <class N, class Each>
  void for_each_reduced_type(ReduceOp op, N& result, const mirror::source_location& where, Each&& each) {
    std::array<std::size_t, detail::leaf_count<N>()> sizes{};
    std::size_t k = 0;
    detail::for_each_leaf([&](auto& l) { sizes[k++] = detail::elements_of(l).size(); }, result);
    detail::collective_header header =
        make_header<N>(detail::collective_kind::all_reduce, static_cast<int>(op), sizes, where, 0, bytes_of(result));
    header.in_place = !detail::all_leaves_own<N>();
    const detail::collective_header* first = &header;
    detail::for_each_type(detail::element_types_t<N>{}, [&]<class E>() {
      each.template operator()<E>(first);
      first = nullptr;
    });
  }

  /// At the end of fn (Strategy::run): completes what fn started and never waited for, and
  /// throws the first error among those (every replica does the same).
  void finish_started() { async_.finish(); }

  /// `track`: this replica's timeline track, or null with the timeline off.
  ReplicaContext(Strategy& s, int self, FlightRecorder& recorder, detail::trace_track* track) noexcept
      : strategy_(&s), collectives_(s.runtime(), s.ops()), self_(self), recorder_(&recorder), track_(track) {
    detail::recorder_writer::begin_run(recorder, self);
    detail::current_recorder = &recorder;
    detail::current_track = track;
    if (track != nullptr) track->fn_begin = detail::trace_now();
  }

  /// Ends the collective that the enclosing public call entered (if it entered one) in the
  /// flight recorder and the timeline: completed, or failed when an exception leaves the call.
  class recorded {
   public:
    explicit recorded(ReplicaContext& c) noexcept
        : c_(c), before_(c.sequence_), exceptions_(c.diagnosed() ? std::uncaught_exceptions() : 0) {}
    recorded(const recorded&) = delete;
    recorded& operator=(const recorded&) = delete;
    ~recorded() {
      if (!c_.diagnosed() || c_.sequence_ == before_) return;
      const bool failed = std::uncaught_exceptions() > exceptions_;
      detail::recorder_writer::finish(*c_.recorder_, c_.self_, failed);
      if (c_.track_ != nullptr) {
        detail::trace_event& e = c_.track_->open;
        e.end = detail::trace_now();
        e.failed = failed;
        c_.track_->push(e);
      }
    }

   private:
    ReplicaContext& c_;
    std::uint64_t before_;
    int exceptions_;
  };
  /// Whether a collective's end is recorded (the flight recorder keeps records, or the timeline is on).
  bool diagnosed() const noexcept { return recorder_->kept() != 0 || track_ != nullptr; }

  /// What a nest's leaves hold, in bytes (for the flight recorder).
  template <class N>
  std::uint64_t bytes_of(const N& nest) const noexcept {
    std::uint64_t bytes = 0;
    if (!diagnosed()) return bytes;
    detail::for_each_leaf(
        [&](const auto& l) {
          bytes += detail::elements_of(l).size() * sizeof(leaf_element_t<std::remove_cvref_t<decltype(l)>>);
        },
        nest);
    return bytes;
  }
  friend Strategy;
  template <class> friend class MirroredVariable;  // update_sharded's gather_cuts

  template <std::size_t I, class Tuple>
  static std::vector<std::decay_t<std::tuple_element_t<I, Tuple>>> collect(std::span<const void* const> all) {
    std::vector<std::decay_t<std::tuple_element_t<I, Tuple>>> v;
    v.reserve(all.size());
    for (const void* p : all) v.push_back(std::get<I>(*static_cast<const Tuple*>(p)));
    return v;
  }

  /// Starts this replica's next collective of fn, passing `bytes`: its number, which becomes
  /// the thread's detail::current_position (for error messages) and this replica's latest call
  /// in the flight recorder (for the other replicas' timeouts, and its records).
  std::uint64_t enter(detail::collective_kind kind, int param, const mirror::source_location& where,
                      std::uint64_t bytes) noexcept {
    const std::uint64_t sequence = ++sequence_;
    detail::current_position = {sequence, kind, param, where};
    detail::recorder_writer::start(*recorder_, self_, detail::current_position, bytes);
    if (track_ != nullptr) {
      detail::trace_event& e = track_->open;
      e = {};
      e.begin = detail::trace_now();
      e.kind = detail::trace_kind::collective;
      e.sequence = sequence;
      e.call = detail::pack_call(kind, param);
      e.bytes = bytes;
      e.where = where;
    }
    return sequence;
  }

  /// The header of one step of this replica's collective number `sequence` in fn (0: the next
  /// collective, which make_header enters with `bytes`; a broadcast enters and numbers itself).
  template <class N, std::size_t K>
  detail::collective_header make_header(detail::collective_kind kind, int param,
                                        const std::array<std::size_t, K>& sizes, const mirror::source_location& where,
                                        std::uint64_t sequence = 0, std::uint64_t bytes = 0) {
    if (sequence == 0) sequence = enter(kind, param, where, bytes);
    return {kind,
            param,
            sequence,
            &typeid(N),
            K,
            detail::shape_hash(sizes.data(), K, detail::nest_hash<N>()),
            sizes.data(),
            detail::leaf_type_infos<N>,
            false,
            where};
  }

  /// The last step of MirroredVariable's update_sharded: every replica's cut of each leaf of its
  /// `copy` (owning 1-D leaves, the same lengths on every replica) into every replica's copy, in
  /// place. The lengths are known everywhere, so only the agreement check is exchanged.
  template <class N>
  void gather_cuts(N& copy, const mirror::source_location& where) {
    const recorded in_recorder(*this);
    constexpr std::size_t K = detail::leaf_count<N>();
    std::array<std::size_t, K> sizes{};
    std::size_t k = 0;
    detail::for_each_leaf([&](auto& l) { sizes[k++] = detail::elements_of(l).size(); },
                          copy);
    const detail::collective_header header =
        make_header<N>(detail::collective_kind::all_gather, 0, sizes, where, 0, bytes_of(copy));
    const detail::collective_header* pending = &header;
    const int n = num_replicas_in_sync(), g = replica_id_in_sync_group();
    detail::for_each_type(detail::element_types_t<N>{}, [&]<class E>() {
      const auto full = detail::leaves_of<E>(copy);
      std::array<std::span<const E>, full.size()> cuts{};
      std::vector<std::size_t> counts(static_cast<std::size_t>(n) * full.size());
      for (std::size_t j = 0; j < full.size(); ++j) {
        const auto [first, count] = backend::cut_of(full[j].size(), n, g);
        cuts[j] = full[j].subspan(first, count);
        for (int q = 0; q < n; ++q) counts[static_cast<std::size_t>(q) * full.size() + j] = backend::cut_of(full[j].size(), n, q).second;
      }
      collectives_.template all_gather_leaves<E>(self_, cuts, counts, full, pending);
      pending = nullptr;
    });
  }

  /// The value reduce_scatter reads its inputs from: `value` itself where the replicas
  /// read host memory in place (nothing is written to it; spans are the caller's to change),
  /// else a copy in `copy` (a device that stages host leaves writes them back afterwards).
  template <class N, class T>
  static N& input_of(T&& value, std::optional<N>& copy) {
    if constexpr (Strategy::runtime_type::host_addressable) {
      return const_cast<N&>(static_cast<const N&>(value));
    } else {
      return copy.emplace(std::forward<T>(value));
    }
  }

  /// Leaf k's total over the replicas of counts (replica-major, K leaves each).
  static std::size_t total_of(const std::vector<std::size_t>& counts, std::size_t K, std::size_t k) noexcept {
    std::size_t total = 0;
    for (std::size_t i = k; i < counts.size(); i += K) total += counts[i];
    return total;
  }

  /// all_gather's first step: every replica's leaf lengths, in replica order (N*K, global on a
  /// multi-worker strategy), after checking that the replicas agree on the nest, the widths and
  /// the element kinds (`element_kind::code()`), and that a span form's `out_size` is the total
  /// (any_size: no span form). `data`, `data_bytes`: the one leaf's elements where K == 1 (else
  /// null, 0), which may travel with the counts across workers.
  template <class N, std::size_t K>
  const std::vector<std::size_t>& gather_counts(const std::array<std::size_t, K>& counts,
                                                const std::array<std::size_t, K>& widths,
                                                const std::array<std::size_t, K>& kinds, std::size_t out_size,
                                                const mirror::source_location& where, std::uint64_t bytes,
                                                const void* data, std::size_t data_bytes) {
    std::array<std::size_t, K> shape{};
    shape.fill(detail::any_size);  // the lengths may differ: they are checked below, not hashed
    const detail::collective_header header =
        make_header<N>(detail::collective_kind::all_gather, 0, shape, where, 0, bytes);
    collectives_.gather_counts(self_, header, counts.data(), widths.data(), kinds.data(), K, out_size, data,
                               data_bytes, counts_);
    return counts_;
  }

  Strategy* strategy_;
  collectives_type collectives_;  // every collective goes through it to the ops policy
  int self_;
  FlightRecorder* recorder_;         // the strategy's: this replica's lane is self_
  detail::trace_track* track_;       // this replica's timeline track (null: the timeline is off)
  std::vector<std::size_t> counts_;  // gather_counts' result, reused by the replica's next all_gather
  std::uint64_t sequence_ = 0;
  detail::async_queue async_;  // started collectives not yet complete (destroyed first: completes them)
};

}  // namespace mirror
