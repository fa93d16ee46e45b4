// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::devices::Cluster<Local>`: W MPI processes ("workers"), each with the replicas of a
/// local device; one `Strategy` spans them all.

#include <type_traits>
#include <mirror/backends/mpi/mpi_group.hpp>
#include <mirror/backends/mpi/communicator.hpp>
#include <mirror/concepts/device.hpp>
#include <mirror/config.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/detail/lean_std.hpp>  // std::chrono durations
#include <mirror/detail/owned.hpp>
#include <mirror/detail/worker_group.hpp>
#if MIRROR_HAS_NCCL
#include <cstdlib>
#include <string>
#include <vector>
#include <mirror/backends/mpi/gpu_placement.hpp>
#include <mirror/backends/nccl/nccl_all_reduce.hpp>  // devices::Cuda, ops::NcclAllReduce: Cluster<Cuda>'s ops
#endif

namespace mirror::devices {

/// A device policy that wraps a local one across the processes of an MPI communicator (TF's
/// `MultiWorkerMirroredStrategy`): W workers × R local replicas, `num_replicas_in_sync() ==
/// W*R`, global replica id `w*R + r` (w = rank in `comm`). Every worker runs the same program.
///
/// **Example** (launch with `mpirun -np 2 ./train`):
/// \code
/// mirror::Strategy<mirror::devices::Cluster<mirror::devices::Threads>> s{{.local = {.replicas = 2}}};
/// s.num_replicas_in_sync();  // 4 with two processes; s.is_chief() on rank 0
/// \endcode
///
/// Building the strategy is collective over `comm`: it initialises MPI (`MPI_THREAD_MULTIPLE`)
/// unless the program did (then at least `MPI_THREAD_SERIALIZED` is required), duplicates `comm`
/// twice with `MPI_ERRORS_RETURN`, checks that R is equal on every worker
/// (`std::invalid_argument` naming the workers otherwise) and starts one communication thread:
/// every MPI call of mirror happens there. Each of these steps waits at most `timeout` for the
/// other workers (`timeout_error`, not a hang, when one never builds its strategy). A
/// `Threads` pool is then told the worker's share of its host's cores (`mpi::group::host_cores`),
/// so that workers sharing a host park rather than spin through each other's time slices.
/// Pair it with ops that cross workers (they declare `crosses_workers`: `ops::Hierarchical`,
/// `ops::NcclAllReduce`); others do not compile.
///
/// **Local devices**: host devices (`devices::Threads`; default ops `ops::Hierarchical`), and in
/// builds with NCCL `devices::Cuda` (default ops `ops::NcclAllReduce`: one NCCL communicator per
/// local GPU spanning every GPU of every worker, W*G ranks, bootstrapped over MPI by the
/// strategy's constructor). With `Cuda`: one replica per GPU (`replicas_per_gpu > 1` is refused
/// with NCCL) and the same number of GPUs on every worker. `.local.gpus` empty gives each worker
/// ONE GPU, the one at its rank among the workers of its host (modulo the GPUs it sees), so
/// `mpirun -np 8` on an 8-GPU node puts one worker on each; list GPUs to use several per
/// worker. Before any CUDA runtime or NCCL call the workers compare the PCI bus ids of their
/// GPUs (`mpi::place_gpus`): two workers of one host on one GPU are `std::invalid_argument` on
/// every worker, naming both, since NCCL refuses two ranks on one GPU — unless NCCL is told to
/// allow it (a distinct `NCCL_HOSTID` per process, or `NCCL_MULTI_RANK_GPU_ENABLE=1` with NCCL
/// 2.30 or newer; docs/multi-worker.md). Host-side
/// cross-worker work (`Strategy::reduce` of host values, variables' initial broadcast,
/// checkpoints, input) goes over MPI exactly as with `Threads`; values with device-resident
/// leaves are reduced by the ops (NCCL), never handed to MPI. Not yet run on a GPU.
template <class Local>
struct Cluster {
  /// The device of each worker's replicas (equal settings on every worker).
  Local local{};
  /// The processes to span (an `MPI_Comm`; default `MPI_COMM_WORLD`); the strategy works on its
  /// own duplicates of it.
  mpi::communicator comm{};
  /// How long a cross-worker collective waits for the other workers before every waiting worker
  /// throws `mirror::timeout_error` naming the replicas that did not arrive. Finite on purpose
  /// (TF has none; PyTorch 10 min).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// Compare counts, element types and ops across workers before each cross-worker collective
  /// (one 2-integer all-reduce): a mismatch is a `shape_error` on every worker instead of
  /// undefined behaviour inside MPI.
  bool validate_shapes = true;

