// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ops::NcclAllReduce`: all-reduce with NCCL, leaves packed by TF's rule; reduce-scatter
/// and all-gather with NCCL too.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <mirror/backends/cuda/comm_work.hpp>
#include <mirror/backends/cuda/cuda_device.hpp>
#include <mirror/backends/nccl/nccl_comms.hpp>
#include <mirror/concepts/cross_device_ops.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/backend/collective.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/owned.hpp>
#include <mirror/detail/worker_group.hpp>
#include <mirror/backend/segment_list.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::ops {

/// TF's `NcclAllReduce`: one NCCL communicator per replica, created once by the `Strategy`
/// constructor and reused; the leaves of one element type are concatenated and split into
/// `num_packs` packs (each `total / num_packs` elements, the last takes the rest; `0` = one
/// all-reduce per leaf, unpacked), and every pack is reduced by `ncclAllReduce` inside one
/// `ncclGroupStart`/`ncclGroupEnd`. Every `ReduceOp`: `mean` is `ncclAvg` for floating point,
/// and a sum divided as C++ divides for integers (NCCL's integer average rounds differently).
///
/// **Requires**: `devices::Cuda` with one replica per GPU — NCCL refuses two ranks on one GPU,
/// so `replicas_per_gpu > 1` is refused at construction (use `ReductionToOneDevice` or
/// `HierarchicalCopy` there); `num_packs >= 0`; every device leaf in the memory of the replica's
/// own GPU (a leaf on another GPU is `std::invalid_argument` naming the replica and both GPUs,
/// before anything is enqueued: NCCL would work on it through peer access, racing its owner).
/// **Errors**: `std::invalid_argument` at construction for the settings above;
/// `mirror::backend_error` (with the `ncclResult_t`) when NCCL fails; a collective that does not
/// complete within the device's `timeout` aborts the communicators and throws
/// `mirror::timeout_error` naming the replicas that had not enqueued it (the strategy must then
/// be rebuilt: later NCCL collectives throw `backend_error`).
/// **Across workers** (`devices::Cluster<devices::Cuda>`, the default ops there): one NCCL
/// communicator per local GPU spans every GPU of every worker (W*G ranks, rank = global replica
/// id), bootstrapped over MPI by the strategy's constructor (worker 0's NCCL id, broadcast on
/// the MPI backend's communication thread). `mean` divides by W*G. Before each all-reduce the
/// worker's replica 0 checks across workers that every worker reduces the same count, element
/// type and op (`Cluster{.validate_shapes}`): a mismatch is a `shape_error`, a worker that does
/// not come a `timeout_error` naming it, before any NCCL call could wait for it on the GPU.
/// **Communication**: NCCL's ring or tree, about 2·(N-1)/N·S bytes per replica. A call returns
/// once the all-reduce is enqueued on the replica's communication stream, its stream waiting for
/// it (docs/cuda.md\#the-communication-stream: `all_reduce_start` and `reduce_scatter_start`
/// leave the wait for later, so that kernels run beside NCCL); a watchdog
/// checks each one's completion at the replica's next NCCL call (waiting only when 16 are
/// unfinished) and aborts the communicators if one is not done within the device's `timeout`.
struct NcclAllReduce {
  int num_packs = 1;  ///< packs the concatenated leaves are split into; 0 = one per leaf
  /// Reduces across the workers of `devices::Cluster<Cuda>` too (its communicators span them).
  static constexpr bool crosses_workers = true;

  friend bool operator==(const NcclAllReduce&, const NcclAllReduce&) = default;

