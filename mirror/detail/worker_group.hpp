// SPDX-License-Identifier: Apache-2.0
#pragma once
// The seam between the core and a multi-process backend (backends/mpi): the few cross-worker
// collectives the core itself needs outside an ops policy (Strategy::reduce, variables, input,
// broadcast). Abstract so that the core stays free of MPI headers; a device runtime that spans
// processes exposes one through `worker_group* workers()`. Single-process runtimes have none,
// and every core path that uses it is compiled out for them.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <mirror/detail/lean_std.hpp>  // std::unique_ptr
#include <mirror/reduce_op.hpp>
#include <mirror/detail/element_kind.hpp>

namespace mirror::detail {

class trace_track;

/// W cooperating processes ("workers"), each running the same program with R local replicas.
///
/// **Calling rule.** Every collective below must be called by every worker, in the same order,
/// from one thread of that worker at a time (the run's replica 0, or the user's thread outside
/// `run`). Each call carries which call of the program it is: the calling thread's
/// `detail::current_position` (the user's collective in fn, by number, kind and op or root) and
/// `what` (the API, outside fn: a string literal, which the group may name after the call). A disagreement that the group can detect (sizes, element
/// types, ops, or two different calls) is a `shape_error` on every worker, naming each worker's
/// call; a worker that does not arrive within the timeout is a
/// `timeout_error` on every waiting worker naming its replicas; a failure reported by another
/// worker (`report_failure`) ends every pending and later collective of that run with
/// `replica_error`.
class worker_group {
 public:
  virtual ~worker_group() = default;

  virtual int num_workers() const noexcept = 0;
  virtual int worker_index() const noexcept = 0;
  /// Local replicas per worker (equal on every worker, checked at construction).
  virtual int local_replicas() const noexcept = 0;

  /// From now on, every floating-point `all_reduce` folds the workers' values in worker order,
  /// (((w0 op w1) op w2) ...), whatever the backend's algorithms and settings: the same bits for
  /// the same inputs and W on any MPI configuration. Integer reductions are exact in any order
  /// and keep the backend's. Set by the ops (`ops::MpiAllReduce{.deterministic = true}`) when the
  /// strategy is built, before any collective; every worker must set the same (a mismatch is a
  /// `shape_error` at the next reduction).
  virtual void reduce_in_worker_order(bool on) noexcept = 0;

  /// Only the agreement check of an all_reduce of `count` elements: a `shape_error` on every
  /// worker when some worker passes another count, element type or op. Lets a caller fail
  /// before it changes any value (then it passes `checked = true` to the all_reduce).
  virtual void check_all_reduce(std::size_t count, element_kind kind, ReduceOp op, const char* what) = 0;

  /// In-place element-wise reduction of `count` elements across workers. `op` is the op the
  /// user asked for: `mean` is summed here and divided by the caller, once, by W*R, and is
  /// passed as `mean` so that the agreement check tells it from a `sum`. `what` names the API
  /// for error messages. Checks agreement first unless `checked`.
  virtual void all_reduce(void* data, std::size_t count, element_kind kind, ReduceOp op, const char* what,
                          bool checked = false) = 0;

  /// A cross-worker collective handed to the communication thread and not yet waited for
  /// (start_all_reduce). Destroying one that was never waited for waits for it and drops its
  /// error: the collective may be writing into its buffer until it completes.
  class started_collective {
   public:
    virtual ~started_collective() = default;
    /// Blocks until the collective has completed; throws what the blocking form throws. Once.
    virtual void wait() = 0;
    /// Whether wait() would return at once.
    virtual bool done() const noexcept = 0;
  };

  /// all_reduce, started: handed to the communication thread, which runs it after the
  /// collectives handed over before it while the caller goes on (ReplicaContext::all_reduce_async).
  /// `data` must stay valid, and untouched, until the handle is waited for or destroyed.
  /// Collectives started this way and the blocking ones are posted, on every worker, in the
  /// order the calls are made.
  virtual std::unique_ptr<started_collective> start_all_reduce(void* data, std::size_t count, element_kind kind,
                                                               ReduceOp op, const char* what, bool checked = false) = 0;

  /// all_reduce of a vector held in `num_leaves` parts, `leaves[k]` of `counts[k]` elements, leaf
  /// after leaf: the same checks, errors and bits as all_reduce of the parts packed one after
  /// another into one buffer, without the caller packing them. The group reduces in place what
  /// lies within one leaf and copies only the rest (a nest of large leaves costs no copies).
  virtual void all_reduce_leaves(void* const* leaves, const std::size_t* counts, std::size_t num_leaves,
                                 element_kind kind, ReduceOp op, const char* what, bool checked = false) = 0;

