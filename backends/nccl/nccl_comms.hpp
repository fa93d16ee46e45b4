// SPDX-License-Identifier: Apache-2.0
#pragma once
// The NCCL calls behind ops::NcclAllReduce, declared for host code (defined in nccl_comms.cpp,
// libmirror_nccl, compiled against nccl.h). No NCCL header here, so g++ users need none.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <cstdint>
#include <span>
#include <mirror/backends/cuda/element_type.hpp>
#include <mirror/reduce_op.hpp>

namespace mirror::detail {
class worker_group;
}

namespace mirror::nccl::impl {

/// One non-blocking communicator per local device of a device set (local rank i on
/// devices[i]), its watchdog state, and a ring of completion events per local rank. Created
/// once per Strategy. With `workers` (devices::Cluster<Cuda>) the set spans every device of
/// every worker: W*G NCCL ranks, local rank i of worker w being NCCL rank w*G + i.
struct comms;

/// Creates the communicators (ncclCommInitRankConfig for every local rank inside one group).
/// With `workers` (non-null; collective over the workers, called by every worker on the thread
/// that may call the group): worker 0 creates the NCCL unique id and the group broadcasts it
/// (the MPI backend's communication thread: no MPI call here); every worker must pass the same
/// number of devices. Throws mirror::backend_error (ncclResult_t and text) — on every worker
/// when worker 0 could not create the id — and mirror::timeout_error after `timeout`.
comms* create_comms(std::span<const int> devices, std::chrono::milliseconds timeout,
                    detail::worker_group* workers = nullptr);
void destroy(comms*) noexcept;  // what detail::owned<comms> calls

/// The number of NCCL ranks of the set (W*G across workers, else G) and this process's first.
int num_ranks(const comms&) noexcept;
int first_rank(const comms&) noexcept;

/// On local rank `rank`'s thread: all-reduces `counts[i]` elements in place at `buffers[i]` for every
/// i, in one NCCL group on `stream`, and returns once it is enqueued. Its completion is watched:
/// the rank's next call (or destroy) checks its earlier collectives, waiting only when 16
/// are unfinished, and one unfinished `timeout` after it was enqueued aborts every communicator
/// of the set and throws mirror::timeout_error naming the ranks that had not enqueued it (NCCL
/// ranks; across workers only this worker's ranks can be named, the agreement check before each
/// call names late workers); later
/// calls throw mirror::backend_error. `mean` uses ncclAvg
/// for floating point and ncclSum followed by an integer division kernel for integers.
void all_reduce(comms&, int rank, void* stream, ReduceOp op, detail::element_kind type, std::span<void* const> buffers,
                std::span<const std::size_t> counts, std::chrono::milliseconds timeout);

/// Elements of scratch device memory `reduce_scatter` needs for leaves of `sizes`: N*ceil(n/N)
/// for each leaf whose length n is not a multiple of the N ranks, 0 for the others.
std::size_t reduce_scatter_scratch(const comms&, std::span<const std::size_t> sizes) noexcept;

/// On local rank `rank`'s thread: for every leaf k, `out[k]` receives the `op`-reduction over all
/// ranks of this rank's cut of `in[k]` (`sizes[k]` elements, cut g = backend::cut_of(sizes[k],
/// N, g) for NCCL rank g), in one NCCL group on `stream`, watched as `all_reduce` is. `out[k]`
/// may be the cut's own place in `in[k]`. A leaf whose length is a multiple of N is one
/// ncclReduceScatter from the leaf itself; any other goes through `scratch`
/// (`reduce_scatter_scratch` elements on the rank's device): copied into N blocks of ceil(n/N),
/// block r holding cut r and a zero, reduce-scattered there in place, and its cut copied out.
void reduce_scatter(comms&, int rank, void* stream, ReduceOp op, detail::element_kind type,
                    std::span<const void* const> in, std::span<void* const> out, std::span<const std::size_t> sizes,
                    void* scratch, std::chrono::milliseconds timeout);

/// On local rank `rank`'s thread: for every leaf k, `out[k]` receives the concatenation over NCCL
/// ranks r = 0..N-1 of rank r's `in[k]` (`counts[r*K + k]` elements, K = in.size(); the same
/// counts on every rank), in one NCCL group on `stream`, watched as `all_reduce` is. One
/// ncclAllGather for a leaf whose counts are all equal, else one ncclBroadcast per rank with a
/// non-empty piece (rooted there, into its offset: NCCL's way to an all-gather of unequal counts).
void all_gather(comms&, int rank, void* stream, detail::element_kind type, std::span<const void* const> in,
                std::span<void* const> out, std::span<const std::size_t> counts, std::chrono::milliseconds timeout);

/// The NCCL version of the library loaded at run time (ncclGetVersion), e.g. 22809.
int version() noexcept;

/// Whether the NCCL loaded at run time accepts several ranks of one process on one GPU: NCCL 2.30
/// or newer with `NCCL_MULTI_RANK_GPU_ENABLE=1` in the environment (an experimental NCCL setting).
bool shared_gpus_enabled() noexcept;

/// How many all-reduces local rank `rank` has handed to NCCL (for tests and diagnostics: on one
/// GPU, where any all-reduce returns its input, this is what shows the NCCL path ran).
std::uint64_t enqueued(const comms&, int rank) noexcept;

/// What a poll of a non-blocking NCCL operation (communicator creation, a group's enqueue) says.
enum class progress { done, pending, failed };
/// The decision, from the result of the call polled (ncclGroupEnd, or ncclCommGetAsyncError
/// itself) and, for ncclCommGetAsyncError, the state it wrote (pass ncclSuccess otherwise), both
/// as `ncclResult_t` values: `ncclInProgress` is pending, `ncclSuccess` done, anything else a
/// failure, which the caller turns into aborted communicators and a `mirror::backend_error`.
progress classify(int call_result, int async_state) noexcept;

}  // namespace mirror::nccl::impl