  friend bool operator==(const Cluster&, const Cluster&) = default;

  /// The local runtime (threads, barriers) plus the cross-worker group.
  struct runtime : runtime_t<Local> {
    static_assert(runtime_t<Local>::host_addressable || MIRROR_HAS_NCCL,
                  "mirror::devices::Cluster<devices::Cuda> needs NCCL (the cross-worker all-reduce of GPU "
                  "memory); this mirror was built without it — use devices::Cluster<devices::Threads>, or one "
                  "process with devices::Cuda");

    /// Builds the local runtime and the worker group (collective over `c.comm`; see
    /// `mpi::group` for its errors).
    explicit runtime(const Cluster& c)
        : runtime_t<Local>(local_policy(c)),
          group_(new mpi::group(mpi::group_options{
              c.comm, runtime_t<Local>::num_replicas(), c.timeout, c.validate_shapes})) {
      // Workers on one host share its cores: a pool that counted them all would spin through
      // the time slices of the other workers' replicas and of its own communication thread.
      if constexpr (requires(runtime_t<Local>& r) { r.limit_cores(1u); }) this->limit_cores(group_->host_cores());
      // Scratch stages the cross step of several leaves; after a failure Open MPI may still
      // write into it (a posted collective cannot be cancelled), so it lives as long as the
      // strategy, never trimmed between calls.
      if constexpr (requires(runtime_t<Local>& r) { r.keep_scratch(); }) this->keep_scratch();
      // Local errors (a mismatch, a replica that never arrived) name global replicas, as the
      // other workers' copies of them do.
      if constexpr (requires(runtime_t<Local>& r) { r.number_replicas_from(0); }) {
        this->number_replicas_from(group_->worker_index() * runtime_t<Local>::num_replicas());
      }
    }

    /// The cross-worker collectives (never null).
    detail::worker_group* workers() const noexcept { return group_.get(); }

   private:
    // Local replicas wait in local barriers while their worker's replica 0 is in a cross-worker
    // collective: their own timeout must outlast the cross-worker one, which names the culprit,
    // and the recovery from another worker's failure that may follow it (at most as long again).
    static Local local_policy(const Cluster& c) {
      Local l = c.local;
#if MIRROR_HAS_NCCL
      if constexpr (std::is_same_v<Local, devices::Cuda>) l.gpus = place(c);
#endif
      if constexpr (requires { l.timeout; }) {
        l.timeout += std::chrono::duration_cast<decltype(l.timeout)>(2 * c.timeout + std::chrono::seconds(10));
      }
      return l;
    }
#if MIRROR_HAS_NCCL
    // The GPUs of this worker, agreed with the others before anything touches a GPU
    // (mpi::place_gpus: .local.gpus, or the one at the worker's rank on its host).
    static std::vector<int> place(const Cluster& c) {
      std::vector<std::string> visible;
      for (int d = 0, n = cuda::device_count(); d < n; ++d) visible.push_back(cuda::pci_bus_id(d));
      return mpi::place_gpus(c.comm, c.timeout, c.local.gpus, visible, nccl::impl::shared_gpus_enabled(),
                             nccl::impl::version());
    }
#endif
    detail::owned<mpi::group> group_;
  };
};

}  // namespace mirror::devices

#if MIRROR_HAS_NCCL
namespace mirror {
/// `devices::Cluster<devices::Cuda>` reduces with NCCL across every GPU of every worker (one
/// communicator per local GPU, W*G ranks), not hierarchically over MPI: MPI here is not
/// CUDA-aware, and NCCL picks NVLink or the network itself.
template <>
struct default_ops<devices::Cluster<devices::Cuda>> {
  using type = ops::NcclAllReduce;  ///< the ops policy
};
}  // namespace mirror
#endif
