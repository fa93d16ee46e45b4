// SPDX-License-Identifier: Apache-2.0
// A dead worker, with MPI's fault-tolerance extension (ULFM): the group becomes lost and every
// survivor throws the same worker_lost_error (docs/multi-worker.md#losing-a-worker); and the
// survivors' new communicator, on which they build their next strategy (mpi::survivors).
// Without the extension (MIRROR_HAS_ULFM 0) nothing here is ever lost: a dead process ends the
// job, as Open MPI 4.1 does.

#include <mirror/backends/mpi/group/impl.hpp>
#include <mirror/backends/mpi/survivors.hpp>

namespace mirror::mpi {

#if MIRROR_HAS_ULFM
namespace {

// Whether the job runs with the extension on (Open MPI 5: mpirun --with-ft ulfm). Built in but
// off, a failure still ends the job, and the calls below are not to be relied on.
bool extension_on() {
#if defined(MPIX_FT)
  int* on = nullptr;
  int flag = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPIX_FT, &on, &flag) != MPI_SUCCESS || !flag || on == nullptr) return false;
  return *on != 0;
#else
  return true;  // MPICH: on whenever built in
#endif
}

// The ranks of `comm` that MPI knows to have failed, in increasing order.
std::vector<int> failed_ranks(MPI_Comm comm) {
  MPI_Group failed = MPI_GROUP_NULL;
#if defined(OMPI_HAVE_MPIX_COMM_GET_FAILED)
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return {};
#else
  if (MPIX_Comm_failure_ack(comm) != MPI_SUCCESS || MPIX_Comm_failure_get_acked(comm, &failed) != MPI_SUCCESS) return {};
#endif
  int n = 0;
  MPI_Group_size(failed, &n);
  std::vector<int> ranks;
  if (n > 0) {
    MPI_Group all = MPI_GROUP_NULL;
    MPI_Comm_group(comm, &all);
    std::vector<int> in_failed(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) in_failed[static_cast<std::size_t>(k)] = k;
    ranks.assign(static_cast<std::size_t>(n), MPI_UNDEFINED);
    MPI_Group_translate_ranks(failed, n, in_failed.data(), all, ranks.data());
    MPI_Group_free(&all);
    std::erase(ranks, MPI_UNDEFINED);
    std::sort(ranks.begin(), ranks.end());
  }
  MPI_Group_free(&failed);
  return ranks;
}

// failed_ranks(comm), waiting up to `limit` for MPI to name at least one: a revocation or an error
// can reach this process before it hears who died, which it learns while it makes progress (a
// probe of MPI_COMM_SELF gives it; within milliseconds here).
std::vector<int> failed_ranks_within(MPI_Comm comm, clock::duration limit) {
  std::vector<int> ranks = failed_ranks(comm);
  for (const auto until = clock::now() + limit; ranks.empty() && clock::now() < until;) {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ranks = failed_ranks(comm);
  }
  return ranks;
}

bool is_failure_class(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING || cls == MPIX_ERR_REVOKED;
}

MPI_Comm comm_of(const communicator& comm) { return comm.is_world() ? MPI_COMM_WORLD : comm.get<MPI_Comm>(); }

}  // namespace
#endif

namespace support {

void throw_if_lost(const communicator& comm, int local_replicas, const backend_error& e) {
#if MIRROR_HAS_ULFM
  // A duplication whose own collectives met the dead can also end in MPI_ERR_INTERN: a loss
  // where MPI names a dead process of `comm`.
  const bool failure_class = is_failure_class(static_cast<int>(e.code()));
  const std::vector<int> lost =
      failure_class ? failed_ranks(comm_of(comm)) : failed_ranks_within(comm_of(comm), std::chrono::milliseconds(500));
  if (!failure_class && lost.empty()) return;  // another MPI error
  std::vector<int> replicas;
  std::string names;
  for (const int p : lost) {
    names += detail::format("%s%d", names.empty() ? "" : ", ", p).c_str();
    for (int r = 0; r < local_replicas; ++r) replicas.push_back(p * local_replicas + r);
  }
  throw worker_lost_error(detail::format("mirror::devices::Cluster: %s {%s} of the communicator died while the strategy "
                                         "was being built (%s); build it again on the survivors "
                                         "(mirror::mpi::survivors; mirror::elastic::train does)",
                                         lost.size() == 1 ? "process" : "processes", names.c_str(), e.what()),
                          lost, replicas);
#else
  (void)comm;
  (void)local_replicas;
  (void)e;
#endif
}

}  // namespace support

