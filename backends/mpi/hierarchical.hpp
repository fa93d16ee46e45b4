// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::Hierarchical<LocalOps, Cross>`: the all-reduce of `devices::Cluster`.

#include <cstddef>
#include <memory>
#include <span>
#include <vector>
#include <mirror/backends/mpi/all_reduce_in_flight.hpp>
#include <mirror/backends/mpi/cluster_device.hpp>
#include <mirror/backends/mpi/mpi_all_reduce.hpp>
#include <mirror/backends/mpi/reduce_scatter_in_flight.hpp>
#include <mirror/concepts/cross_device_ops.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/backend/collective.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/lean_std.hpp>  // std::copy
#include <mirror/backend/cut_of.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// Local reduce → one cross-worker all-reduce of one staging buffer per worker → local broadcast
/// (Horovod's hierarchical all-reduce; docs/multi-worker.md\#what-changes-with-several-workers).
///
/// 1. The worker's replicas all-reduce with `LocalOps` (`mean` as `sum`: no division yet).
/// 2. `Cross` reduces replica 0's result across workers as one vector, leaf after leaf, on the
///    worker's communication thread: in place where a leaf holds a whole MPI call's elements
///    (`MpiAllReduce::all_reduce_leaves`), else packed into one buffer.
/// 3. `mean` divides once, by W*R (also for integers: [0,1 | 1,2] has mean 1, never the
///    staged 0); the other local replicas copy replica 0's result.
///
/// Before step 1, the local replicas check that they agree, then replica 0 checks across workers
/// that every worker makes the same call with the same count, element type and op
/// (`Cluster{.validate_shapes}`), so a mismatch anywhere is a `shape_error` on every worker before
/// any value changes (with R = 1, in the same hand-off as step 2).
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
  void all_reduce(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& s) const {
    require_cluster_of_threads<Rt>();
    Rt& rt = c.runtime();
    detail::worker_group& g = *rt.workers();
    if (g.num_workers() == 1) {
      // Nothing crosses processes: the local policy's all-reduce is the whole answer (its mean
      // divides by R = W*R, the same arithmetic as below), without the copy from replica 0.
      local.all_reduce(c, op, s);
      return;
    }
    const int self = c.self();
    const bool check_apart = local_phase(c, g, op, s);
    const std::size_t n = static_cast<std::size_t>(g.num_workers()) * static_cast<std::size_t>(c.num_replicas());
    if (self == 0) {
      c.for_all_replicas([&] { cross_step(rt, g, op, s, check_apart); });
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

  /// `all_reduce`, started: the local phase and the agreement checks happen now, the
  /// cross-worker step is handed to the communication thread, and the returned handle's
  /// `finish()` completes it (the division of a `mean`, and the copy to the other local
  /// replicas: all_reduce_in_flight.hpp). The same bits as `all_reduce`. With several local
  /// replicas the cross-worker agreement check completes before this returns (it must come
  /// before the local phase writes), so it waits for the collectives started before it.
  template <class Rt, class E>
  all_reduce_in_flight<E> all_reduce_start(backend::collective<Rt>& c, ReduceOp op,
                                           const backend::segment_list<Rt, E>& s) const {
    require_cluster_of_threads<Rt>();
    Rt& rt = c.runtime();
    detail::worker_group& g = *rt.workers();
    if (g.num_workers() == 1) {
      local.all_reduce(c, op, s);  // (as all_reduce: nothing crosses processes)
      return {};
    }
    const int self = c.self(), R = c.num_replicas();
    const bool checked = local_phase(c, g, op, s);
    using delivery = typename all_reduce_in_flight<E>::delivery;
    std::shared_ptr<delivery> d;
    if (self == 0) {
      d = std::make_shared<delivery>();
      d->leaves.resize(static_cast<std::size_t>(R));
      d->sizes.assign(s.sizes.begin(), s.sizes.end());
      d->op = op;
      d->divisor = static_cast<std::size_t>(g.num_workers()) * static_cast<std::size_t>(R);
    }
    const auto post_cross = [&] {
      const char* what = "mirror::ReplicaContext::all_reduce_async (cross-worker step)";
      if (s.leaves.size() == 1) {
        d->cross = g.start_all_reduce(s.leaves[0], s.total, detail::element_kind_of<E>(), op, what, checked);
        return;
      }
      // Several leaves cross as one vector, from where they lie (worker_group::all_reduce_leaves).
      const std::vector<void*> untyped(s.leaves.begin(), s.leaves.end());
      d->cross = g.start_all_reduce_leaves(untyped.data(), s.sizes.data(), untyped.size(), detail::element_kind_of<E>(),
                                           op, what, checked);
    };
    if (R == 1) {
      d->leaves[0].assign(s.leaves.begin(), s.leaves.end());
      post_cross();
      return all_reduce_in_flight<E>(std::move(d));
    }
    // Every local replica takes the shared delivery from replica 0 and lists its leaves in it;
    // replica 0 posts the cross step (an error there is every replica's), and the barrier keeps
    // its handle alive until every replica holds its own.
    struct post {
      const std::shared_ptr<delivery>* shared;
    };
    if (self == 0) c.for_all_replicas(post_cross);
    std::shared_ptr<delivery> mine = *c.exchange(post{&d})[0].shared;
    mine->leaves[static_cast<std::size_t>(self)].assign(s.leaves.begin(), s.leaves.end());
    c.barrier();
    return all_reduce_in_flight<E>(std::move(mine));
  }

  /// `reduce_scatter`, started: with one local replica (this replica's cut is its worker's whole
  /// range) the cross-worker step is handed to the communication thread, and the returned
  /// handle's `finish()` completes it (the copy out of the packed buffer where there are several
  /// leaves, the division of a `mean`); the same bits as `reduce_scatter`. With one worker or
  /// several local replicas it completes here.
  template <class Rt, class E>
  reduce_scatter_in_flight<E> reduce_scatter_start(backend::collective<Rt>& c, ReduceOp op,
                                                   const backend::segment_list<Rt, E>& in,
                                                   const backend::segment_list<Rt, E>& out) const {
    require_cluster_of_threads<Rt>();
    detail::worker_group& g = *c.runtime().workers();
    if (g.num_workers() == 1 || c.num_replicas() > 1) {
      reduce_scatter(c, op, in, out);
      return {};
    }
    c.barrier();  // one local replica: only the (trivial) local agreement check, as reduce_scatter
    using state = typename reduce_scatter_in_flight<E>::state;
    auto s = std::make_unique<state>();
    s->out.assign(out.leaves.begin(), out.leaves.end());
    s->out_sizes.assign(out.sizes.begin(), out.sizes.end());
    s->op = op;
    s->divisor = static_cast<std::size_t>(g.num_workers());
    const char* what = "mirror::ReplicaContext::reduce_scatter_async (cross-worker step)";
    const auto kind = detail::element_kind_of<E>();
    if (in.leaves.size() == 1) {
      s->cross = g.start_reduce_scatter(in.leaves[0], in.sizes.data(), 1, out.leaves[0], kind, op, what);
    } else {
      // Several leaves cross from and into where they lie (worker_group::reduce_scatter_leaves).
      const std::vector<const void*> from(in.leaves.begin(), in.leaves.end());
      const std::vector<void*> to(out.leaves.begin(), out.leaves.end());
      s->cross = g.start_reduce_scatter_leaves(from.data(), in.sizes.data(), from.size(), to.data(), kind, op, what);
    }
    return reduce_scatter_in_flight<E>(std::move(s));
  }

  /// The `reduce_scatter` of the ops interface (mirror/concepts/cross_device_ops.hpp), called
  /// by every local replica of every worker: replica g = w*R + self receives cut g
  /// (`backend::cut_of(n, W*R, g)`) of each leaf's reduction.
  ///
  /// A hierarchical composition rather than one MPI_Ireduce_scatter over W*R ranks: the local
  /// phase is the all-reduce's own (`LocalOps`, on a copy of the leaves, so that the rest of a
  /// span stays as it was), and the cross step (`worker_group::reduce_scatter`) gives this
  /// worker's contiguous range of cuts the all-reduce's cross-worker order — MPI's reduce-scatter
  /// promises no order, and bitwise equality with `all_reduce` is the contract. The cross step
  /// is an MPI_Ialltoall of each worker's range plus a fold in worker order (the bytes of
  /// MPI_Reduce_scatter) wherever that is the all-reduce's order or any order gives the same
  /// bits (`MpiAllReduce{.deterministic = true}`, integers, two workers); floating point in
  /// MPI's order over three workers or more takes the all-reduce's MPI_Iallreduce and keeps the
  /// range. Then each local replica copies its cut from replica 0 (and `mean` divides by W*R).
  template <class Rt, class E>
  void reduce_scatter(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& in,
                      const backend::segment_list<Rt, E>& out) const {
    require_cluster_of_threads<Rt>();
    Rt& rt = c.runtime();
    detail::worker_group& g = *rt.workers();
    const int self = c.self(), R = c.num_replicas(), W = g.num_workers();
    const int global = g.worker_index() * R + self;
    const std::size_t K = in.leaves.size();
    // With one worker the local policy's all-reduce is the whole answer (as in all_reduce);
    // with several local replicas it is the local phase. Either way on a copy.
    E* local_result = nullptr;
    if (W == 1 || R > 1) {
      // The copy lives in a buffer of this replica's thread, not in the runtime's scratch: the
      // local policy's all_reduce may take that scratch for itself (ReductionToOneDevice and
      // HierarchicalCopy accumulate there), which would overwrite the leaves it is reducing.
      static thread_local std::vector<E> local_copy;
      if (local_copy.size() < in.total) local_copy.resize(in.total);
      E* const base = local_copy.data();
      std::vector<E*> copies(K);
      std::size_t at = 0;
      for (std::size_t k = 0; k < K; ++k) {
        copies[k] = base + at;
        std::copy(in.leaves[k], in.leaves[k] + in.sizes[k], copies[k]);
        at += in.sizes[k];
      }
      local.all_reduce(c, W == 1 ? op : detail::cross_op(op), backend::segment_list<Rt, E>{copies, in.sizes, in.total});
      if (W == 1) {
        at = 0;
        for (std::size_t k = 0; k < K; ++k) {
          const std::size_t first = backend::cut_of(in.sizes[k], R, self).first;
          std::copy(base + at + first, base + at + first + out.sizes[k], out.leaves[k]);
          at += in.sizes[k];
        }
        return;
      }
      // The cross step works in the scratch, which outlives an abandoned MPI request
      // (devices::Cluster keeps it), taken now that the local policy is done with it.
      if (self == 0) {
        local_result = rt.template scratch<E>(self, in.total);
        std::copy(base, base + in.total, local_result);
      }
    } else {
      c.barrier();  // one local replica: only the (trivial) local agreement check
    }
    const std::size_t n = static_cast<std::size_t>(W) * static_cast<std::size_t>(R);
    const char* what = "mirror::ReplicaContext::reduce_scatter (cross-worker step)";
    if (R == 1) {
      // This replica's cut is its worker's whole range: straight from and into the leaves.
      if (K == 1) {
        g.reduce_scatter(in.leaves[0], in.sizes.data(), 1, out.leaves[0], detail::element_kind_of<E>(),
                         op, what);
      } else {
        const std::vector<const void*> from(in.leaves.begin(), in.leaves.end());
        const std::vector<void*> to(out.leaves.begin(), out.leaves.end());
        g.reduce_scatter_leaves(from.data(), in.sizes.data(), K, to.data(), detail::element_kind_of<E>(), op, what);
      }
      if (op == ReduceOp::mean) {
        for (std::size_t k = 0; k < K; ++k) rt.divide(self, out.leaves[k], out.sizes[k], n);
      }
      return;
    }
    if (self == 0) {
      c.for_all_replicas([&] {
        g.reduce_scatter(local_result, in.sizes.data(), K, local_result, detail::element_kind_of<E>(), op, what);
      });
    }
    struct post {
      const E* range;  // replica 0's: the worker's range of every leaf, leaf after leaf
    };
    const auto all = c.exchange(post{local_result});
    const int first_replica = global - self;
    std::size_t at = 0;
    for (std::size_t k = 0; k < K; ++k) {
      const std::size_t range_first = backend::cut_of(in.sizes[k], static_cast<int>(n), first_replica).first;
      const std::size_t mine = backend::cut_of(in.sizes[k], static_cast<int>(n), global).first;
      rt.copy(self, out.leaves[k], all[0].range + at + (mine - range_first), out.sizes[k]);
      if (op == ReduceOp::mean) rt.divide(self, out.leaves[k], out.sizes[k], n);
      const std::size_t range_end = first_replica + R == static_cast<int>(n)
                                        ? in.sizes[k]
                                        : backend::cut_of(in.sizes[k], static_cast<int>(n), first_replica + R).first;
      at += range_end - range_first;
    }
    c.barrier();  // replica 0's scratch stays valid until every copy is done
  }

  /// The `all_gather` of the ops interface, called by every local replica of every worker:
  /// every replica's leaf k becomes the concatenation over the W*R global replicas g of g's
  /// leaf k (`counts[g*K + k]` elements, equal on every replica of every worker).
  ///
  /// Hierarchical, as the all-reduce: each local replica copies its leaves into replica 0's
  /// output at its global offsets (with one local replica the group makes that copy while the
  /// blocks travel), replica 0 has the group exchange the workers' blocks
  /// (`worker_group::all_gather`: one round of messages or one MPI_Iallgather), and the other
  /// local replicas copy the whole result from replica 0. One exchange per worker instead of one
  /// per replica, and no order to keep: only copies.
  template <class Rt, class E>
  void all_gather(backend::collective<Rt>& c, const backend::const_segment_list<Rt, E>& in,
                  std::span<const std::size_t> counts, const backend::segment_list<Rt, E>& out) const {
    require_cluster_of_threads<Rt>();
    Rt& rt = c.runtime();
    detail::worker_group& g = *rt.workers();
    const int self = c.self(), R = c.num_replicas(), W = g.num_workers();
    const std::size_t K = in.leaves.size(), N = static_cast<std::size_t>(W) * static_cast<std::size_t>(R);
    const std::size_t global = static_cast<std::size_t>(g.worker_index() * R + self);
    struct post {
      const typename backend::segment_list<Rt, E>::pointer* leaves;  // replica 0's output leaves
    };
    // The lengths, widths and element kinds were gathered and checked across workers with the
    // counts (ReplicaContext::all_gather's first step): nothing left to agree on.
    // (Kept: the exchange's result is valid only until this replica's next barrier.)
    const auto* const first_leaves = c.exchange(post{out.leaves.data()})[0].leaves;
    // With one local replica its leaves are the worker's block: the group copies them into the
    // output while the other workers' blocks travel, and sends them from the input (MPI reading
    // an output this thread has just written is slower).
    const bool group_copies = R == 1 && W > 1;
    for (std::size_t k = 0; k < K && !group_copies; ++k) {
      std::size_t at = 0;
      for (std::size_t q = 0; q < global; ++q) at += counts[q * K + k];
      rt.copy(self, first_leaves[k] + at, in.leaves[k], counts[global * K + k]);
    }
    if (R > 1) c.barrier();
    if (self == 0 && W > 1) {
      std::vector<std::size_t> per_worker(static_cast<std::size_t>(W) * K, 0);
      for (std::size_t q = 0; q < N; ++q) {
        for (std::size_t k = 0; k < K; ++k) per_worker[q / static_cast<std::size_t>(R) * K + k] += counts[q * K + k];
      }
      std::vector<void*> leaves(out.leaves.begin(), out.leaves.end());
      std::vector<const void*> own;
      if (group_copies) own.assign(in.leaves.begin(), in.leaves.end());
      c.for_all_replicas([&] {
        g.all_gather(leaves.data(), K, per_worker.data(), sizeof(E),
                     "mirror::ReplicaContext::all_gather (cross-worker step)", true,
                     group_copies ? own.data() : nullptr);
      });
    }
    if (R == 1) return;
    c.barrier();
    if (self != 0) {
      for (std::size_t k = 0; k < K; ++k) rt.copy(self, out.leaves[k], first_leaves[k], out.sizes[k]);
    }
    c.barrier();  // replica 0's output stays as it is until every copy is done
  }

 private:
  // The leaves of `s`, one after another, into `out` (s.total elements): how several leaves
  // cross workers as one buffer.
  template <class Rt, class E>
  static void concatenate(const backend::segment_list<Rt, E>& s, E* out) {
    for (std::size_t k = 0; k < s.leaves.size(); ++k) out = std::copy(s.leaves[k], s.leaves[k] + s.sizes[k], out);
  }

  /// all_reduce's steps before the cross step, on every local replica: the agreement checks
  /// (apart from the data where the local phase writes first), then the local phase (`mean`
  /// as `sum`). Returns whether the cross-worker check was made (the data need not carry it).
  template <class Rt, class E>
  bool local_phase(backend::collective<Rt>& c, detail::worker_group& g, ReduceOp op,
                   const backend::segment_list<Rt, E>& s) const {
    // With one local replica nothing changes before the cross step, so the agreement check
    // rides in the same hand-off to the communication thread as the data (one wake-up per
    // all-reduce instead of two); with several, it must finish before the local phase.
    const bool check_apart = c.num_replicas() > 1;
    if (check_apart) {
      // Span leaves are reduced in place: then the local agreement comes first (a checked
      // barrier), then the cross-worker one, then the local phase that writes, so a mismatch
      // among one worker's replicas reaches the others while they wait in their cross check,
      // before any of their spans changes. Owning leaves are reduced in a copy the call returns
      // only on success: the local phase's own first exchange checks them, without the barrier.
      if (c.writes_in_place()) c.barrier();
      if (c.self() == 0) {
        c.for_all_replicas(
            [&] { g.check_all_reduce(s.total, detail::element_kind_of<E>(), op, "mirror::ReplicaContext::all_reduce"); });
      }
    }
    local.all_reduce(c, detail::cross_op(op), s);
    return check_apart;
  }

  // Every collective of the policy: what it works on.
  template <class Rt>
  static constexpr void require_cluster_of_threads() {
    static_assert(detail::spans_workers<Rt> && Rt::host_addressable,
                  "mirror::ops::Hierarchical needs devices::Cluster<devices::Threads> (replicas in several "
                  "processes, host memory); in one process use default_ops_t<Device>");
  }

  template <class Rt, class E>
  void cross_step(Rt& rt, detail::worker_group& g, ReduceOp op, const backend::segment_list<Rt, E>& s,
                  bool checked) const {
    if (s.leaves.size() == 1) {
      cross.all_reduce(g, s.leaves[0], s.total, op, checked);
      return;
    }
    if constexpr (requires { cross.all_reduce_leaves(g, s.leaves, s.sizes, op, checked); }) {
      cross.all_reduce_leaves(g, s.leaves, s.sizes, op, checked);  // where they lie, not packed here
      return;
    }
    E* staging = rt.template scratch<E>(0, s.total);
    concatenate(s, staging);
    cross.all_reduce(g, staging, s.total, op, checked);
    std::size_t at = 0;
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
