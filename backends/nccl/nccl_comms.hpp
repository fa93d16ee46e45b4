// SPDX-License-Identifier: Apache-2.0
#pragma once
// The NCCL calls behind ops::NcclAllReduce, declared for host code (defined in nccl_comms.cpp,
// libmirror_nccl, compiled against nccl.h). No NCCL header here, so g++ users need none.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <span>
#include <backends/cuda/element_type.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::nccl::impl {

/// One non-blocking communicator per device of a device set (rank i on devices[i]), its
/// watchdog state, and a ring of completion events per rank. Created once per Strategy.
struct comms;

/// Creates the communicators (ncclCommInitRankConfig for every rank inside one group).
/// Throws mirror::backend_error (ncclResult_t and text), mirror::timeout_error after `timeout`.
comms* create_comms(std::span<const int> devices, std::chrono::milliseconds timeout);
void destroy_comms(comms*) noexcept;

/// On rank `rank`'s thread: all-reduces `counts[i]` elements in place at `buffers[i]` for every
/// i, in one NCCL group on `stream`, and returns once it is enqueued. Its completion is watched:
/// the rank's next call (or destroy_comms) checks its earlier collectives, waiting only when 16
/// are unfinished, and one unfinished `timeout` after it was enqueued aborts every communicator
/// of the set and throws mirror::timeout_error naming the ranks that had not enqueued it; later
/// calls throw mirror::backend_error. `mean` uses ncclAvg
/// for floating point and ncclSum followed by an integer division kernel for integers.
void all_reduce(comms&, int rank, void* stream, ReduceOp op, cuda::element_type type, std::span<void* const> buffers,
                std::span<const std::size_t> counts, std::chrono::milliseconds timeout);

/// The NCCL version this library was built with, e.g. 22809.
int version() noexcept;

}  // namespace mirror::nccl::impl
