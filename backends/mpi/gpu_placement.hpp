// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::mpi::place_gpus`: which GPUs each worker of `devices::Cluster<devices::Cuda>` uses,
/// decided together by the workers before any of them builds its CUDA runtime or calls NCCL.

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>
#include <mirror/backends/mpi/communicator.hpp>
#include <mirror/detail/format.hpp>

namespace mirror::mpi {

/// What one worker tells the others about its GPUs.
struct gpu_claim {
  std::string host;                   ///< its host's name (MPI_Get_processor_name)
  std::string nccl_hostid;            ///< its NCCL_HOSTID, or empty (NCCL then derives the host from the host name)
  std::vector<std::string> bus_ids;   ///< the PCI bus id of each GPU it will use
  int visible = 0;                    ///< the GPUs it sees
};

/// The rank of worker `w` among the workers of its host (those before it with the same `hosts`
/// entry): the GPU a worker takes when its `.local.gpus` is empty.
inline int host_rank(std::span<const std::string> hosts, int w) {
  int r = 0;
  for (int v = 0; v < w; ++v) r += hosts[static_cast<std::size_t>(v)] == hosts[static_cast<std::size_t>(w)] ? 1 : 0;
  return r;
}

/// The reason the workers' claims cannot run, or an empty string: two workers that NCCL would
/// see on one host (same host name and same NCCL_HOSTID) using one GPU, which NCCL refuses
/// (with an opaque error from inside its initialisation) unless `shared_gpus_allowed` (NCCL
/// 2.30 or newer with NCCL_MULTI_RANK_GPU_ENABLE=1). Workers with distinct NCCL_HOSTIDs may
/// share a GPU: NCCL then takes them for different hosts and connects them through its socket
/// transport. Every worker computes the same text from the same claims.
inline std::string gpu_conflict(std::span<const gpu_claim> claims, bool shared_gpus_allowed, int nccl_version) {
  if (shared_gpus_allowed) return {};
  for (std::size_t a = 0; a < claims.size(); ++a) {
    for (std::size_t b = a + 1; b < claims.size(); ++b) {
      const gpu_claim &x = claims[a], &y = claims[b];
      if (x.host != y.host || x.nccl_hostid != y.nccl_hostid) continue;
      for (const std::string& id : x.bus_ids) {
        for (const std::string& other : y.bus_ids) {
          if (id != other) continue;
          return detail::format(
                     "mirror::devices::Cluster<devices::Cuda>: workers %zu and %zu, both on host %s%s%s, would use "
                     "the same GPU (PCI %s), and NCCL refuses two ranks on one GPU. Give each worker its own GPU "
                     "(CUDA_VISIBLE_DEVICES per process, or .local.gpus; with .local.gpus empty a worker takes the "
                     "GPU at its rank among its host's workers, modulo the %d it sees), run fewer workers on the "
                     "host, or let NCCL share the GPU: a distinct NCCL_HOSTID per process (NCCL then connects them "
                     "over its socket transport), or NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL 2.30 or newer (this "
                     "process loaded NCCL %d)",
                     a, b, x.host.c_str(), x.nccl_hostid.empty() ? "" : ", NCCL_HOSTID ", x.nccl_hostid.c_str(),
                     id.c_str(), x.visible, nccl_version)
              .c_str();
        }
      }
    }
  }
  return {};
}

/// Collective over `comm` (every worker of the strategy calls it, in its constructor, before
/// the CUDA runtime exists): returns the GPU ordinals this worker uses, `requested` or, where it
/// is empty, the one at the worker's rank among its host's workers (modulo the GPUs it sees:
/// `visible_bus_ids`, one PCI bus id per visible GPU; none: `requested` unchanged, and the CUDA
/// runtime reports the missing GPU). Initialises MPI as `mpi::group` does when the program has
/// not. Two rounds of `MPI_Iallgather` (host names, then the claims), each waited for at most
/// `timeout`. **Errors** (the same on every worker): `std::invalid_argument` with
/// `gpu_conflict`'s text; `mirror::timeout_error` when a worker does not come.
std::vector<int> place_gpus(const communicator& comm, std::chrono::milliseconds timeout, std::span<const int> requested,
                            std::span<const std::string> visible_bus_ids, bool shared_gpus_allowed, int nccl_version);

}  // namespace mirror::mpi