  /// The reason these settings cannot run on a device with `replicas_per_gpu` replicas on each
  /// of `gpus`, or an empty string; `shared_gpus`: the loaded NCCL accepts several ranks on one
  /// GPU (nccl::impl::shared_gpus_enabled). (Needs no GPU: the constructor's check, unit-tested alone.)
  static std::string refusal(int num_packs, int replicas_per_gpu, bool shared_gpus = false) {
    if (num_packs < 0) {
      return detail::format("mirror::ops::NcclAllReduce{.num_packs = %d}: num_packs must be >= 0 (0 = one "
                            "all-reduce per leaf)",
                            num_packs)
          .c_str();
    }
    if (replicas_per_gpu > 1 && !shared_gpus) {
      return detail::format("mirror::ops::NcclAllReduce: devices::Cuda{.replicas_per_gpu = %d} puts several "
                            "replicas on one GPU, and NCCL refuses two ranks on one GPU (NCCL 2.30 and newer "
                            "accept them with NCCL_MULTI_RANK_GPU_ENABLE=1); use "
                            "mirror::ops::ReductionToOneDevice or mirror::ops::HierarchicalCopy with logical "
                            "devices, or one replica per GPU with NcclAllReduce",
                            replicas_per_gpu)
          .c_str();
    }
    return {};
  }

  /// The elements [first, second) of the concatenated leaves that form pack `i` of `packs`
  /// (TF's `_ConcatAndSplitPacker`: `total / packs` each, the last takes the rest).
  static constexpr std::pair<std::size_t, std::size_t> pack_range(std::size_t i, std::size_t packs,
                                                                  std::size_t total) noexcept {
    const std::size_t per = total / packs;
    return {i * per, i + 1 == packs ? total : (i + 1) * per};
  }

  /// Called by `Strategy`'s constructor: checks the settings and creates the communicators.
  template <class Rt>
    requires std::derived_from<Rt, cuda::runtime>
  void validate(Rt& rt) const {
    const bool shared_gpus = nccl::impl::shared_gpus_enabled();
    if constexpr (detail::spans_workers<Rt>) {
      if (rt.replicas_per_gpu() > 1 && !shared_gpus) {
        throw std::invalid_argument(
            detail::format("mirror::devices::Cluster<devices::Cuda>{.local = {.replicas_per_gpu = %d}}: several "
                           "replicas on one GPU cannot be NCCL ranks (NCCL refuses two ranks on one GPU), and "
                           "across workers there is no other GPU policy yet; use one replica per GPU (one GPU per "
                           "worker process, or .local.gpus listing distinct GPUs)",
                           rt.replicas_per_gpu())
                .c_str());
      }
    }
    if (const std::string why = refusal(num_packs, rt.replicas_per_gpu(), shared_gpus); !why.empty()) {
      throw std::invalid_argument(why);
    }
    comms_of(rt, workers_of(rt));
  }

  /// How many all-reduces replica `replica` of this runtime has handed to NCCL so far. For tests
  /// and diagnostics: on one GPU every all-reduce returns its input, and this is what shows that
  /// NCCL ran.
  template <class Rt>
    requires std::derived_from<Rt, cuda::runtime>
  static std::uint64_t enqueued(Rt& rt, int replica) {
    return nccl::impl::enqueued(comms_of(rt, workers_of(rt)), replica);
  }

  /// The `cross_device_ops` interface (mirror/concepts/cross_device_ops.hpp), called by every
  /// replica: one `ncclAllReduce` per pack, in one NCCL group, enqueued on the replica's
  /// communication stream, which the replica's stream then waits for (`all_reduce_start`, then
  /// `finish`).
  template <class Rt, class E>
    requires std::derived_from<Rt, cuda::runtime>
  void all_reduce(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& s) const {
    all_reduce_start(c, op, s).finish();
  }

