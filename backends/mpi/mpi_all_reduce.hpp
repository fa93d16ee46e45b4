// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::MpiAllReduce`: the cross-worker step of `ops::Hierarchical`.

#include <cstddef>
#include <span>
#include <vector>
#include <mirror/detail/worker_group.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// One in-place `MPI_Iallreduce` of a worker's staging buffer across workers, posted in program
/// order (by the calling thread, or by the worker's communication thread when something started
/// earlier is queued) and polled with `MPI_Test`, so a timeout or a failure elsewhere can end it.
/// Up to 112 bytes travel in the agreement check's own message instead
/// (docs/multi-worker.md\#small-messages). `sum` (and `mean`'s sum), `min`, `max`, `prod` map to
/// `MPI_SUM`, `MPI_MIN`, `MPI_MAX`, `MPI_PROD`.
///
/// **Determinism**: by default the order across workers is Open MPI's; it is the same run after run
/// for the same W, count and MCA settings (tests/mpi/cluster_test.cpp checks it), not guaranteed by
/// the MPI standard, and it changes with the algorithm Open MPI picks. `.deterministic = true`
/// folds every element in worker order, (((w0 op w1) op w2) ...), on any MPI configuration: an
/// all-to-all of W slices, a local fold, an all-gather (the bytes of a ring all-reduce; one more
/// collective, so small messages pay one more latency). It applies to every floating-point
/// cross-worker reduction of the strategy (`Strategy::reduce` and sync-on-read values too).
/// **Example**:
/// \code
/// using Ops = mirror::ops::Hierarchical<mirror::ops::ChunkOwnerAllReduce, mirror::ops::MpiAllReduce>;
/// mirror::Strategy<mirror::devices::Cluster<mirror::devices::Threads>, Ops> s{{}, Ops{.cross = {.deterministic = true}}};
/// \endcode
struct MpiAllReduce {
  /// Fold the workers' values in worker order instead of MPI's order.
  bool deterministic = false;

  friend bool operator==(const MpiAllReduce&, const MpiAllReduce&) = default;

  /// Every worker's `data[0..n)` becomes the reduction over workers with `op` (`mean`: the sum,
  /// which the caller divides; passed as `mean` so that it never pairs with a `sum`).
  template <class E>
  void all_reduce(detail::worker_group& g, E* data, std::size_t n, ReduceOp op, bool checked) const {
    g.all_reduce(data, n, detail::element_kind_of<E>(), op, "mirror::ReplicaContext::all_reduce (cross-worker step)",
                 checked);
  }

  /// all_reduce of a vector held in several leaves, `leaves[k]` of `sizes[k]` elements one after
  /// another: the bits of all_reduce of them packed into one buffer, reduced where they lie
  /// (worker_group::all_reduce_leaves), so a nest of large leaves costs no copies.
  template <class E>
  void all_reduce_leaves(detail::worker_group& g, std::span<E* const> leaves, std::span<const std::size_t> sizes,
                         ReduceOp op, bool checked) const {
    const std::vector<void*> untyped(leaves.begin(), leaves.end());
    g.all_reduce_leaves(untyped.data(), sizes.data(), untyped.size(), detail::element_kind_of<E>(), op,
                        "mirror::ReplicaContext::all_reduce (cross-worker step)", checked);
  }

  /// Called once by `ops::Hierarchical` as the strategy is built: the order is the group's, so
  /// that every cross-worker reduction of the strategy follows it.
  void configure(detail::worker_group& g) const noexcept { g.reduce_in_worker_order(deterministic); }
};

}  // namespace mirror::ops
