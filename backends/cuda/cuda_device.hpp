// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::devices::Cuda`: replicas on CUDA GPUs, one stream each, several per GPU if asked.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <vector>
#include <mirror/backends/cuda/cuda_runtime.hpp>
#include <mirror/concepts/device.hpp>
#include <mirror/config.hpp>
#include <mirror/default_ops.hpp>
#include <mirror/ops/reduction_to_one_device.hpp>

namespace mirror::devices {

/// The CUDA device: `replicas_per_gpu` replicas on each GPU of `gpus` (empty: every visible
/// GPU), replica r on GPU `gpus[r / replicas_per_gpu]`. Several replicas on one GPU are
/// logical devices, like TF's virtual GPUs, so every policy runs on a one-GPU machine.
///
/// Each replica has its own stream and host thread; `fn` runs with its device current, and
/// what it enqueues on `mirror::cuda::current_stream()` is ordered with the collectives
/// (docs/cuda.md\#the-device). Memory comes from plain `cudaMalloc`; GPUs that can reach each
/// other get peer access; elsewhere copies are staged through host memory.
///
/// **Errors**: `mirror::backend_error` (with the `cudaError_t`) when CUDA has no device or a
/// CUDA call fails; `std::invalid_argument` for a GPU that does not exist, a GPU listed twice,
/// or `replicas_per_gpu < 1`. A collective that a replica does not reach within `timeout` is a
/// `mirror::timeout_error` naming it.
///
/// **Example**: `mirror::Strategy<mirror::devices::Cuda> s{{.gpus = {0}, .replicas_per_gpu = 4}};`
struct Cuda {
  std::vector<int> gpus{};  ///< CUDA ordinals; empty = all visible GPUs
  int replicas_per_gpu = 1;  ///< logical devices per GPU
  /// How long a replica waits in a collective for the others before `mirror::timeout_error`.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);

  friend bool operator==(const Cuda&, const Cuda&) = default;

  /// Owns the streams, events and buffers; built by `Strategy` from this policy. (Its constructor
  /// is defined in libmirror_cuda, which a CUDA program links anyway: inline, it was compiled by
  /// every translation unit that includes <mirror/mirror.hpp> in a CUDA build, Threads-only ones
  /// too.)
  struct runtime : cuda::runtime {
    /// Creates the replicas' streams and events on `d`'s GPUs, enables peer access where it
    /// can, and starts one host thread per replica. **Errors**: `backend_error` (no GPU, a CUDA
    /// failure), `std::invalid_argument` (a GPU that does not exist or is listed twice,
    /// `replicas_per_gpu < 1`).
    explicit runtime(const Cuda& d);
  };
};

static_assert(device<Cuda>);

}  // namespace mirror::devices

// The default ops of devices::Cuda must be the same in every translation unit: in NCCL builds
// the specialisation (ops::NcclAllReduce) comes with the device, never later.
#if MIRROR_HAS_NCCL
#include <mirror/backends/nccl/nccl_all_reduce.hpp>
#endif