  /// `all_reduce`, started (ReplicaContext::all_reduce_async): the packs are copied, reduced and
  /// copied back on the replica's communication stream, after the work already on its stream
  /// (docs/cuda.md\#the-communication-stream); the returned part's `finish()` makes the replica's
  /// stream wait for them. Kernels enqueued in between run beside NCCL. The packed buffer is the
  /// replica's communication scratch: collectives on that stream run one after another, so
  /// several started ones share it.
  template <class Rt, class E>
    requires std::derived_from<Rt, cuda::runtime>
  cuda::comm_work all_reduce_start(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& s) const {
    using pointer = typename Rt::template pointer<E>;
    Rt& rt = c.runtime();
    const int self = c.self();
    const std::size_t k_leaves = s.leaves.size();
    require_own_device(c, s.leaves, "all_reduce");
    const bool concat = num_packs > 0 && k_leaves > 1;
    const pointer packed = concat ? rt.template comm_scratch<E>(self, s.total) : pointer{};
    detail::worker_group* const workers = workers_of(rt);
    // Across workers, first: same count, type and op on every worker (one small MPI all-reduce
    // on the communication thread; the other local replicas wait in the exchange below).
    if (workers != nullptr && self == 0 && workers->num_workers() > 1) {
      c.for_all_replicas([&] {
        workers->check_all_reduce(s.total, cuda::kernel_kind_of<E>(), op,
                                  "mirror::ReplicaContext::all_reduce (NcclAllReduce)");
      });
    }
    // The agreement check, and a barrier: a replica that never comes is named by the device's
    // timeout here, before any NCCL call could wait for it on the GPU.
    c.exchange(char{0});
    // One rank (one GPU) takes the same path: NCCL accepts single-rank communicators, and the
    // watchdog, the group and the event ring then run, and are tested, on a one-GPU machine.
    nccl::impl::comms& comms = comms_of(rt, workers);
    std::vector<void*> buffers;
    std::vector<std::size_t> counts;
    rt.fork_to_comm(self);
    if (num_packs == 0) {
      for (std::size_t k = 0; k < k_leaves; ++k) {
        buffers.push_back(s.leaves[k].ptr);
        counts.push_back(s.sizes[k]);
      }
    } else {
      // One leaf needs no concatenation: its packs are slices of it.
      const pointer base = concat ? packed : s.leaves[0];
      if (concat) {
        std::size_t at = 0;
        for (std::size_t k = 0; k < k_leaves; ++k) {
          rt.comm_copy(self, packed + at, s.leaves[k], s.sizes[k]);
          at += s.sizes[k];
        }
      }
      const std::size_t packs = static_cast<std::size_t>(num_packs);
      for (std::size_t i = 0; i < packs; ++i) {
        const auto [a, b] = pack_range(i, packs, s.total);
        buffers.push_back((base + a).ptr);
        counts.push_back(b - a);
      }
    }
    nccl::impl::all_reduce(comms, self, rt.comm_stream_of(self), op, cuda::kernel_kind_of<E>(), buffers, counts,
                           rt.timeout());
    if (concat) {
      std::size_t at = 0;
      for (std::size_t k = 0; k < k_leaves; ++k) {
        rt.comm_copy(self, s.leaves[k], packed + at, s.sizes[k]);
        at += s.sizes[k];
      }
    }
    return cuda::comm_work(rt, self, rt.mark_comm(self));
  }

  /// The `reduce_scatter` of the ops-policy interface (mirror/concepts/cross_device_ops.hpp),
  /// called by every replica for the leaves of one element type: one `ncclReduceScatter` per
  /// non-empty leaf, in one NCCL group on the replica's communication stream (its stream waits for
  /// it: `reduce_scatter_start`, then `finish`), returning once enqueued and watched
  /// as `all_reduce` is. Cut g of a leaf of n elements is `backend::cut_of(n, N, g)` (the
  /// first n mod N replicas one element more), which NCCL's equal blocks match only when N divides
  /// n: such a leaf is reduce-scattered from itself (in place when `out` is its own cut), any other
  /// is copied into N blocks of ceil(n/N) of the replica's scratch (block r = cut r and a zero),
  /// reduce-scattered there, and its cut copied out. (Chosen over N `ncclReduce` calls, one rooted
  /// at each cut: the same bytes on the links, but N collectives per leaf instead of one, so N
  /// launches and latencies; the copies cost two device-memory passes over the leaf, far below the
  /// links' share.) `num_packs` does not apply: the group launches the leaves together.
  ///
  /// **Bits**: `min` and `max` are exact, integer ops exact (as two's complement), and with one
  /// or two replicas every op gives the same bits as `all_reduce` (two operands commute
  /// exactly). Floating-point `sum`, `prod` and `mean` on three replicas or more: NCCL may
  /// combine the replicas' values of an element in another order in a reduce-scatter than in an
  /// all-reduce (another algorithm, and ring steps that depend on the element's offset in the
  /// buffer, which packing changes too), so the last bits can differ from this policy's
  /// `all_reduce`; they are the same from run to run for the same N, sizes, NCCL version and
  /// topology. `mean` is `ncclAvg` for floating point, a sum divided as C++ divides for integers.
  template <class Rt, class E>
    requires std::derived_from<Rt, cuda::runtime>
  void reduce_scatter(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& in,
                      const backend::segment_list<Rt, E>& out) const {
    reduce_scatter_start(c, op, in, out).finish();
  }

