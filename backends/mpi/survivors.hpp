// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Going on after a worker died: whether this job can (`mpi::fault_tolerant`), and the survivors'
/// communicator to build the next strategy on (`mpi::survivors`). Needs MPI's fault-tolerance
/// extension (ULFM: Open MPI 5 launched with `mpirun --with-ft ulfm`, MPICH);
/// docs/multi-worker.md\#losing-a-worker.

#include <mirror/backends/mpi/communicator.hpp>
#include <mirror/detail/lean_std.hpp>  // std::chrono durations

namespace mirror::mpi {

/// True when a dead worker is a `mirror::worker_lost_error` on the survivors, who can go on: this
/// mirror was built against an MPI with the fault-tolerance extension (`MIRROR_HAS_ULFM`) and the
/// job runs with it on. False otherwise: a dead process then ends the job (Open MPI 4.1), and the
/// way back is a restart from a checkpoint. Initialises MPI (as a strategy would) if nobody has.
bool fault_tolerant();

/// The processes of `comm` that are still alive, as a new communicator in the order of their
/// ranks in `comm` (`MPIX_Comm_shrink`). Collective over the survivors of `comm`: every one of
/// them calls it, after its strategy on `comm` (or on an earlier survivors' communicator) threw
/// `worker_lost_error`. Build the next strategy with `.comm = survivors(...)`, and free the
/// communicator with `release` once no strategy uses it.
///
/// **Errors**: `backend_error` where `fault_tolerant()` is false, naming what to build or launch
/// with; `backend_error` (MPI's code) when the shrink itself fails.
communicator survivors(const communicator& comm);

/// True when every live process of `comm` passed true, the same answer on every one of them even
/// where a process dies meanwhile (`MPIX_Comm_agree`): `mirror::elastic::train` asks it after
/// each strategy's construction, so that either every survivor goes on with its strategy or
/// every one builds the next. Collective over the live processes of `comm`. Without the
/// extension it returns `mine` (a dead process ends the job there). **Errors**: `timeout_error`
/// when a live process does not take part within `timeout`.
bool agree(const communicator& comm, bool mine, std::chrono::milliseconds timeout);

/// Frees a communicator that `survivors` returned (`MPI_Comm_free`) and sets `comm` to
/// MPI_COMM_WORLD; leaves MPI_COMM_WORLD itself alone. Call it after every strategy on `comm` is
/// destroyed.
void release(communicator& comm) noexcept;

}  // namespace mirror::mpi
