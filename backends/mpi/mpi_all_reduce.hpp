// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::MpiAllReduce`: the cross-worker step of `ops::Hierarchical`.

#include <cstddef>
#include <mirror/detail/worker_group.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// One in-place `MPI_Iallreduce` of a worker's staging buffer across workers, posted by the
/// worker's communication thread in program order and polled with `MPI_Test` (so a timeout or a
/// failure elsewhere can end it). `sum` (and `mean`'s sum), `min`, `max`, `prod` map to
/// `MPI_SUM`, `MPI_MIN`, `MPI_MAX`, `MPI_PROD`.
///
/// **Determinism**: the summation order across workers is Open MPI's; it is the same run after
/// run for the same W, count and MCA settings (measured), not guaranteed by the MPI standard.
struct MpiAllReduce {
  friend bool operator==(const MpiAllReduce&, const MpiAllReduce&) = default;

  /// Every worker's `data[0..n)` becomes the reduction over workers with `op` (never `mean`).
  template <class E>
  void all_reduce(detail::worker_group& g, E* data, std::size_t n, ReduceOp op, bool checked) const {
    g.all_reduce(data, n, detail::element_kind_of<E>(), op, "mirror::ReplicaContext::all_reduce (cross-worker step)",
                 checked);
  }
};

}  // namespace mirror::ops