  /// `reduce_scatter`, started (ReplicaContext::reduce_scatter_async): enqueued on the
  /// communication stream as `all_reduce_start` is, and the returned part's `finish()` makes the
  /// replica's stream wait for it.
  template <class Rt, class E>
    requires std::derived_from<Rt, cuda::runtime>
  cuda::comm_work reduce_scatter_start(backend::collective<Rt>& c, ReduceOp op, const backend::segment_list<Rt, E>& in,
                                       const backend::segment_list<Rt, E>& out) const {
    Rt& rt = c.runtime();
    const int self = c.self();
    detail::worker_group* const workers = workers_of(rt);
    require_own_device(c, in.leaves, "reduce_scatter");
    require_own_device(c, out.leaves, "reduce_scatter");
    nccl::impl::comms& comms = comms_of(rt, workers);
    const std::size_t padded = nccl::impl::reduce_scatter_scratch(comms, in.sizes);
    E* const scratch = padded > 0 ? rt.template comm_scratch<E>(self, padded).ptr : nullptr;
    if (workers != nullptr && self == 0 && workers->num_workers() > 1) {
      c.for_all_replicas([&] {
        workers->check_all_reduce(in.total, cuda::kernel_kind_of<E>(), op,
                                  "mirror::ReplicaContext::reduce_scatter (NcclAllReduce)");
      });
    }
    c.exchange(char{0});
    std::vector<const void*> sources;
    std::vector<void*> targets;
    for (std::size_t k = 0; k < in.leaves.size(); ++k) {
      sources.push_back(in.leaves[k].ptr);
      targets.push_back(out.leaves[k].ptr);
    }
    rt.fork_to_comm(self);
    nccl::impl::reduce_scatter(comms, self, rt.comm_stream_of(self), op, cuda::kernel_kind_of<E>(), sources, targets,
                               in.sizes, scratch, rt.timeout());
    return cuda::comm_work(rt, self, rt.mark_comm(self));
  }

  /// The `all_gather` of the ops-policy interface (mirror/concepts/cross_device_ops.hpp), called by
  /// every replica for the leaves of one element type: for a leaf whose count is the same on every
  /// replica one `ncclAllGather`, otherwise one `ncclBroadcast` per replica with a non-empty piece,
  /// rooted there and received at its offset (NCCL's recipe for an all-gather of unequal counts),
  /// all in one NCCL group on the replica's communication stream (its stream waits for it: every
  /// NCCL call of a communicator goes on one stream, in call order), returning once enqueued and watched as
  /// `all_reduce` is. Copies are exact: every replica receives the same bits.
  template <class Rt, class E>
    requires std::derived_from<Rt, cuda::runtime>
  void all_gather(backend::collective<Rt>& c, const backend::const_segment_list<Rt, E>& in,
                  std::span<const std::size_t> counts, const backend::segment_list<Rt, E>& out) const {
    Rt& rt = c.runtime();
    const int self = c.self();
    require_own_device(c, in.leaves, "all_gather");
    require_own_device(c, out.leaves, "all_gather");
    detail::worker_group* const workers = workers_of(rt);
    // Across workers the counts already agree (the caller gathered them); this checks the element
    // type, so that no worker's NCCL call waits on the GPU for a call that never matches.
    if (workers != nullptr && self == 0 && workers->num_workers() > 1) {
      c.for_all_replicas([&] {
        workers->check_all_reduce(out.total, cuda::kernel_kind_of<E>(), ReduceOp::sum,
                                  "mirror::ReplicaContext::all_gather (NcclAllReduce)");
      });
    }
    c.exchange(char{0});
    nccl::impl::comms& comms = comms_of(rt, workers);
    std::vector<const void*> sources;
    std::vector<void*> targets;
    for (std::size_t k = 0; k < in.leaves.size(); ++k) {
      sources.push_back(in.leaves[k].ptr);
      targets.push_back(out.leaves[k].ptr);
    }
    rt.fork_to_comm(self);
    nccl::impl::all_gather(comms, self, rt.comm_stream_of(self), cuda::kernel_kind_of<E>(), sources, targets, counts,
                           rt.timeout());
    rt.join_comm(self, rt.mark_comm(self));
  }