  /// all_reduce_leaves, started, as start_all_reduce is: the leaves must stay valid, and
  /// untouched, until the handle is waited for or destroyed; `leaves` and `counts` are copied.
  virtual std::unique_ptr<started_collective> start_all_reduce_leaves(void* const* leaves, const std::size_t* counts,
                                                                      std::size_t num_leaves, element_kind kind,
                                                                      ReduceOp op, const char* what,
                                                                      bool checked = false) = 0;

  /// Only the agreement check of a broadcast from worker `root` of a nest whose leaves have
  /// `shape[k]` elements (`any_size` for a resizable leaf, which takes the root's size): a
  /// `shape_error` on every worker when some worker passes another root, another fixed size or
  /// makes another call, or a nest of another type (`nest_hash`: equal on every worker for the
  /// same nest type; 0 where there is none), empty or not. Lets ReplicaContext::broadcast refuse
  /// before its local step writes.
  virtual void check_broadcast(const std::size_t* shape, std::size_t num_leaves, int root, const char* what,
                               std::uint64_t nest_hash = 0) = 0;

  /// `bytes` bytes from worker `root` to every worker (same `bytes` everywhere).
  virtual void broadcast(void* data, std::size_t bytes, int root, const char* what) = 0;

  /// The cross-worker step of a reduce-scatter. `in` holds this worker's contribution: its
  /// `num_leaves` leaves of `leaf_sizes[k]` elements, concatenated (read only). On return `out`
  /// holds, for each leaf k in turn, the reduction over workers with `op` (as for all_reduce:
  /// `mean` is summed, and the caller divides) of this worker's range of leaf k: the cuts of global replicas w*R .. w*R+R-1
  /// under backend::cut_of(leaf_sizes[k], W*R, g). `out` may overlap `in`. Every element
  /// has the bits the group's all_reduce of the whole of `in` would give it.
  virtual void reduce_scatter(const void* in, const std::size_t* leaf_sizes, std::size_t num_leaves, void* out,
                              element_kind kind, ReduceOp op, const char* what) = 0;

  /// reduce_scatter of leaves where they lie: `in[k]` (`leaf_sizes[k]` elements) are the
  /// leaves reduce_scatter takes concatenated, and this worker's range of leaf k goes to
  /// `out[k]` (which may lie within `in[k]`). The same checks, errors and bits, without the
  /// caller packing them.
  virtual void reduce_scatter_leaves(const void* const* in, const std::size_t* leaf_sizes, std::size_t num_leaves,
                                     void* const* out, element_kind kind, ReduceOp op, const char* what) = 0;

  /// reduce_scatter_leaves, started, as start_reduce_scatter is: the leaves must stay valid, and
  /// untouched, until the handle is waited for or destroyed; the arrays are copied.
  virtual std::unique_ptr<started_collective> start_reduce_scatter_leaves(const void* const* in,
                                                                          const std::size_t* leaf_sizes,
                                                                          std::size_t num_leaves, void* const* out,
                                                                          element_kind kind, ReduceOp op,
                                                                          const char* what) = 0;

  /// reduce_scatter, started, as start_all_reduce is (ReplicaContext::reduce_scatter_async):
  /// `in` and `out` must stay valid, and untouched, until the handle is waited for or
  /// destroyed; `leaf_sizes` is copied.
  virtual std::unique_ptr<started_collective> start_reduce_scatter(const void* in, const std::size_t* leaf_sizes,
                                                                   std::size_t num_leaves, void* out,
                                                                   element_kind kind, ReduceOp op,
                                                                   const char* what) = 0;

  /// The cross-worker step of an all-gather: `leaves[k]` is the concatenation over workers p of
  /// p's block of `counts[p * num_leaves + k]` elements of `element_bytes` bytes each; this
  /// worker's own block is filled in (or, where `own` is not null, is at `own[k]`, and the group
  /// copies it in while the others' blocks travel), and every other worker's is copied in.
  /// `counts` (W * num_leaves) is equal on every worker. `checked`: the counts come from
  /// all_gather_counts (which checked that the workers agree), so no agreement check of its own;
  /// and where they came with every worker's block (all_gather_counts' `block`), one leaf is
  /// filled from those, with no exchange of its own.
  virtual void all_gather(void* const* leaves, std::size_t num_leaves, const std::size_t* counts,
                          std::size_t element_bytes, const char* what, bool checked,
                          const void* const* own = nullptr) = 0;

