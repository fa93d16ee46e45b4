// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The `mirror::device` concept: where replicas live and how their memory is reached.
///
/// **What it models.** A device *policy* is a small aggregate a user writes in one line
/// (`devices::Threads{.replicas = 4}`). It names a *runtime* type, built once per `Strategy` from
/// the policy, that owns the replicas' execution resources (threads, streams, communicators).
/// Replicas need not share memory: generic cross-device ops reach other replicas' buffers only
/// through the runtime's copy and combine primitives, so they run unchanged on GPUs or across
/// processes.
///
/// **Minimal complete definition** (runtime `rt`, replica id `self` of the calling replica,
/// element type `E`, `p`, `q` of type `rt_t::pointer<E>`):
/// - `using runtime = ...;` in the policy; `runtime(const Policy&)` constructs it.
/// - `rt.num_replicas()` → `int`.
/// - Execution: `rt.parallel(f)` calls `f(int replica)` once per replica, concurrently, and returns
///   when all have returned (`f` does not throw); `rt.cancel()` makes every pending and later
///   `exchange`/`barrier` of this `parallel` call throw `mirror::backend::collective_cancelled_rethrow_me`;
///   `rt.in_parallel()` is true on a thread currently running an `f`.
/// - Control plane (called by every replica in the same order): `rt.exchange(self, payload)` is an
///   all-gather of a small trivially copyable value (at most `max_exchange_bytes`) and a barrier;
///   it returns `backend::exchanged<P>`, every replica's payload in replica order, valid until
///   `self`'s next exchange or barrier. `rt.barrier(self)`.
/// - Memory plane: `pointer<E>` is a handle into one replica's memory supporting `p + n` (a raw
///   `E*` on host devices, an opaque handle elsewhere). `rt.attach(self, std::span<E>)` makes a
///   host leaf visible on `self` and `rt.detach(self, p, std::span<E>)` writes it back; for a
///   read-only input they take `std::span<const E>` and `pointer<const E>`, and `detach` only
///   releases what `attach` staged;
///   `rt.scratch<E>(self, n)` is `self`'s scratch space, valid until `self`'s next `scratch` and
///   at most until the parallel call ends (a runtime may free what a later call does not need);
///   `rt.copy(self, p, q, n)` copies `n` elements from `q` to `p`, `rt.combine(self, op, p, q, n)`
///   sets `p[i] = p[i] op q[i]` (`q` may be a `pointer<const E>` in both),
///   `rt.divide(self, p, n, count)` divides by `count` (for mean), whichever replicas `p` and `q`
///   live on.
/// - `static constexpr bool host_addressable`: true when `pointer<E>` is `E*` into memory every
///   replica's thread can read and write (policies such as the CPU chunk-owner all-reduce need it).
///
/// - Optional, for runtimes that are not `host_addressable`: `template <class E> using view` and
///   `rt.stage_argument<E>(self, slot, std::span<const E>)` → `view<const E>`, a copy of a host
///   array on `self`'s device for `fn` to read (run copies shared host arguments this way,
///   docs/cuda.md\#host-arguments-of-run; mirror/detail/staged_argument.hpp). Without them such
///   arguments are a compile error naming this hook.
/// - Optional: `rt.fold_into_all(self, op, parts, count, n)` → `bool` and `Rt::max_fold_parts`:
///   folds `n` elements of `count` parts in part order (divided by `count` for mean) into every
///   part in one pass, with the bits of `copy`, `combine` and `divide`, or returns false having
///   done nothing (`ops::ReductionToOneDevice` then composes those; backends/cuda has it).
/// - Optional: `rt.fail_collective(std::exception_ptr)`: `cancel()`, with that error as what every
///   waiting and later `exchange`/`barrier` of the parallel call throws instead of the cancellation
///   (`backend::collective::for_all_replicas`; the threads runtime and those built on it have it).
///
/// **Laws.** `exchange` returns the same span contents on every replica; `copy` then `combine`
/// are equivalent to the host loop `p[i] = p[i] op q[i]` in element order.
///
/// **Devices without shared memory, and devices across processes.** Payloads of `exchange`
/// are copied by value, so a runtime may carry them between processes (an all-gather); the
/// pointer arrays the generic policies exchange are only read on the replica's own process.
/// A device that wraps a local one across processes (`devices::Cluster<Local>`, multi-worker)
/// keeps the local runtime for the local phase and pairs with a hierarchical ops policy (local
/// reduce, one cross-process all-reduce per step, local broadcast) rather than running the
/// single-process policies over the network: `cross_device_ops<Ops, Device>` is checked per
/// pair, so an unsupported pair is a compile error, not a slow path.
///
/// **Models.** `mirror::devices::Threads` (`backends/threads/threads_device.hpp`);
/// `mirror::test::FakeDevice` (`tests/support/fake_device.hpp`, buffers reachable only by copy).

#include <concepts>
#include <cstddef>
#include <mirror/backend/collective_cancelled.hpp>
#include <mirror/backend/exchanged.hpp>
#include <mirror/reduce_op.hpp>
#include <span>

namespace mirror {
namespace detail {

struct probe_payload {
  int value;
};

/// What the concept hands `rt.parallel`: a named type, not a lambda, because nvcc 13 rejects a
/// lambda in a requires-expression, which made every `device<...>` check fail in `.cu` files.
struct probe_replica_fn {
  void operator()(int) const noexcept {}
};

}  // namespace detail

/// Satisfied by the runtime type of a device policy (see the file comment).
template <class Rt>
concept device_runtime = requires(Rt& rt, int self, std::span<float> host, std::span<const float> input,
                                  typename Rt::template pointer<float> p, typename Rt::template pointer<const float> q,
                                  ReduceOp op) {
  { rt.num_replicas() } -> std::convertible_to<int>;
  rt.parallel(detail::probe_replica_fn{});
  rt.cancel();
  { rt.in_parallel() } -> std::convertible_to<bool>;
  { rt.exchange(self, detail::probe_payload{0}) } -> std::same_as<backend::exchanged<detail::probe_payload>>;
  rt.barrier(self);
  { rt.attach(self, host) } -> std::same_as<typename Rt::template pointer<float>>;
  rt.detach(self, p, host);
  { rt.template scratch<float>(self, std::size_t{1}) } -> std::same_as<typename Rt::template pointer<float>>;
  { rt.attach(self, input) } -> std::same_as<typename Rt::template pointer<const float>>;
  rt.detach(self, q, input);
  rt.copy(self, p, p, std::size_t{1});
  rt.copy(self, p, q, std::size_t{1});
  rt.combine(self, op, p, p, std::size_t{1});
  rt.combine(self, op, p, q, std::size_t{1});
  rt.divide(self, p, std::size_t{1}, std::size_t{1});
  { p + std::size_t{1} } -> std::same_as<typename Rt::template pointer<float>>;
  { Rt::host_addressable } -> std::convertible_to<bool>;
};

/// Satisfied by a device policy: an aggregate naming a runtime built from it.
template <class D>
concept device = requires { typename D::runtime; } &&
                 std::constructible_from<typename D::runtime, const D&> &&
                 device_runtime<typename D::runtime>;

/// The runtime type of device policy D.
template <class D>
using runtime_t = typename D::runtime;

}  // namespace mirror