 private:
  /// NCCL reads and writes only its rank's GPU: a leaf in another GPU's memory (reachable through
  /// peer access, so nothing would fail) would be reduced by this replica's rank while its owner's
  /// rank works on it too. Refused before anything is enqueued; the other replicas are cancelled.
  template <class Rt, class P>
  static void require_own_device(backend::collective<Rt>& c, std::span<const P> leaves, const char* verb) {
    const int mine = c.runtime().device_of(c.self());
    for (std::size_t k = 0; k < leaves.size(); ++k) {
      const int on = leaves[k].device;  // (named first: clang reads `x.device <` as a template's name)
      if (on == mine || on < 0) continue;
      int replica = c.self();
      if constexpr (requires(const Rt& rt) { rt.first_replica(); }) replica += c.runtime().first_replica();
      throw std::invalid_argument(
          detail::format("mirror::ops::NcclAllReduce: %s on replica %d: leaf %zu of its element type is memory "
                         "of GPU %d, but the replica runs on GPU %d, and NCCL works on its own GPU's memory only; "
                         "give each replica a buffer on its own GPU (allocate it inside fn, or use "
                         "mirror::cuda::device_buffer per replica), or use ops::ReductionToOneDevice or "
                         "ops::HierarchicalCopy, which copy between GPUs",
                         verb, replica, k, on, mine)
              .c_str());
    }
  }

  // The cross-worker group of devices::Cluster<Cuda>'s runtime; null in one process.
  template <class Rt>
  static detail::worker_group* workers_of(Rt& rt) noexcept {
    if constexpr (detail::spans_workers<Rt>) {
      return rt.workers();
    } else {
      (void)rt;
      return nullptr;
    }
  }
  // Created by validate (the Strategy's constructor, on the user's thread: collective over the
  // workers there); later calls find them. (A template, although Rt is always a cuda::runtime:
  // the body of a non-template is analysed, and the templates it calls instantiated, wherever
  // this header is parsed, in every translation unit of an NCCL build, Threads-only ones too;
  // docs/design.md#compile-time.)
  template <class Rt>
  static nccl::impl::comms& comms_of(Rt& rt, detail::worker_group* workers) {
    return *rt.template extension<detail::owned<nccl::impl::comms>>([&] {
             std::vector<int> devices;
             for (int r = 0; r < rt.num_replicas(); ++r) devices.push_back(rt.device_of(r));
             // (A span from pointer and size: see devices::Cuda::runtime.)
             return new detail::owned<nccl::impl::comms>(nccl::impl::create_comms(
                 std::span<const int>(devices.data(), devices.size()), rt.timeout(), workers));
           });
  }
};

static_assert(cross_device_ops<NcclAllReduce, devices::Cuda>);

}  // namespace mirror::ops

namespace mirror {
/// `devices::Cuda` reduces with NCCL by default in builds with NCCL (TF's choice on GPUs).
template <>
struct default_ops<devices::Cuda> {
  using type = ops::NcclAllReduce;  ///< the ops policy
};
}  // namespace mirror