  /// all_gather_counts' `block_bytes` where the caller offers no block.
  static constexpr std::size_t no_block = static_cast<std::size_t>(-1);
  /// The largest block all_gather_counts may carry (a backend carries what fits its small
  /// messages: the MPI group, up to about 4 KiB among up to 8 workers): a caller offering a
  /// block of at most this many bytes passes it, a larger one may pass null.
  static constexpr std::size_t carried_block_max = 4000;

  /// `all[p * per_worker + i]` becomes worker p's `mine[i]`, on every worker (`per_worker` must
  /// be equal everywhere: a `shape_error` naming the workers otherwise). The per-replica leaf
  /// counts an all-gather needs (ReplicaContext::all_gather, Strategy::gather).
  ///
  /// `block` (`block_bytes`): this worker's block of the one-leaf all-gather the counts are for,
  /// the same data the next `all_gather(..., checked = true)` moves, offered by every worker or by
  /// none (no_block). Where the counts travel in a small message, the blocks that fit in what is
  /// left of it travel with them, and that all_gather takes them from there when every worker's
  /// did: a small all-gather is one exchange, not two.
  virtual void all_gather_counts(const std::size_t* mine, std::size_t per_worker, std::size_t* all,
                                 const char* what, const void* block = nullptr,
                                 std::size_t block_bytes = no_block) = 0;

  /// Called by `Strategy::run` as each run starts and as it ends, on every worker alike: a failure
  /// belongs to the run it ended, and the collectives after that run (the next run's, a
  /// `reduce`'s) are told from the failed run's, which are never posted once it failed.
  virtual void next_phase() noexcept = 0;

  /// Called once per failed replica function on this worker (`failure` is what it threw): tells
  /// every other worker at once, so their pending and later collectives of the same run end with
  /// `replica_error` instead of waiting for the timeout; then every worker completes that run's
  /// posted collectives, so that the next run works. Errors that every worker raised together (a
  /// cross-worker shape check) and the failure of a run already known to have failed are
  /// recognised and not forwarded.
  virtual void report_failure(int global_replica, const std::exception_ptr& failure) noexcept = 0;

  /// Device communicators that span the workers (NCCL's), told of another worker's abort. Once
  /// one rank aborts its communicator NCCL requires every rank to abort its own: the others'
  /// collectives would otherwise wait on the GPU until their own timeout.
  class device_abort_listener {
   public:
    /// Worker `worker` aborted its communicators because of `why`: abort this worker's. Called
    /// by the thread making the group's MPI calls: its communication thread, or a caller of a
    /// collective (which holds no lock of the listener's).
    virtual void peer_aborted(int worker, const std::string& why) noexcept = 0;
    /// The group is being destroyed: no more calls come, and the listener must not call it.
    virtual void group_gone() noexcept = 0;

   protected:
    ~device_abort_listener() = default;
  };
  /// Registers the listener that hears of other workers' aborts (null unregisters; one at a
  /// time). A group whose workers share no device communicators ignores it.
  virtual void set_device_abort_listener(device_abort_listener* listener) noexcept { (void)listener; }
  /// This worker aborted its device communicators because of `why`: every other worker's
  /// listener hears of it within about a millisecond (docs/multi-worker.md#nccl-across-workers).
  virtual void report_device_abort(const std::string& why) noexcept { (void)why; }

  /// From now on the group records on `track` (null: stops) the spans of its own work for each
  /// call: the agreement check and the collective on the wire (the timeline,
  /// docs/debugging.md#the-timeline). Called between runs; the spans are read after the calls
  /// that made them returned. A group that records nothing ignores it.
  virtual void trace_to(trace_track* track) noexcept { (void)track; }
};

/// Strategy::run's bracket of worker_group::next_phase (none in one process: `group` null).
struct run_phases {
  worker_group* group;
  explicit run_phases(worker_group* g) noexcept : group(g) {
    if (group != nullptr) group->next_phase();
  }
  run_phases(const run_phases&) = delete;
  run_phases& operator=(const run_phases&) = delete;
  ~run_phases() {
    if (group != nullptr) group->next_phase();
  }
};

}  // namespace mirror::detail