std::exception_ptr group::impl::lose_if_failed() {
#if MIRROR_HAS_ULFM
  if (!fault_tolerant) return nullptr;
  {
    std::lock_guard lock(mutex);
    if (broken.why == broken_state::workers_lost) return broken_error();
  }
  std::vector<int> lost = failed_ranks(data);
  int revoked_data = 0, revoked_control = 0;
  MPIX_Comm_is_revoked(data, &revoked_data);
  MPIX_Comm_is_revoked(control, &revoked_control);
  if (lost.empty() && !revoked_data && !revoked_control) return nullptr;  // another MPI error
  // Every survivor's pending and later calls on these communicators end now, wherever it waits:
  // a survivor that waits on another survivor (a ring's neighbour) would otherwise wait for the
  // timeout.
  if (!revoked_data) MPIX_Comm_revoke(data);
  if (!revoked_control) MPIX_Comm_revoke(control);
  if (lost.empty()) lost = failed_ranks_within(data, std::min<clock::duration>(timeout, std::chrono::seconds(10)));
  // MPI_Finalize waits for every process of MPI_COMM_WORLD, the dead ones too, unless this
  // process acknowledged their failure.
  MPIX_Comm_failure_ack(MPI_COMM_WORLD);
  std::vector<int> replicas;
  std::string workers, names;
  for (const int p : lost) {
    workers += detail::format("%s%d", workers.empty() ? "" : ", ", p).c_str();
    for (int r = 0; r < R; ++r) {
      replicas.push_back(p * R + r);
      names += detail::format("%s%d", names.empty() ? "" : ", ", p * R + r).c_str();
    }
  }
  std::string text;
  if (lost.empty()) {
    text = detail::format("mirror: worker %d of %d: another worker found a dead worker, in %s; this worker's MPI has "
                          "not named the dead yet",
                          w, W, where_text().c_str())
               .c_str();
  } else {
    text = detail::format("mirror: %s %s (global %s {%s}) of %d died, found by worker %d in %s",
                          lost.size() == 1 ? "worker" : "workers", workers.c_str(),
                          replicas.size() == 1 ? "replica" : "replicas", names.c_str(), W, w, where_text().c_str())
               .c_str();
  }
  text +=
      "; this strategy cannot continue: build the next one on the survivors (mirror::mpi::survivors, or "
      "mirror::elastic::train; docs/multi-worker.md#losing-a-worker)";
  std::lock_guard lock(mutex);
  if (broken.why != broken_state::workers_lost) broken = {broken_state::workers_lost, -1, text, replicas, lost};
  return broken_error();
#else
  return nullptr;
#endif
}

bool fault_tolerant() {
#if MIRROR_HAS_ULFM
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) support::initialize_mpi();
  return extension_on();
#else
  return false;
#endif
}

communicator survivors(const communicator& comm) {
#if MIRROR_HAS_ULFM
  const MPI_Comm from = comm_of(comm);
  if (!fault_tolerant()) {
    throw backend_error("mirror::mpi::survivors: MPI's fault-tolerance extension is off in this job; launch it with "
                        "mpirun --with-ft ulfm (Open MPI 5)",
                        -1);
  }
  MPI_Comm shrunk = MPI_COMM_NULL;
  support::errors_returned on_comm{from, true};
  on_comm.keep();  // `from` has lost processes (errors_returned says why)
  support::check(MPIX_Comm_shrink(from, &shrunk), "MPIX_Comm_shrink", "mirror::mpi::survivors");
  MPIX_Comm_failure_ack(from);
  MPI_Comm_set_errhandler(shrunk, MPI_ERRORS_RETURN);
  return communicator(shrunk);
#else
  (void)comm;
  throw backend_error("mirror::mpi::survivors: this mirror was built against an MPI without the fault-tolerance "
                      "extension (ULFM); build it against Open MPI 5 (./dev.sh ft-test shows how) to go on after a "
                      "lost worker",
                      -1);
#endif
}

bool agree(const communicator& comm, bool mine, std::chrono::milliseconds timeout) {
#if MIRROR_HAS_ULFM
  if (fault_tolerant()) {
    const MPI_Comm c = comm_of(comm);
    support::errors_returned on_comm{c, true};
    // On the heap: kept if the wait gives up, since MPI writes the flag when the agreement ends.
    auto flag = std::make_unique<int[]>(1);
    flag[0] = mine ? 1 : 0;
    MPI_Request request = MPI_REQUEST_NULL;
    support::check(MPIX_Comm_iagree(c, flag.get(), &request), "MPIX_Comm_iagree", "mirror::mpi::agree");
    const auto start = support::clock::now();
    for (;;) {
      int done = 0;
      const int code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS && !is_failure_class(code)) support::fail(code, "MPI_Test (MPIX_Comm_iagree) in mirror::mpi::agree");
      if (done || code != MPI_SUCCESS) break;
      if (support::clock::now() - start >= timeout) {
        keep_until_exit(flag);
        throw timeout_error(detail::format("mirror::mpi::agree: not every live process of the communicator agreed "
                                           "within %lld ms",
                                           static_cast<long long>(timeout.count())),
                            {});
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    MPIX_Comm_failure_ack(c);
    if (flag[0] == 0 || !failed_ranks(c).empty()) on_comm.keep();
    return flag[0] != 0;
  }
#endif
  (void)comm;
  (void)timeout;
  return mine;
}

void release(communicator& comm) noexcept {
  if (comm.is_world()) return;
  MPI_Comm c = comm.get<MPI_Comm>();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && c != MPI_COMM_NULL) MPI_Comm_free(&c);
  comm = communicator();
}

}  // namespace mirror::mpi
