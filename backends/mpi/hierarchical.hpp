// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::Hierarchical<LocalOps, Cross>`: the all-reduce of `devices::Cluster`.

#include <cstddef>
#include <backends/mpi/cluster_device.hpp>
#include <backends/mpi/mpi_all_reduce.hpp>
#include <mirror/concepts/cross_device_ops.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/detail/collective.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/lean_std.hpp>  // std::copy
#include <mirror/detail/segments.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// Local reduce → one cross-worker all-reduce of one staging buffer per worker → local
/// broadcast (Horovod's hierarchical all-reduce, multi_worker.md 5.1).
///
/// 1. The worker's replicas all-reduce with `LocalOps` (`mean` as `sum`: no division yet).
/// 2. Replica 0 packs the result into one buffer (in place for a single leaf) and `Cross`
///    reduces it across workers, on the worker's communication thread.
/// 3. `mean` divides once, by W*R (also for integers: [0,1 | 1,2] has mean 1, never the
///    staged 0); the other local replicas copy replica 0's result.
///
/// Before step 1, replica 0 checks across workers that every worker reduces the same count,
/// element type and op (`Cluster{.validate_shapes}`), so a mismatch is a `shape_error` on every
/// worker before any value changes (with R = 1, in the same hand-off as step 2).
///
/// **Bits**: local phase in replica order, then MPI's order over workers: the same bits for the
/// same inputs, W, R, policy and MPI configuration. With `Cross = MpiAllReduce{.deterministic =
/// true}`, worker order on any MPI configuration: bitwise the serial loop over the global
/// replicas (each worker's replicas in order, then the workers in order).
template <class LocalOps, class Cross = MpiAllReduce>
struct Hierarchical {
  LocalOps local{};  ///< the ops policy within each worker (steps 1 and 3)
  Cross cross{};     ///< the cross-worker all-reduce (step 2): `MpiAllReduce`
  /// Reduces across the workers of a `devices::Cluster` (Strategy refuses ops without this).
  static constexpr bool crosses_workers = true;

  friend bool operator==(const Hierarchical&, const Hierarchical&) = default;

  /// Checks the local ops' settings, and hands the cross step's settings to the worker group
  /// (`MpiAllReduce{.deterministic}` orders every cross-worker reduction of the strategy).
  /// Strategy calls it once, as it is built.
  template <class Rt>
  void validate(const Rt& rt) const {
    if constexpr (requires { local.validate(rt); }) local.validate(rt);
    if constexpr (detail::spans_workers<Rt> && requires(detail::worker_group& g) { cross.configure(g); }) {
      cross.configure(*rt.workers());
    }
  }

  /// The `cross_device_ops` interface (mirror/concepts/cross_device_ops.hpp), called by every
  /// local replica of every worker: the three steps above.
  template <class Rt, class E>
  void all_reduce(detail::collective<Rt>& c, ReduceOp op, const detail::segment_list<Rt, E>& s) const {
    static_assert(detail::spans_workers<Rt> && Rt::host_addressable,
                  "mirror::ops::Hierarchical needs devices::Cluster<devices::Threads> (replicas in several "
                  "processes, host memory); in one process use default_ops_t<Device>");
    Rt& rt = c.runtime();
    detail::worker_group& g = *rt.workers();
    if (g.num_workers() == 1) {
      // Nothing crosses processes: the local policy's all-reduce is the whole answer (its mean
      // divides by R = W*R, the same arithmetic as below), without the copy from replica 0.
      local.all_reduce(c, op, s);
      return;
    }
    const int self = c.self();
    // With one local replica nothing changes before the cross step, so the agreement check
    // rides in the same hand-off to the communication thread as the data (one wake-up per
    // all-reduce instead of two); with several, it must finish before the local phase.
    const bool check_apart = c.num_replicas() > 1;
    if (self == 0 && check_apart) g.check_all_reduce(s.total, detail::element_kind_of<E>(), detail::cross_op(op), "mirror::ReplicaContext::all_reduce");
    local.all_reduce(c, detail::cross_op(op), s);
    const std::size_t n = static_cast<std::size_t>(g.num_workers()) * static_cast<std::size_t>(c.num_replicas());
    if (self == 0) {
      cross_step(rt, g, op, s, check_apart);
      if (op == ReduceOp::mean) {
        for (std::size_t k = 0; k < s.leaves.size(); ++k) rt.divide(self, s.leaves[k], s.sizes[k], n);
      }
    }
    if (c.num_replicas() == 1) return;
    struct post {
      E* const* leaves;
    };
    const auto all = c.exchange(post{s.leaves.data()});
    if (self != 0) {
      for (std::size_t k = 0; k < s.leaves.size(); ++k) rt.copy(self, s.leaves[k], all[0].leaves[k], s.sizes[k]);
    }
    c.barrier();  // replica 0's buffers stay valid until every copy is done
  }

 private:
  template <class Rt, class E>
  void cross_step(Rt& rt, detail::worker_group& g, ReduceOp op, const detail::segment_list<Rt, E>& s,
                  bool checked) const {
    if (s.leaves.size() == 1) {
      cross.all_reduce(g, s.leaves[0], s.total, detail::cross_op(op), checked);
      return;
    }
    E* staging = rt.template scratch<E>(0, s.total);
    std::size_t at = 0;
    for (std::size_t k = 0; k < s.leaves.size(); ++k) {
      std::copy(s.leaves[k], s.leaves[k] + s.sizes[k], staging + at);
      at += s.sizes[k];
    }
    cross.all_reduce(g, staging, s.total, detail::cross_op(op), checked);
    at = 0;
    for (std::size_t k = 0; k < s.leaves.size(); ++k) {
      std::copy(staging + at, staging + at + s.sizes[k], s.leaves[k]);
      at += s.sizes[k];
    }
  }
};

}  // namespace mirror::ops

namespace mirror {
/// `devices::Cluster<Local>` reduces hierarchically: `Local`'s default ops within a worker,
/// `MPI_Iallreduce` across workers.
template <class Local>
struct default_ops<devices::Cluster<Local>> {
  using type = ops::Hierarchical<default_ops_t<Local>, ops::MpiAllReduce>;  ///< the ops policy
};
}  // namespace mirror
