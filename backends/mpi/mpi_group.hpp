// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::mpi::group`: the cross-worker collectives of `devices::Cluster`, over MPI. Compiled
/// into libmirror_mpi (mpi_group.cpp and group/), the only files that include <mpi.h>. A worker
/// makes its MPI calls one thread at a time: the group's communication thread, or the caller of a
/// blocking collective while that thread is idle.

#include <exception>
#include <mirror/backends/mpi/communicator.hpp>
#include <mirror/detail/lean_std.hpp>  // std::chrono durations
#include <mirror/detail/owned.hpp>
#include <mirror/detail/worker_group.hpp>

namespace mirror::mpi {

/// What a group is built from (the fields of `devices::Cluster`).
struct group_options {
  communicator comm;                  ///< duplicated twice (data, control); the original is not used
  int local_replicas;                 ///< R on this worker (must be equal on every worker)
  std::chrono::milliseconds timeout;  ///< how long a collective waits for the other workers
  bool validate_shapes;               ///< compare sizes/types/ops across workers before each collective
};

/// W MPI processes that run the same program. Construction is collective over `comm`:
/// initialises MPI (with `MPI_THREAD_MULTIPLE`) if nobody has, duplicates `comm` twice with
/// `MPI_ERRORS_RETURN`, checks that R (and MIRROR_MPI_DIRECT_AGREEMENT) is equal on every
/// worker, and starts the communication thread.
///
/// **Errors**: `std::invalid_argument` for unequal R (naming the workers and their counts), a
/// non-positive timeout, or MPI initialised below `MPI_THREAD_SERIALIZED`; `backend_error` for an
/// MPI failure. Collectives: see `detail::worker_group`. After a failure in fn on any worker, every
/// worker completes the failed run's posted collectives (dummies for those it lacks) before it
/// posts a later one, so the next run works. After a timeout or an MPI error the group is unusable
/// (Open MPI 4.1 cannot cancel a posted collective): every later collective throws at once, and
/// the job should be restarted from its last checkpoint.
class group final : public detail::worker_group {
 public:
  /// Collective over `options.comm` (see the class comment).
  explicit group(const group_options& options);
  ~group() override;
  group(const group&) = delete;
  group& operator=(const group&) = delete;

  ///@{
  /// W, this worker's index w, and its replica count R.
  int num_workers() const noexcept override;
  int worker_index() const noexcept override;
  int local_replicas() const noexcept override;
  ///@}
  /// This worker's share of its host's cores (at least 1): each CPU of its affinity mask counts
  /// 1/k, k = the workers on the host whose masks hold it. Its local pool spins only while
  /// every replica has one of these.
  unsigned host_cores() const noexcept;
  ///@{
  /// The cross-worker collectives `Strategy` and the ops policies call (the worker_group
  /// interface, mirror/detail/worker_group.hpp): a blocking one runs on the calling thread when
  /// the communication thread is idle and nothing was started before it, else on that thread; a
  /// started one always on that thread.
  void reduce_in_worker_order(bool on) noexcept override;
  void check_all_reduce(std::size_t count, detail::element_kind kind, ReduceOp op, const char* what) override;
  void all_reduce(void* data, std::size_t count, detail::element_kind kind, ReduceOp op, const char* what,
                  bool checked) override;
  std::unique_ptr<started_collective> start_all_reduce(void* data, std::size_t count, detail::element_kind kind,
                                                       ReduceOp op, const char* what, bool checked) override;
  void all_reduce_leaves(void* const* leaves, const std::size_t* counts, std::size_t num_leaves,
                         detail::element_kind kind, ReduceOp op, const char* what, bool checked) override;
  std::unique_ptr<started_collective> start_all_reduce_leaves(void* const* leaves, const std::size_t* counts,
                                                              std::size_t num_leaves, detail::element_kind kind,
                                                              ReduceOp op, const char* what, bool checked) override;
  void check_broadcast(const std::size_t* shape, std::size_t num_leaves, int root, const char* what,
                       std::uint64_t nest_hash = 0) override;
  void broadcast(void* data, std::size_t bytes, int root, const char* what) override;
  void reduce_scatter(const void* in, const std::size_t* leaf_sizes, std::size_t num_leaves, void* out,
                      detail::element_kind kind, ReduceOp op, const char* what) override;
  std::unique_ptr<started_collective> start_reduce_scatter(const void* in, const std::size_t* leaf_sizes,
                                                           std::size_t num_leaves, void* out,
                                                           detail::element_kind kind, ReduceOp op,
                                                           const char* what) override;
  void reduce_scatter_leaves(const void* const* in, const std::size_t* leaf_sizes, std::size_t num_leaves,
                             void* const* out, detail::element_kind kind, ReduceOp op, const char* what) override;
  std::unique_ptr<started_collective> start_reduce_scatter_leaves(const void* const* in, const std::size_t* leaf_sizes,
                                                                  std::size_t num_leaves, void* const* out,
                                                                  detail::element_kind kind, ReduceOp op,
                                                                  const char* what) override;
  void all_gather(void* const* leaves, std::size_t num_leaves, const std::size_t* counts, std::size_t element_bytes,
                  const char* what, bool checked, const void* const* own = nullptr) override;
  void all_gather_counts(const std::size_t* mine, std::size_t per_worker, std::size_t* all, const char* what,
                         const void* block = nullptr, std::size_t block_bytes = no_block) override;
  void next_phase() noexcept override;
  void report_failure(int global_replica, const std::exception_ptr& failure) noexcept override;
  void trace_to(detail::trace_track* track) noexcept override;
  void set_device_abort_listener(device_abort_listener* listener) noexcept override;
  void report_device_abort(const std::string& why) noexcept override;
  ///@}

 private:
  struct impl;
  detail::owned<impl> impl_;
};

}  // namespace mirror::mpi
