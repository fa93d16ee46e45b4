// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The `mirror::cross_device_ops<Ops, Device>` concept: a cross-replica reduction algorithm.
///
/// The types a policy receives are the public backend API (`mirror/backend.hpp`; a walk-through
/// of writing a policy in docs/backend.md).
///
/// **What it models.** A policy (a small aggregate, `operator==` defaulted) that all-reduces the
/// leaves of one element type of a nest, called concurrently by every replica of a `run`; and,
/// for the collectives beyond all-reduce, reduce-scatters and all-gathers them.
///
/// **Minimal complete definition** (runtime type `Rt` of the device, element type `E`):
/// - `void all_reduce(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& s) const`:
///   on return, every replica's leaves in `s` hold the reduction of all replicas' leaves. Its
///   first synchronisation must be `c.exchange(...)` (which also checks that the replicas agree),
///   and it must not return before other replicas are done with its buffers.
/// - optionally `void validate(const Rt&) const`, called by `Strategy`'s constructor, throwing
///   `std::invalid_argument` for a setting the device cannot honour.
///
/// **For `ctx.reduce_scatter` and `ctx.all_gather`** (docs/guide.md\#collectives-inside-run; a
/// strategy whose policy lacks them compiles until it calls them, then a static_assert names
/// the member):
/// - `void reduce_scatter(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& in,
///   const backend::segment_list<Rt, E>& out) const`: `in` is this replica's leaves (the same
///   lengths on every replica); `out.leaves[k]` (`backend::cut_of(in.sizes[k], N, g)` elements, g
///   the global replica id, N all replicas) receives the `op`-reduction of cut g of leaf k, with
///   the bits the policy's `all_reduce` gives those elements (a policy that cannot promise it,
///   like `NcclAllReduce` for floating-point sums over three replicas or more, says so). `out` may be this replica's own
///   cut of `in` (in place). First synchronisation `c.exchange(...)`, as for `all_reduce`.
/// - `void all_gather(backend::collective<Rt>& c, const backend::const_segment_list<Rt, E>& in,
///   std::span<const std::size_t> counts, const backend::segment_list<Rt, E>& out) const`:
///   `counts[g * K + k]` is replica g's length of leaf k (K leaves; the same on every replica,
///   which, like the element type, the caller has checked across workers);
///   `out.leaves[k]` receives every replica's leaf k in replica order. `in` may be this replica's
///   own part of `out` (in place).
/// (`out` may alias `in`, so `reduce_scatter`'s `in` is not read-only; `all_gather`'s is.)
/// `backend::generic_reduce_scatter` and `backend::generic_all_gather`
/// (mirror/backend/generic_collectives.hpp) implement both with the device primitives alone.
///
/// **Laws.** The all-reduce of identical values v is v for min and max, N·v for sum (in exact
/// arithmetic), v for mean; the result is the same on every replica, and the same bits on every
/// run for the same inputs and replica count.
///
/// **Models.** `ops::ReductionToOneDevice` (`mirror/ops/reduction_to_one_device.hpp`) and
/// `ops::HierarchicalCopy` (`mirror/ops/hierarchical_copy.hpp`) on every device;
/// `ops::ChunkOwnerAllReduce` (`backends/threads/chunk_owner_all_reduce.hpp`) on host-addressable
/// devices.

#include <mirror/concepts/device.hpp>
#include <mirror/backend/collective.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror {

/// Satisfied when `Ops` can all-reduce on device policy `Device` (see the file comment).
template <class Ops, class Device>
concept cross_device_ops =
    device<Device> && std::equality_comparable<Ops> &&
    requires(const Ops& ops, backend::collective<runtime_t<Device>>& c,
             const backend::segment_list<runtime_t<Device>, float>& s) {
      ops.all_reduce(c, ReduceOp::sum, s);
    };

}  // namespace mirror
