// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to libmirror_mpi (not installed): `mirror::mpi::group::impl`, the state of one
// worker's group and the declarations of its parts, each in its own file:
//   mpi_group.cpp            the group: construction (collective over the communicator), its
//                            public collectives (each a job, run by the caller or handed to the
//                            communication thread)
//   group/comm_thread.cpp    the communication thread: the hand-off (or the caller running its
//                            job itself), polling a posted collective, the control communicator
//                            (who-has-arrived queries, notices), timeouts
//   group/collectives.cpp    the MPI collectives a job posts, and the agreement check before them
//   group/agreement_slot.cpp the agreement check's message, which carries a small all-reduce's data
//   group/recovery.cpp       completing a failed run's collectives on every worker
//   group/lost_workers.cpp   a dead worker (MPI's fault-tolerance extension, ULFM), and the
//                            survivors' new communicator (mpi::survivors)
//   gpu_placement.cpp        Cluster<Cuda>'s GPU placement, before the group exists
// and the helpers they share (MPI datatypes and ops, error texts), below.

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <mirror/config.hpp>
#if MIRROR_HAS_ULFM
#include <mpi-ext.h>  // MPIX_Comm_revoke, MPIX_Comm_shrink, ... (group/lost_workers.cpp)
#endif

#include <mirror/backends/mpi/mpi_group.hpp>
#include <mirror/backends/mpi/group/agreement_slot.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#if defined(__linux__)
#include <sched.h>
#endif
#include <mirror/concepts/device.hpp>  // backend::collective_cancelled_rethrow_me
#include <mirror/backend/collective.hpp>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/timeline.hpp>
#include <mirror/backend/cut_of.hpp>
#include <mirror/error.hpp>

namespace mirror::mpi {
namespace support {

using clock = std::chrono::steady_clock;

// Control-communicator tags. Data collectives use the data communicator, so tags never mix.
inline constexpr int tag_query = 1;   // "which collective have you entered?" payload: int64 asked sequence
inline constexpr int tag_reply = 2;   // payload: int64 {entered sequence, asked sequence}
inline constexpr int tag_notice = 3;  // payload: int64 {kind, replica, sequence} then text (a timeout)
// A failure in fn, and every worker's answer to it: int64 {phase, replica, count, n} then n
// posted_op records (posted_words each) then the failure's text (recover() says how it is used).
inline constexpr int tag_failure = 4;

// notice_device_abort: the sender aborted its device communicators (NCCL); the text says why.
enum notice_kind : std::int64_t { notice_failure = 0, notice_timeout = 1, notice_device_abort = 2 };

// A collective posted on the data communicator, described well enough for a worker that did
// not post it to post its match (recover()): what, how many elements of which kind, the op or
// the root. Sent as posted_words int64.
// post_allgather_words: `count` int64 per worker; post_alltoall: blocks of `count` elements;
// post_allgather_bytes: blocks of `count` bytes, `op` 1 when in place; post_agreement: one
// agreement_slot, `count` 1 when it carried data (of `element` under `op`); post_gather_messages:
// blocks of `count` bytes, one message to and from every other worker (tag_gather);
// post_scatter_cuts and post_gather_cuts: the two rounds of reduce_by_messages of `count`
// elements of `element`, each worker's cut (backend::cut_of over W) to or from every other.
enum post_kind : std::int64_t { post_allreduce = 0, post_bcast = 1, post_allgather_words = 2, post_alltoallv = 3,
                                post_allgatherv = 4, post_alltoall = 5, post_allgather_bytes = 6,
                                post_agreement = 7, post_gather_messages = 8, post_scatter_cuts = 9,
                                post_gather_cuts = 10 };
struct posted_op {
  std::int64_t seq = 0;      // its number among this worker's posts (impl::sequence)
  std::int64_t kind = 0;     // post_kind
  std::int64_t count = 0;    // elements (bytes for a broadcast)
  std::int64_t element = 0;  // (category << 8) | bytes
  std::int64_t op = 0;       // ReduceOp, or the root of a broadcast
  std::int64_t phase = 0;    // the caller's phase when it was posted (not sent)
};
inline constexpr std::size_t posted_words = 5;

inline constexpr detail::element_kind int64_kind = detail::element_kind_of<std::int64_t>();

inline std::string error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(buf, static_cast<std::size_t>(len));
}

[[noreturn]] inline void fail(int code, const std::string& call);

// Builds the message only on failure: the polling loops call it for every MPI_Test.
inline void check(int code, const char* call, const char* what = nullptr) {
  if (code != MPI_SUCCESS) fail(code, what == nullptr ? std::string(call) : std::string(call) + " in " + what);
}

inline void fail(int code, const std::string& call) {
  int cls = code;
  MPI_Error_class(code, &cls);
  throw backend_error(detail::format("mirror::devices::Cluster: %s failed with MPI error %d (class %d): %s", call.c_str(),
                                     code, cls, error_text(code).c_str()),
                      code);
}

inline MPI_Datatype datatype_of(detail::element_kind k) {
  using C = detail::element_kind::category;
  switch (k.cat) {
    case C::floating: return k.bytes == 4 ? MPI_FLOAT : k.bytes == 8 ? MPI_DOUBLE : MPI_LONG_DOUBLE;
    case C::signed_integer:
      return k.bytes == 1 ? MPI_INT8_T : k.bytes == 2 ? MPI_INT16_T : k.bytes == 4 ? MPI_INT32_T : MPI_INT64_T;
    case C::unsigned_integer:
      return k.bytes == 1 ? MPI_UINT8_T : k.bytes == 2 ? MPI_UINT16_T : k.bytes == 4 ? MPI_UINT32_T : MPI_UINT64_T;
    case C::bfloat: break;  // the core sends host arithmetic types only
  }
  return MPI_BYTE;
}

// min and max of floating-point values as everywhere in mirror (detail::minimum, maximum: a NaN
// on any worker gives NaN, -0 is below +0). MPI defines MPI_MIN and MPI_MAX for ordered values
// only, and Open MPI's keep whichever operand their comparison picks, so a NaN would survive or
// vanish depending on the order of the workers.
template <bool Max>
void floating_extreme(void* in, void* inout, int* len, MPI_Datatype* type) {
  auto each = [&](const auto* a, auto* b) {
    for (int i = 0; i < *len; ++i) b[i] = Max ? detail::maximum(a[i], b[i]) : detail::minimum(a[i], b[i]);
  };
  if (*type == MPI_FLOAT) {
    each(static_cast<const float*>(in), static_cast<float*>(inout));
  } else if (*type == MPI_DOUBLE) {
    each(static_cast<const double*>(in), static_cast<double*>(inout));
  } else {
    each(static_cast<const long double*>(in), static_cast<long double*>(inout));
  }
}
// Sums of 1- and 2-byte integers wrap around, as everywhere in mirror (two's complement).
// Open MPI 4.1's AVX reductions (its op/avx component, chosen on AVX-512 hosts) saturate them
// instead: MPI_SUM of MPI_INT8_T gave 127 for 100 + 100, and likewise for uint8, int16 and
// uint16 (2 ranks, Debian's 4.1.4); wider integers wrap. So these sums are mirror's own op.
template <class T>
void wrapping_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(static_cast<unsigned>(a[i]) + static_cast<unsigned>(b[i]));
}

inline MPI_Op floating_min = MPI_OP_NULL, floating_max = MPI_OP_NULL;  // made once MPI is initialised
inline MPI_Op narrow_sum[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};  // [signed][2-byte]
inline std::once_flag ops_made;
/// The reductions MPI lacks or gets wrong (above); once per process, after MPI_Init.
inline void make_ops() {
  std::call_once(ops_made, [] {
    check(MPI_Op_create(&floating_extreme<false>, 1, &floating_min), "MPI_Op_create (min)");
    check(MPI_Op_create(&floating_extreme<true>, 1, &floating_max), "MPI_Op_create (max)");
    check(MPI_Op_create(&wrapping_sum<std::uint8_t>, 1, &narrow_sum[0][0]), "MPI_Op_create (sum)");
    check(MPI_Op_create(&wrapping_sum<std::uint16_t>, 1, &narrow_sum[0][1]), "MPI_Op_create (sum)");
    check(MPI_Op_create(&wrapping_sum<std::int8_t>, 1, &narrow_sum[1][0]), "MPI_Op_create (sum)");
    check(MPI_Op_create(&wrapping_sum<std::int16_t>, 1, &narrow_sum[1][1]), "MPI_Op_create (sum)");
  });
}

inline MPI_Op op_of(ReduceOp op, detail::element_kind kind) {
  const bool floating = kind.is_floating();
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean:
      if (!floating && kind.bytes <= 2) {
        return narrow_sum[kind.cat == detail::element_kind::category::signed_integer ? 1 : 0][kind.bytes == 2 ? 1 : 0];
      }
      return MPI_SUM;
    case ReduceOp::prod: return MPI_PROD;
    case ReduceOp::min: return floating ? floating_min : MPI_MIN;
    case ReduceOp::max: return floating ? floating_max : MPI_MAX;
  }
  return MPI_SUM;
}

// A 62-bit mix of what must agree across workers, so that {key, -key} under MAX tells equal
// from unequal in one 2-element all-reduce.
inline std::int64_t agreement_key(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::uint64_t x : {a, b, c}) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return static_cast<std::int64_t>(h & 0x3fffffffffffffffull);
}

/// Keeps the buffers of a non-blocking MPI operation that was given up on alive until the
/// process ends. Open MPI 4.1 cannot cancel a posted collective, and libnbc goes on advancing it
/// inside every later MPI call of the process, writing into its buffers whenever a peer's message
/// for it arrives. The agreement check's buffers were once on the communication thread's stack:
/// a later thread that reused that stack had its saved registers overwritten by an agreement key
/// (a SIGBUS in serve_control, in 5 of 30 ThreadSanitizer runs of tests/mpi/failure_test.cpp
/// with 3 workers, in the first collective after the "exception in fn" case). Such buffers are
/// now on the heap, and handed here when their operation is abandoned.
template <class T>
void keep_until_exit(std::unique_ptr<T[]>& buffer) noexcept {
  static std::mutex mutex;
  static auto* kept = new std::vector<void*>();  // never destroyed: MPI may write until MPI_Finalize
  std::lock_guard lock(mutex);
  try {
    kept->push_back(buffer.get());
  } catch (...) {
    // Out of memory: the buffer is still never freed, just not listed.
  }
  (void)buffer.release();
}

inline std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

/// Initialises MPI (MPI_THREAD_MULTIPLE, finalised at exit) unless the program did; throws
/// std::invalid_argument when it is finalized or below MPI_THREAD_SERIALIZED. (mpi_group.cpp)
void initialize_mpi();
/// For its lifetime, MPI errors on `comm` return instead of calling its error handler (MPI_COMM_WORLD's
/// ends the job): where a worker may die during a call on the user's communicator (the
/// construction, mpi::survivors, mpi::agree) under the fault-tolerance extension. The handler
/// is put back after, unless the scope is left by an exception or keep() was called: then the
/// communicator has a dead member, and MPI may still advance, in any later MPI call of the
/// process, the parts of an operation that failed on it (a duplication's own collectives),
/// whose error would reach the handler. Does nothing when `active` is false.
class errors_returned {
 public:
  errors_returned(MPI_Comm comm, bool active) : comm_(comm), exceptions_(std::uncaught_exceptions()) {
    if (!active) return;
    if (MPI_Comm_get_errhandler(comm_, &previous_) != MPI_SUCCESS) return;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  /// Leaves MPI_ERRORS_RETURN on the communicator (it has lost a process).
  void keep() noexcept { kept_ = true; }
  ~errors_returned() {
    if (previous_ == MPI_ERRHANDLER_NULL) return;
    if (!kept_ && std::uncaught_exceptions() == exceptions_) MPI_Comm_set_errhandler(comm_, previous_);
    MPI_Errhandler_free(&previous_);
  }
  errors_returned(const errors_returned&) = delete;
  errors_returned& operator=(const errors_returned&) = delete;

 private:
  MPI_Comm comm_;
  int exceptions_;
  bool kept_ = false;
  MPI_Errhandler previous_ = MPI_ERRHANDLER_NULL;
};
/// With the fault-tolerance extension: throws worker_lost_error naming the processes of `comm` that
/// MPI knows to have died (and their replicas, `local_replicas` each), when `e` (an MPI failure)
/// is one of the extension's failure classes; returns otherwise. (group/lost_workers.cpp)
void throw_if_lost(const communicator& comm, int local_replicas, const backend_error& e);

/// Polls `request` (a collective of the strategy's construction on `comm`) until it completes;
/// at `deadline` throws mirror::timeout_error saying that not every worker built its strategy
/// within `timeout`. The request is then still posted: its buffers must outlive it
/// (keep_until_exit). (mpi_group.cpp)
void wait_for_everyone(MPI_Request& request, clock::time_point deadline, std::chrono::milliseconds timeout,
                       MPI_Comm comm, const char* call);

}  // namespace support
using namespace support;  // (this header is included only by libmirror_mpi's own files)

struct group::impl {
  struct job {
    enum kind_t { check, reduce, bcast, scatter, gather, counts } kind;
    void* data;
    std::size_t count;  // elements (reduce, check) or bytes (bcast)
    detail::element_kind element;
    ReduceOp op;
    int root;
    const char* what;
    bool checked;
    std::exception_ptr error;
    bool in_worker_order = false;  // reduce: fold the workers' values in worker order (see reduce_in_worker_order)
    bool checks_broadcast = false;  // check: of a broadcast from `root` of leaves `sizes` (check_broadcast)
    std::uint64_t nest_hash = 0;    // check of a broadcast: its nest's type (0: none given)
    // The caller's collective of fn (detail::current_position, read on the caller's thread), for
    // messages; sequence 0 outside fn (then `what` names the API).
    detail::collective_position position{};  // set by run()
    std::int64_t phase = 0;  // the caller's phase (impl::phase) when it handed the job over (run())
    // scatter: the leaf sizes (count: their sum) and where the worker's range goes; gather: the
    // leaves and the W*K counts (count: all leaves' bytes); counts: `out` gets W*count words.
    const std::size_t* sizes = nullptr;
    std::size_t num_sizes = 0;
    void* out = nullptr;
    void* const* leaves = nullptr;
    // reduce or scatter of several leaves where they lie (all_reduce_leaves,
    // reduce_scatter_leaves): leaf k, at leaves[k] (only read by a scatter), has leaf_counts[k]
    // elements (count: their sum), and `data` is null until the leaves are packed
    // (reduce_packed); a scatter writes this worker's range of leaf k to out_leaves[k], not `out`.
    const std::size_t* leaf_counts = nullptr;
    std::size_t num_leaves = 0;
    void* const* out_leaves = nullptr;
    const void* const* own = nullptr;  // gather: this worker's part of each leaf, where not in place
    // counts: this worker's block of the all-gather the counts are for (carried_blocks says how).
    const void* block = nullptr;
    std::size_t block_bytes = detail::worker_group::no_block;
    clock::rep done_at = 0;          // when the thread finished it (written before `done`)
    std::atomic<bool> done{false};  // set (under mutex) after everything else the thread writes
  };
  // A job posted by start_all_reduce or start_reduce_scatter, awaited by its owner (or by its
  // destructor).
  struct started final : detail::worker_group::started_collective {
    impl& group;
    job j;
    std::vector<std::size_t> sizes;  // scatter: the leaf sizes, which j.sizes points to; reduce: j.leaf_counts
    std::vector<void*> leaves;       // several leaves: j.leaves
    std::vector<void*> out_leaves;   // scatter of several leaves: j.out_leaves
    bool waited = false;
    started(impl& g, job::kind_t kind, void* data, std::size_t count, detail::element_kind element, ReduceOp op,
            const char* what, bool checked)
        : group(g), j{kind, data, count, element, op, 0, what, checked, nullptr} {
      j.in_worker_order = g.in_worker_order(element);
    }
    void wait() override {
      waited = true;
      group.await(j);
    }
    bool done() const noexcept override { return j.done.load(std::memory_order_acquire); }
    ~started() override {
      if (waited) return;
      try {
        group.await(j);
      } catch (...) {
        // dropped: nobody asked for the result (worker_group::started_collective)
      }
    }
  };
  // Hands a started job to the communication thread, behind what was posted before it.
  std::unique_ptr<detail::worker_group::started_collective> post_started(std::unique_ptr<started> s) {
    counts_blocks.valid = false;
    s->waited = true;  // (not posted yet: a post that throws leaves nothing to wait for)
    post(s->j);
    s->waited = false;
    return s;
  }
  // Why the group cannot be used any more (guarded by mutex).
  struct broken_state {
    enum { none, timeout, mpi_error, workers_lost } why = none;
    int replica = -1;
    std::string text;
    std::vector<int> missing;  // workers_lost: the lost workers' global replicas
    std::vector<int> lost;     // workers_lost: the lost workers
  };

  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL;
  int W = 1, w = 0, R = 1;
  bool worker_order = false;  // floating-point reductions fold in worker order (set before any collective)
  // Whether a reduction of `kind` folds in worker order. Integer reductions are exact in any
  // order (two's complement wraps alike): they keep MPI's own.
  bool in_worker_order(detail::element_kind kind) const noexcept {
    return worker_order && kind.is_floating();
  }
  unsigned cores = 1;  // this worker's share of its host's cores (at least 1)
  bool oversubscribed = false;  // that share is below one core: more workers than cores on the host
  std::chrono::milliseconds timeout;
  bool validate = true;
  // After a collective the thread spins (yielding) this long for the next job before parking
  // (4-byte all-reduce loop, 2 workers: 41 -> 23 us per call).
  static constexpr std::chrono::microseconds idle_spin{100};
  // The caller spins (yielding) this long for its job before parking on the condition variable:
  // a yield hands the core to the communication thread as a park would, but the return costs
  // no futex wake-up. Measured together with wait()'s yield every 8th MPI_Test instead of every
  // one (2 workers x 1 replica, bench/mpi_cluster_bench, no shape check, medians of 8 alternated
  // pairs): 4 B 18 -> 9-13 us per call, 64 KiB 55-78 -> 37-56 us; either change alone moved
  // neither.
  static constexpr std::chrono::microseconds caller_spin{100};
  // How long a wait polls MPI_Test without yielding (see wait()). 2 workers x 1 replica,
  // medians of 8 alternated pairs against the yield every 8 tests: 4 B 19.5 -> 11.4-12.2 us
  // per call (shape check on), 64 KiB 1.71-2.12x -> 1.29-1.31x raw MPI, 1 MiB 1.00-1.07x ->
  // 0.93-0.94x. Not where the host has fewer cores than workers (`oversubscribed`): there the
  // peer a worker waits for may be waiting for its core, and a wait yields from the start, as
  // Open MPI's own progress loop does then (mpi_yield_when_idle).
  static constexpr std::chrono::milliseconds unyielding_wait{1};
  // Both spins above yield: the cheapest hand-off while nothing but this worker's threads wants
  // the core. When another process is runnable on it, though, a yield hands that process a
  // whole time slice (a tick, 4 ms at 250 Hz): with one busy loop beside 2 workers x 1 replica
  // on 2 cores, a 4-byte all-reduce took 3.7 ms and a 64 KiB one 4.0 ms, against 36 us and
  // 66 us when both threads park at once (a parked thread is woken ahead of such a process).
  // So each spin measures how late it saw the flag it waited for: later than `late_hand_off`
  // means the core was taken, and every hand-off of this worker then parks at once for
  // `parking_period` before spinning is tried again (a loaded machine costs one late hand-off
  // per period, not one per collective). 500 us: far below a time slice, far above the
  // host's own jitter (50 us parked idle workers often enough to cost 4 B calls 30-60 %).
  // Measured with the busy loop, alternated: 4 B 3.8-4.0 ms -> 32-99 us, 64 KiB 3.5-3.9 ms ->
  // 68-153 us; without it no change beyond the noise.
  static constexpr std::chrono::microseconds late_hand_off{500};
  static constexpr std::chrono::milliseconds parking_period{100};
  std::atomic<clock::rep> spin_from{0};   // hand-offs park, not spin, before this time
  std::atomic<clock::rep> posted_at{0};   // when the caller posted `current`
  /// One side of a hand-off: spins (yielding) for up to `limit` from `now` until `flag` is set
  /// by the other side, which stamped `set_at` before setting it; a late sighting starts a
  /// parking period. Returns at once while one is running. The caller parks afterwards (its
  /// wait re-checks the flag under the mutex).
  template <class SetAt>
  void spin_for(const std::atomic<bool>& flag, SetAt set_at, clock::time_point now, clock::duration limit) noexcept {
    if (now.time_since_epoch().count() < spin_from.load(std::memory_order_relaxed)) return;
    const auto until = now + limit;
    while (!flag.load(std::memory_order_acquire) && now < until) {
      std::this_thread::yield();
      now = clock::now();
    }
    if (flag.load(std::memory_order_acquire) &&
        now.time_since_epoch().count() - set_at() > clock::duration(late_hand_off).count()) {
      spin_from.store((now + parking_period).time_since_epoch().count(), std::memory_order_relaxed);
    }
  }

  // Caller <-> communication thread. Jobs run one at a time, in the order they were posted (the
  // order every worker posts them: the calling rule); a caller may post several before it waits
  // (worker_group::start_all_reduce), so they queue.
  std::mutex mutex;
  // Held by whichever thread makes the group's MPI calls and uses the communication-thread state
  // below: the communication thread for each round of its loop, or a caller that runs its own
  // job (drive()). So mirror never makes two MPI calls at once (MPI_THREAD_SERIALIZED is enough),
  // and a job runs after every job queued before it. Taken before `mutex`, never after.
  std::mutex driver;
  std::condition_variable wake_comm, wake_caller;
  std::deque<job*> queue;           // posted, not yet taken by the thread (guarded by mutex)
  std::atomic<bool> posted{false};  // the queue is not empty: what the idle thread spins on
  bool stop = false;
  bool shut_down = false;  // the thread has ended (destruction, or MPI_Finalize's callback)
  int keyval = MPI_KEYVAL_INVALID;  // attribute on MPI_COMM_SELF whose deletion (MPI_Finalize) stops us
  broken_state broken;
  std::vector<std::exception_ptr> symmetric;  // errors raised on every worker together: not forwarded
  std::thread thread;

  // Open MPI's libnbc picks its binomial MPI_Iallreduce (reduce to a root, then broadcast) for
  // every in-place call and for fewer than 4 ranks, which measured 2.1-2.5x slower than the
  // blocking MPI_Allreduce at 64 KiB-16 MiB, 2 ranks; its ring algorithm measured 0.97-1.15x
  // (raw MPI, same run, alternated). So for in-place all-reduces of >= 64 KiB (libnbc's own
  // threshold) the communication thread selects the ring through the MPI_T control variable
  // `coll_libnbc_iallreduce_algorithm` for the one call that posts the collective, and puts
  // `ignore` back — only where the variable exists, is settable and nobody chose a value (an
  // `--mca` setting wins). Every worker decides alike (the count is checked equal, and the
  // construction agrees whether every worker can set the variable), so the schedules match.
  // The choice is read when a collective is posted: another thread of the program posting its own MPI_Iallreduce in that instant could get the ring on one worker
  // only; that needs MPI calls concurrent with mirror's, which the calling rules already
  // restrict to MPI_THREAD_MULTIPLE programs.
  // With 2 workers the ring already wins from 4 KiB: binomial sends the whole buffer, which from
  // 4 KiB no longer fits Open MPI's shared-memory eager limit, the ring sends halves (raw MPI,
  // 2 ranks, alternated in one process: 4 KiB 7.0-7.3 us binomial, 1.6 us ring, 1.2-1.3 us
  // blocking; 2 KiB 1.2-2.0 / 1.3-2.1 us, no gain). Two operands combine to the same bits in
  // either order, so for 2 workers the switch changes no result. With 3 or more workers the
  // ring's 2(W-1) steps cost more than binomial's whole-buffer steps up to a few hundred KiB
  // (raw MPI, 3 ranks: 64 KiB 19 us binomial, 32 us ring; 4 ranks: 33 and 64 us; even at
  // 256 KiB), so there the ring starts at 256 KiB. Every worker applies the same threshold to
  // the same count, so the order of the sum is still the same everywhere.
  static constexpr std::size_t ring_threshold_bytes = 256 * 1024;
  static constexpr std::size_t two_worker_ring_threshold_bytes = 4 * 1024;
  struct libnbc_algorithm {
    bool usable = false;
    bool t_initialised = false;
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    void open() {
      int provided = 0;
      if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return;
      t_initialised = true;
      int index = -1, count = 0, value = -1;
      if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) != MPI_SUCCESS) return;
      if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) != MPI_SUCCESS || count != 1) return;
      if (MPI_T_cvar_read(handle, &value) != MPI_SUCCESS || value != 0) return;  // the user chose one
      usable = set(1) && set(0);  // settable at run time (not read-only / set-once)
    }
    bool set(int value) { return MPI_T_cvar_write(handle, &value) == MPI_SUCCESS; }
    void close() {
      usable = false;
      if (handle != MPI_T_CVAR_HANDLE_NULL) MPI_T_cvar_handle_free(&handle);
      if (t_initialised) MPI_T_finalize();
      t_initialised = false;
    }
  };
  libnbc_algorithm ring_algorithm;  // used under `driver` only (after construction)

  // State of whoever holds `driver` (the communication thread, or a caller in drive()).
  std::int64_t sequence = 0;  // collectives entered so far (the last one's number)
  struct pending_send {
    std::vector<char> bytes;
    MPI_Request request;
  };
  std::list<pending_send> sends;
  std::vector<MPI_Request> abandoned;  // collectives given up on (MPI cannot cancel them)
  std::int64_t asked = -1;             // the sequence of our open query
  std::vector<std::int64_t> replies;   // per worker: the sequence it had entered, -1 = no reply
  std::vector<std::string> reply_sites;  // per worker: where_of its last job, from its reply
  std::vector<std::int64_t> known;     // per worker: the highest sequence it is known to have entered
  std::optional<broken_state> remote;  // a notice received from another worker
  // A device communicators' abort here, to announce (report_device_abort; guarded by mutex), and
  // the listener that hears of the others' (guarded by listener_mutex, held while it is called,
  // so that unregistering waits for a call in progress).
  std::optional<std::string> device_abort;
  std::mutex listener_mutex;
  detail::worker_group::device_abort_listener* device_listener = nullptr;

  // ---------------- recovery from a failure in fn (recover()) ----------------
  // The caller's phase: next_phase() advances it as each run starts and as it ends, on every
  // worker alike (runs are collective), so a failure names the run it ended and a job tells that
  // run's collectives from later ones. Written by the caller; jobs carry it to this thread.
  std::atomic<std::int64_t> phase{0};
  // What kind of error the failed run's first failure was: the other workers throw the same
  // kind (a mismatch or a missing replica inside one worker is a shape_error or timeout_error
  // on every worker, not a replica_error).
  enum failure_kind : std::int64_t { failed_in_fn = 0, failed_shape = 1, failed_timeout = 2 };
  struct failure_info {
    std::int64_t phase = -1;  // the failed run's phase; -1: none yet
    int replica = -1;         // the global replica whose fn threw (the lowest known)
    std::string text;         // what it threw
    std::int64_t kind = failed_in_fn;
    std::vector<int> missing;  // failed_timeout: the global replicas that did not arrive
  };
  failure_info failure;  // the latest failed run (guarded by mutex)
  // After a disagreement inside a run or between workers at different phases
  // (throw_disagreement): every call of this worker of a phase up to refused_through throws
  // `refusal`, the disagreement's error, on every worker alike. Its match on another worker
  // failed already or was never made: the phases a worker ahead passed without a call, the
  // phase whose call it threw, the rest of a run that ended at the error. (Guarded by mutex.)
  std::int64_t refused_through = -1;
  std::exception_ptr refusal;
  std::atomic<std::int64_t> local_failed_phase{-1};  // report_failure's news for the driver
  // The recovery's state (held under `driver`).
  std::int64_t job_phase = 0;  // the phase of the job being executed (or of the last one)
  // The last failed phase recovered from. Atomic only because the idle thread's wake-up test
  // reads it without holding `driver`.
  std::atomic<std::int64_t> drained{-1};
  std::int64_t pending = -1;   // a failed phase learned of and not recovered from yet
  std::deque<posted_op> posts;  // this worker's posts of the last phases (a recovery sends them)
  std::vector<std::pair<std::int64_t, std::int64_t>> phase_starts;  // (phase, sequence before its first job)
  struct status {
    std::int64_t count = 0;        // the worker's posts up to the end of the failed phase
    std::vector<posted_op> posts;  // those of them in that phase
  };
  std::map<std::int64_t, std::vector<std::optional<status>>> statuses;  // per failed phase, per worker

  // ---------------- the broken state (call with mutex held) ----------------
  std::exception_ptr broken_error() const;

  // ---------------- caller side ----------------
  /// Hands `j` to the communication thread, behind the jobs posted before it, and returns.
  void post(job& j);
  /// Blocks until the thread has executed `j`; rethrows its error.
  void await(job& j);
  /// Executes `j` on the calling thread when nothing is queued before it and no other thread is
  /// making the group's MPI calls (`driver` is free), rethrowing its error; false otherwise
  /// (nothing was done). A blocking collective then costs no hand-off: the caller would only
  /// wait for the communication thread, and both would compete for a core.
  bool drive(job& j);
  /// The job, on the calling thread where drive() can, else handed to the communication thread
  /// and awaited.
  void run(job& j) {
    counts_blocks.valid = false;  // only the job right after the counts may take their blocks
    if (drive(j)) return;
    post(j);
    await(j);
  }

  /// The blocks the last counts job carried (agree()), for the all-gather right after it:
  /// worker p's at bytes + at[p], where it came: where its bytes are at most room[p] (in a
  /// slot, every worker's region, which each worker's block filled where it fitted; in a
  /// direct check, the length of the block its message held, 0 where none). Written by
  /// whichever thread executed the counts job, before its `done`; read and cleared on the
  /// caller's thread.
  struct carried_blocks {
    bool valid = false;
    std::vector<unsigned char> bytes;
    std::vector<std::size_t> at, room;
  } counts_blocks;
  /// The rows every agreement exchange receives into (exchange_bytes()), kept from one exchange
  /// to the next rather than allocated per call (4 KiB per worker); where the check is direct
  /// messages, as many again follow, the outbox: a check of cuts sends worker p the message in
  /// its row p there (exchange_cuts), and the all-gather after it receives into it
  /// (gather_cuts). Used by whichever thread executes jobs; given up (keep_until_exit) with an
  /// exchange that is, and then made anew.
  std::unique_ptr<unsigned char[]> exchange_rows;
  unsigned char* rows_for_exchange() {
    if (exchange_rows == nullptr) {
      const std::size_t outbox = W <= direct_agreement ? exchange_bytes() : 0;
      exchange_rows = std::make_unique_for_overwrite<unsigned char[]>(exchange_bytes() + outbox);
    }
    return exchange_rows.get();
  }
  /// A buffer the size of a job's payload (a reduce-scatter's whole vector, an all-to-all's
  /// rows, an all-gather's packed blocks), kept from one job to the next and grown, never
  /// shrunk: a fresh one costs a page fault per 4 KiB on first touch (glibc maps large blocks
  /// anew each time), which at megabytes takes longer than the collective's own transfer. Three,
  /// as a job uses at most three at once (an all-reduce of several leaves packs them into
  /// payload[1]; the worker-order fold's rows are payload[0]; reduce_by_messages folds in
  /// payload[2], beside a piece of several leaves copied into payload[1]). Used by whichever thread
  /// executes jobs; given up (keep_until_exit) with an operation that is, and then made anew.
  struct kept_buffer {
    std::unique_ptr<unsigned char[]> bytes;
    std::size_t size = 0;
    /// At least `n` bytes (1 where `n` is 0), zeros where newly made, else the last job's bytes.
    unsigned char* at_least(std::size_t n) {
      n = std::max<std::size_t>(1, n);
      if (bytes == nullptr || size < n) {
        bytes.reset();
        bytes = std::make_unique<unsigned char[]>(n);
        size = n;
      }
      return bytes.get();
    }
  };
  kept_buffer payload[3];
  /// The bytes per worker a counts job of `words` words per worker leaves in its slot, where it
  /// is carried (carries()): what is left after the W workers' words, split W ways, in whole
  /// words (the slot is summed as int64), and at most worker_group::carried_block_max (a larger
  /// block need not be offered).
  std::size_t block_region(std::size_t words) const noexcept {
    const std::size_t used = static_cast<std::size_t>(W) * words * sizeof(std::int64_t);
    const std::size_t share = (slot_payload_bytes - used) / static_cast<std::size_t>(W);
    return std::min(share, detail::worker_group::carried_block_max) / sizeof(std::int64_t) * sizeof(std::int64_t);
  }
  /// worker_group::all_gather of one leaf from the carried blocks, when every worker's block of
  /// `counts` came with the counts: fills `leaf` (this worker's part from `own` where given) and
  /// returns true; else false, and the all-gather exchanges its blocks itself.
  bool take_carried_blocks(void* leaf, const std::size_t* counts, std::size_t element_bytes, const void* const* own);

  /// Ends the communication thread and frees the communicators; idempotent. Called by the
  /// destructor, or by MPI_Finalize (through the MPI_COMM_SELF attribute) when the program
  /// finalizes MPI first — so the thread never makes an MPI call after MPI_Finalize.
  void shutdown();

  static int on_finalize(MPI_Comm, int, void* attribute, void*);

  // ---------------- under `driver`: the communication thread's loop, and every job ----------------
  void main_loop();

  void mark_broken_mpi(const std::exception_ptr& e);

  // How messages name a job: the user's collective as numbered in fn, or the API outside fn.
  static std::string where_of(const char* what, const detail::collective_position& position);
  /// How a job shows on the timeline's communication track.
  static const char* job_name(const job& j) noexcept;
  // The job being executed (or the last one), for the messages of wait() and of the replies to
  // other workers' queries: formatted only when one is written (where_text()). `what` is a
  // string literal (worker_group's contract), so keeping the pointer is safe.
  const char* where_what = "";
  detail::collective_position where_position{};
  std::string where_text() const { return where_of(where_what, where_position); }
  detail::trace_track* trace = nullptr;  // the timeline's track of the worker's MPI calls (set under mutex), or null

  void execute(job& j);
  /// What execute() does once the job's failure state is settled: its agreement check
  /// (`check_first`) and collective.
  void dispatch(job& j, bool check_first);
  /// A job of several leaves (job::leaf_counts) whose data rides in the agreement check or (an
  /// all-reduce) folds in worker order: its leaves packed into payload[1] (the bytes of one
  /// buffer, as those paths need), dispatched, and an all-reduce's copied back.
  void reduce_packed(job& j, bool check_first);

  /// An all-reduce whose every element folds the workers' values in worker order, (((x0 op x1)
  /// op x2) ...), whatever MPI's algorithms and settings (docs/multi-worker.md\#bits): worker p gets
  /// slice p of every worker's buffer (MPI_Ialltoallv), folds the W copies in worker order
  /// (MPI_Reduce_local: inout = in op inout, and a op b == b op a bitwise for IEEE sums and
  /// products, so each step is acc op x_p), and every worker gathers every slice
  /// (MPI_Iallgatherv in place). The bytes moved equal a ring all-reduce's: 2 (W-1)/W of the
  /// buffer per worker.
  /// Worker p's slice of `n` elements: balanced, as input rows over replicas.
  void slices(std::size_t n, std::vector<int>& counts, std::vector<int>& displs) const;

  void reduce_in_worker_order(job& j);

  /// Whether an all-reduce of `count` elements of `kind` goes by messages (reduce_by_messages):
  /// among 3 to `direct_agreement` workers, a count too large to travel in the agreement check
  /// (whole or in cuts), up to by_messages_max bytes. Every reduction of up to that size among
  /// that many workers then folds in worker order, whatever the MPI configuration, and a
  /// reduce-scatter of the same count takes the same bits from its own fold in worker order
  /// (scatter_by_worker), at the cost of MPI_Reduce_scatter rather than of the all-reduce. Two
  /// workers keep Open MPI's algorithms, faster there, whose order any fold of two shares.
  bool reduces_by_messages(std::size_t count, detail::element_kind kind) const noexcept {
    return W > 2 && beyond_wide(count, kind) && !reduction_in_cuts(count, kind) &&
           count * kind.bytes <= by_messages_max;
  }
  /// Beyond this, the W-1 transfers each way that reduce_by_messages runs at once fall behind
  /// Open MPI's ring, which copies from one neighbour at a time (docs/multi-worker.md,
  /// "Reductions by messages").
  static constexpr std::size_t by_messages_max = 2u << 20;
  /// An all-reduce of `count` elements in place on `buffer`, in two rounds of messages: worker
  /// w sends worker p its cut p (backend::cut_of over W) and folds the W copies of its own cut
  /// in worker order (fold_rows, in payload[2]); then it sends its folded cut to every other
  /// worker, which receives it in place. The bytes of a ring all-reduce, 2 (W-1)/W of the
  /// buffer per worker, in two rounds where the ring takes 2 (W-1) steps and Open MPI's
  /// binomial tree 2 log W. `keep`, where given, owns `buffer` (kept if a wait is given up on).
  void reduce_by_messages(unsigned char* buffer, std::size_t count, detail::element_kind kind, ReduceOp op,
                          const char* what, std::unique_ptr<unsigned char[]>* keep);
  /// Posts one round of reduce_by_messages over `count` elements of `size` bytes: the first
  /// (`to_owners`, on tag_scatter_cuts) sends worker p its cut p and receives this worker's cut
  /// from each; the second (tag_gather_cuts) sends this worker's cut to each and receives cut p
  /// from worker p. Worker p's message is received at `recv(p)` and sent from `send(p)`. The
  /// rounds and a recovery's stand-ins for them post through it, so their sizes match exactly
  /// (a receive shorter than its message fails). Returns how many requests it wrote, 2 (W - 1).
  template <class Recv, class Send>
  int post_cut_round(std::size_t count, std::size_t size, bool to_owners, Recv&& recv, Send&& send,
                     MPI_Request* requests, const char* what) {
    const int tag = to_owners ? tag_scatter_cuts : tag_gather_cuts;
    const std::size_t mine = backend::cut_of(count, W, w).second * size;
    const auto theirs = [&](int p) { return backend::cut_of(count, W, p).second * size; };
    int n = 0;
    for (int p = 0; p < W; ++p) {
      if (p == w) continue;
      check(MPI_Irecv(recv(p), static_cast<int>(to_owners ? mine : theirs(p)), MPI_BYTE, p, tag, data, &requests[n++]),
            "MPI_Irecv (reduction by messages)", what);
    }
    for (int p = 0; p < W; ++p) {
      if (p == w) continue;
      check(MPI_Isend(send(p), static_cast<int>(to_owners ? theirs(p) : mine), MPI_BYTE, p, tag, data, &requests[n++]),
            "MPI_Isend (reduction by messages)", what);
    }
    return n;
  }

  /// An all-reduce in place on `buffer` (`count` elements): above whole_all_reduce_bytes, in
  /// consecutive pieces of about all_reduce_piece_bytes each (cut_of of the count), each an
  /// MPI_Iallreduce, or reduce_by_messages where the count goes so (reduces_by_messages), each
  /// completed before the next is posted, so that a worker is at
  /// most one post ahead of another, as with one collective, and a recovery's stand-ins match
  /// each piece from its own log entry. Open MPI allocates a scratch the size of each call,
  /// which glibc maps anew above 32 MiB (a page fault per 4 KiB), and pieces of a few MiB stay
  /// in cache (docs/multi-worker.md, "Large all-reduces"). Every worker cuts alike, and a
  /// reduce-scatter that takes the all-reduce's bits (scatter()) posts the same pieces. `keep`,
  /// where given, owns `buffer`: kept alive if a wait is given up on (keep_until_exit). With
  /// `parts` (a job of several leaves, not packed), `buffer` is unused and the elements are
  /// parts' leaves one after another: a piece within one leaf is reduced there, one across
  /// leaves is copied into payload[1] and back. MPI sees the pieces of the packed buffer, so
  /// the bits are the packed buffer's.
  void all_reduce_in_pieces(unsigned char* buffer, std::size_t count, detail::element_kind kind, ReduceOp op,
                            const char* call, const char* what, std::unique_ptr<unsigned char[]>* keep,
                            const job* parts = nullptr);
  /// Elements [first, first + n) of a job's leaves (job::leaf_counts), counted across the leaves
  /// one after another: copied to `to`, or from `from` into the leaves.
  static void copy_from_leaves(const job& j, std::size_t first, std::size_t n, unsigned char* to);
  static void copy_to_leaves(const job& j, std::size_t first, std::size_t n, const unsigned char* from);
  /// Elements [first, first + n) of a reduce-scatter's input copied to `to`: from j.data, or
  /// from its leaves where it has no data (reduce_scatter_leaves).
  static void copy_input(const job& j, std::size_t first, std::size_t n, unsigned char* to);
  static constexpr std::size_t whole_all_reduce_bytes = 4u << 20;
  static constexpr std::size_t all_reduce_piece_bytes = 2u << 20;

  /// A collective of nothing that still completes only once every worker has posted it: one
  /// int64 all-reduce (max), in place of an empty payload.
  void sync(job& j);

  /// Worker p's range of a leaf of `size` elements in a reduce-scatter over the W*R global
  /// replicas: the cuts of its replicas p*R .. p*R+R-1, as {first, count}.
  std::pair<std::size_t, std::size_t> worker_range(std::size_t size, int p) const noexcept {
    const std::size_t lo = backend::cut_of(size, W * R, p * R).first;
    const std::size_t hi = p + 1 == W ? size : backend::cut_of(size, W * R, (p + 1) * R).first;
    return {lo, hi - lo};
  }

  /// A reduce-scatter with the bits of the all-reduce (worker_group::reduce_scatter). Where the
  /// all-reduce folds in worker order, or where any order gives the same bits (integers; two
  /// workers, one operation per element), an all-to-all of each worker's ranges and a fold in
  /// worker order as reduce_in_worker_order does it: the bytes of MPI_Reduce_scatter,
  /// (W-1)/W of the buffer per worker. The blocks are the largest worker's range (they differ
  /// by at most R elements per leaf), so that a worker that never posted it can post its match
  /// from one number (recover()). Otherwise (floating point in MPI's order: three workers or
  /// more, above by_messages_max or beyond `direct_agreement` workers) only the all-reduce
  /// itself gives its bits: the same all_reduce_in_pieces of the
  /// whole buffer (a copy, in payload[0]), of which the worker keeps its range.
  void scatter(job& j);
  /// Whether reduce-scatter `j` gets the all-reduce's bits by a fold in worker order: where the
  /// all-reduce folds so (in_worker_order, or its count goes in cuts or by messages:
  /// reduction_in_cuts, reduces_by_messages) or
  /// where any order gives the same bits (integers; two workers). Otherwise only MPI_Iallreduce
  /// of the whole buffer gives them.
  bool scatter_by_worker(const job& j) const noexcept {
    return j.in_worker_order || W == 2 || !j.element.is_floating() || reduction_in_cuts(j.count, j.element) ||
           reduces_by_messages(j.count, j.element);
  }

  /// worker_group::all_gather: one MPI_Iallgather of blocks of the largest worker's bytes
  /// (a worker that never posted it can post its match from that one number), in place when
  /// there is one leaf and every worker's block has that size; otherwise packed and unpacked.
  /// Blocks that fit an agreement slot together travel in one (exchange_slot); one leaf of equal
  /// blocks among at most `direct_agreement` workers goes as messages (post_blocks).
  void gather(job& j);

  /// worker_group::all_gather_counts: one MPI_Iallgather of `count` words per worker.
  void gather_counts(job& j);

  // One worker's description of its collective, gathered only on a mismatch: count, element,
  // what_kind, flag | leaves << 8, its position in fn (sequence; detail::pack_call), its phase,
  // then the API's name (what_words int64, NUL-padded, cut short if longer), then the user's
  // call site (site_words int64, "FILE:LINE", NUL-padded, its end kept if longer: the file's
  // name and the line).
  static constexpr std::size_t what_words = 10;
  static constexpr std::size_t site_words = 12;
  static constexpr std::size_t description_words = 7 + what_words + site_words;
  /// The job's call site as FILE:LINE in at most `room - 1` characters (its end kept), or "".
  static std::string site_of(const job& j, std::size_t room);

  /// The agreement check: {key, -key} under MAX; on a mismatch every worker gathers every
  /// worker's description and throws the same error. The key covers what the collective moves
  /// (count, element type, op or root, leaf sizes) and which call of the program it is: the
  /// user's collective in fn (its number, kind and op or root, as ReplicaContext numbers them) or
  /// the cross-replica API outside fn (`what`), and the run (the phase), so that two different
  /// calls never pair, however alike their payloads (a Strategy::reduce outside run against an
  /// all_reduce in fn; collective #1 of one run against collective #1 of the next). A phase counts
  /// the runs a worker has made, so equal phases are the same run; after a disagreement between
  /// phases the calls of the phases it spoiled are refused (refused_through).
  /// With `carried`, `j`'s elements ride in the check's slot (carries()) and the check is the
  /// whole collective: on agreement they are the reduction's result (all_reduce: in `j.data`;
  /// reduce-scatter: this worker's ranges in `j.out`); where they go in cuts (carries_cuts()),
  /// an all-reduce then gathers the folded cuts (gather_cuts). Without `keyed` (no check to make: it was
  /// made before, or Cluster{.validate_shapes = false}) the keys are zero, so only the data moves.
  void agree(job& j, bool carried = false, bool keyed = true);

  // Up to this many workers an agreement check is one round of messages, each worker's slot to
  // every other, folded by each in worker order: the same bits everywhere, and no libnbc
  // schedule to build per call (a third of the time for 2 workers). More workers use
  // MPI_Iallreduce of the slot, whose messages grow as log W, not W. MIRROR_MPI_DIRECT_AGREEMENT
  // (equal on every worker; checked at construction) moves the limit.
  static constexpr int direct_agreement_default = 8;
  static constexpr int direct_agreement_max = 64;
  int direct_agreement = direct_agreement_default;
  static constexpr int tag_agreement = 1;  // on `data`: MPI keeps collectives' messages apart from these
  static constexpr int tag_gather = 2;     // an all-gather's blocks (post_blocks from gather())
  static constexpr int tag_scatter_cuts = 3;  // reduce_by_messages: each worker's cuts to their owners
  static constexpr int tag_gather_cuts = 4;   // reduce_by_messages: each folded cut to every worker

  /// Posts one round of messages: `mine` (`block` bytes) to every other worker, and worker p's
  /// into `rows + p * capacity` (at most `capacity` bytes, `block` where 0: a shorter message
  /// is received whole) for each other p, on `tag`. With a `send_stride`, worker p is sent its
  /// own message, at `mine + p * send_stride`. Returns how many requests it wrote (2 (W - 1)).
  int post_blocks(void* rows, const void* mine, std::size_t block, int tag, MPI_Request* requests, const char* what,
                  std::size_t capacity = 0, std::size_t send_stride = 0);

  /// The agreement check's exchange: every worker's `slot` (keys and payload filled in) combined
  /// as agreement_combiner(carried, kind, op) says, into `slot`, the same bits on every worker:
  /// one round of messages up to `direct_agreement` workers, else MPI_Iallreduce.
  void exchange_slot(agreement_slot& slot, bool carried, detail::element_kind kind, ReduceOp op, const char* what);

  /// Up to `direct_agreement` workers, an all-reduce or reduce-scatter of more than a slot's
  /// payload rides in the agreement check too, where it fits one message of direct_row_bytes:
  /// the two keys, then the elements (a wide check, exchange_wide). One round of messages, where
  /// the check and MPI_Iallreduce would be two.
  static constexpr std::size_t wide_carry_max = 4016;
  /// Every message of a direct agreement check, a slot or a wide one, is received into a row of
  /// this many bytes: workers that disagree, one sending a wide check and another a slot, then
  /// still complete the exchange and report the mismatch alike (MPI fails a receive shorter than
  /// its message, on that worker only). The size keeps a wide check below the eager limit of
  /// Open MPI's shared-memory transport (4 KiB with its headers): a larger message waits for
  /// its receiver's reply, which costs more than the second round it saves
  /// (docs/multi-worker.md#small-messages).
  static constexpr std::size_t direct_header_bytes = 2 * sizeof(std::int64_t);  // the keys, before a payload
  static constexpr std::size_t direct_row_bytes = direct_header_bytes + wide_carry_max;
  static_assert(direct_row_bytes % alignof(agreement_slot) == 0 && direct_row_bytes >= sizeof(agreement_slot));

  /// The bytes one agreement exchange receives into: W rows of direct_row_bytes where it is
  /// direct messages (this worker's message in row w), else the one slot MPI_Iallreduce
  /// combines in place.
  std::size_t exchange_bytes() const noexcept {
    return W <= direct_agreement ? static_cast<std::size_t>(W) * direct_row_bytes : sizeof(agreement_slot);
  }
  /// Posts one agreement exchange of `rows` (exchange_bytes(), combined as
  /// agreement_combiner(carried, kind, op) says): this worker's message (`bytes`, a slot or a
  /// wide check, at row w) to every other worker and worker p's into row p, or MPI_Iallreduce of
  /// the slot at rows. Returns how many requests it wrote (at most 2 (W - 1)). exchange_slot,
  /// exchange_wide and the recovery's stand-ins post through it, so all match; exchange_cuts
  /// posts the same receives, and a message of its own to each worker, on the same tag.
  int post_slots(unsigned char* rows, std::size_t bytes, bool carried, detail::element_kind kind, ReduceOp op,
                 MPI_Request* requests, const char* what);

  /// Whether `j`, where its check carries it (carries()), goes as a wide check: an all-reduce or
  /// a reduce-scatter whose elements do not fit a slot.
  bool carries_wide(const job& j) const noexcept {
    return (j.kind == job::reduce || j.kind == job::scatter) && j.count * j.element.bytes > slot_payload_bytes;
  }
  /// Whether an all-reduce of `count` elements of `kind` too large for a wide check goes in cuts
  /// (exchange_cuts): up to `direct_agreement` workers, where every worker's cut (backend::cut_of
  /// over W) fits a message of direct_row_bytes with the keys. Its elements then fold in worker
  /// order, as in a wide check, whatever the element type. A reduce-scatter of the same count
  /// must give these bits, so it decides by the same rule (scatter(), carries()).
  bool reduction_in_cuts(std::size_t count, detail::element_kind kind) const noexcept {
    const std::size_t largest = (count + static_cast<std::size_t>(W) - 1) / static_cast<std::size_t>(W);
    return beyond_wide(count, kind) && largest * kind.bytes <= wide_carry_max;
  }
  /// Whether a reduction of `count` elements of `kind` (one MPI has) among 2 to
  /// `direct_agreement` workers is too large for a wide check: where cuts are tried.
  bool beyond_wide(std::size_t count, detail::element_kind kind) const noexcept {
    return W > 1 && W <= direct_agreement && count * kind.bytes > wide_carry_max && datatype_of(kind) != MPI_BYTE;
  }
  /// The elements job `j` sends worker p in a check of cuts: for an all-reduce its cut of j.data
  /// (backend::cut_of over W), for a reduce-scatter p's range of each leaf (worker_range), in
  /// leaf order: `visit(offset, count)` per piece, offsets into j.data, in elements. Returns the
  /// sum of the counts.
  template <class Visit>
  std::size_t visit_cut(const job& j, int p, Visit&& visit) const {
    if (j.kind == job::reduce) {
      const auto [first, count] = backend::cut_of(j.count, W, p);
      visit(first, count);
      return count;
    }
    std::size_t at = 0, total = 0;
    for (std::size_t k = 0; k < j.num_sizes; ++k) {
      const auto [first, count] = worker_range(j.sizes[k], p);
      visit(at + first, count);
      total += count;
      at += j.sizes[k];
    }
    return total;
  }
  /// Whether job `j`, where its check carries it, goes as a check of cuts (exchange_cuts): an
  /// all-reduce of reduction_in_cuts; or a reduce-scatter too large for a wide check whose
  /// ranges fit the messages and whose all-reduce folds in worker order too (scatter_by_worker).
  bool carries_cuts(const job& j) const noexcept;
  /// A check of cuts under `key`: each worker sends each other its elements of that worker's cut
  /// (visit_cut), after the two keys, in one message; each folds the W messages it holds in
  /// worker order (its own cut included). One round of messages for the check and a
  /// reduce-scatter. Returns whether the keys agree, and then this worker's folded cut (its
  /// count of elements) is at exchange_rows + direct_header_bytes, until the next exchange.
  bool exchange_cuts(job& j, std::int64_t key);
  /// Copies job `j`'s elements for worker p (visit_cut) to `to`, packed; returns their bytes.
  std::size_t pack_cut(const job& j, int p, unsigned char* to) const;
  /// An all-reduce's second round after exchange_cuts: every worker's folded cut to every other
  /// (post_blocks, tag_gather), each into its place in j.data.
  void gather_cuts(job& j);
  /// A direct check whose message is this worker's keys and `bytes` of payload, already at
  /// exchange_rows' row w + direct_header_bytes (rows_for_exchange()): one message from each
  /// worker to each, every worker's in its row. Returns whether the keys agree. (`kind`, `op`:
  /// what the recovery's log records.)
  bool exchange_direct(std::int64_t key, std::size_t bytes, detail::element_kind kind, ReduceOp op, const char* what);
  /// Whether every message of a direct check, in its row of `rows`, carries keys equal to `key`.
  bool keys_agree(const unsigned char* rows, std::int64_t key) const noexcept;
  /// Folds W rows of `count` elements of `kind`, `stride` bytes apart from `first`, into the
  /// first in worker order (row 0, then row p op it for p = 1 .. W-1, with op_of(op, kind)):
  /// every worker that folds the same rows gets the same bits. `call` names the MPI call in an
  /// error.
  void fold_rows(unsigned char* first, std::size_t stride, std::size_t count, detail::element_kind kind, ReduceOp op,
                 const char* call, const char* what) const;
  /// A wide check of `j` under `key` (exchange_direct of its elements), folded in worker order.
  /// Returns whether the keys agree, and then the reduction's result (j.count elements) is at
  /// exchange_rows + direct_header_bytes, until the next exchange.
  bool exchange_wide(job& j, std::int64_t key);
  /// A counts job's check as a direct one: each worker's words, then its all-gather block
  /// where it offered one and the message has room for it (its length in the word after the
  /// words), into j.out and counts_blocks. Returns whether the keys agree.
  bool exchange_counts_direct(job& j, std::int64_t key);

  /// Whether job `j`'s agreement check carries its data: an all-reduce, or a reduce-scatter
  /// (an all-reduce of which the worker keeps its ranges), of at most slot_payload_bytes (up
  /// to wide_carry_max where the check is direct messages, and beyond that in cuts where
  /// carries_cuts()), of a
  /// kind MPI has, unless it must fold in worker order and the check does not (MPI_Iallreduce,
  /// over more than two workers); or an all-gather of counts whose words fit (direct: each
  /// worker's in its own message; in a slot: W blocks of words, summed, each zero but on its
  /// owner). Every worker decides alike where the checks agree: the key
  /// covers all of it.
  bool carries(const job& j) const noexcept;

  /// A reduce-scatter's result: this worker's range of each leaf, in turn, into j.out (or each
  /// into its j.out_leaves[k]), from `from`: the reduction of the whole of the input (j.count
  /// elements), or (`packed`) of this worker's ranges only, one after another.
  void keep_ranges(const job& j, const unsigned char* from, bool packed = false) const;

  /// The error of a failed agreement check, from every worker's description (`all`, W of
  /// description_words): the same text and type on every worker. Every worker also refuses its
  /// later calls up to the highest phase any worker stands in, where that is a run or the
  /// workers' phases differ (refused_through), so that a run pairs only with the same run of the
  /// others and the rest of a failed run, started or not, never pairs.
  [[noreturn]] void throw_disagreement(const std::int64_t* all);
  /// After agree()'s keys disagreed: gathers every worker's description of its call (agree()'s
  /// `element`, `what_kind`, `flag` and `call` for `j`) and throws throw_disagreement's error.
  [[noreturn]] void describe_disagreement(const job& j, std::uint64_t element, std::uint64_t what_kind,
                                          std::int64_t flag, std::uint64_t call);

  /// wait(), and when it throws while a request of `requests` is still pending (the wait was
  /// given up, or MPI failed), `buffers` (the requests') are kept alive for the rest of the
  /// process, since MPI may still write into them. A wait that a recovery completed before it
  /// threw (replica_error after recover()) leaves every request null, and the buffers to be
  /// reused: a failed run costs no memory.
  template <class... T>
  void wait_keeping(std::span<MPI_Request> requests, const char* what, std::unique_ptr<T[]>&... buffers) {
    try {
      wait(requests, what);
    } catch (...) {
      if (still_pending(requests)) (keep_until_exit(buffers), ...);
      throw;
    }
  }
  template <class... T>
  void wait_keeping(MPI_Request& request, const char* what, std::unique_ptr<T[]>&... buffers) {
    wait_keeping(std::span<MPI_Request>(&request, 1), what, buffers...);
  }
  static bool still_pending(std::span<const MPI_Request> requests) noexcept {
    return std::any_of(requests.begin(), requests.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  }

  /// Polls `requests` (one post: a collective, or the messages of one agreement check) to
  /// completion, serving the control communicator meanwhile. A failure in fn of this run (on any
  /// worker) ends it with replica_error once recover() has completed it; one of an earlier run is
  /// recovered from, and the wait goes on. timeout_error after the timeout.
  void wait(std::span<MPI_Request> requests, const char* what);
  void wait(MPI_Request& request, const char* what) { wait(std::span<MPI_Request>(&request, 1), what); }

  // Another worker gave up waiting for this one before this collective started: it is the late
  // worker, and fails the same way.
  [[noreturn]] void adopt_remote(job&);

  /// Asks every peer which collective it has entered; names those behind; marks the group
  /// broken and tells the peers (so a late worker fails at its next collective, not after
  /// its own timeout).
  [[noreturn]] void time_out(clock::time_point start, const char*);

  // ---------------- recovery from a failure in fn ----------------
  //
  // MPI matches the collectives of a communicator by their order alone, and Open MPI 4.1 cannot
  // cancel one: once a worker has posted a collective that another will never post (its run
  // failed first), the next collective anyone posts would pair with it, with another's data.
  // So after a run fails on any worker, every worker completes every post of that run before it
  // posts anything later:
  //  1. Each worker learns of the failure: its own replica's (report_failure), or another
  //     worker's message. It then sends every other worker its status: how many collectives it
  //     has posted up to the end of the failed run, and what the last ones were (posted_op).
  //     The same message tells a worker that has not heard of the failure yet.
  //  2. With every worker's status, each knows M, the most any worker posted in that run, and
  //     posts a dummy of each of the collectives it lacks up to M, as the worker that posted it
  //     described it: every post of the run now has its match on every worker, and completes.
  //  3. Each waits for its own outstanding post of the failed run (the one its job was waiting
  //     in) and its dummies; then the data communicator holds nothing stale, and every worker
  //     stands at the same count M.
  // A worker that finished the failed run without noticing (its fn called no collective after
  // the failure) posted all of that run's collectives, so M is its count and it posts nothing:
  // its later collectives (already posted, perhaps) pair with the others', which they post after
  // their recovery. A job of the failed run is not posted at all (throw_if_failed); one that was
  // waiting throws replica_error after step 3, so no buffer is abandoned to MPI. Waiting for the
  // statuses and for step 3 is bounded by the timeout; past it the group is broken as after any
  // timeout.

  static constexpr std::size_t kept_posts = 16;  // a recovery needs the last job's few

  void log_post(post_kind kind, std::size_t count, std::int64_t element, std::int64_t op);

  bool use_ring(std::size_t bytes) const;
  /// MPI_Iallreduce in place of `n` elements on the data communicator, on the ring where
  /// use_ring() says so: the one way a piece and a recovery's stand-in for it are posted, so
  /// that both pick the same algorithm. Returns MPI's code.
  int post_iallreduce(void* buffer, std::size_t n, detail::element_kind kind, ReduceOp op, MPI_Request& request);

  bool is_broken();
  bool is_lost();  // broken because workers died (lose_if_failed)

  void note_local_failure();

  /// Ends a job of the failed run. On the worker where the failure happened its replica's own
  /// exception is what the run reports (with the original nested): the job is only cancelled, as
  /// the local runtime cancels the other replicas. Elsewhere the job throws the failure's kind
  /// with its text: a replica_error (message only; the original exception stays on its worker),
  /// or the same shape_error or timeout_error (with the same missing replicas).
  [[noreturn]] void throw_failure();
  void throw_if_failed(std::int64_t ph);

  /// This worker's posts up to the end of phase `failed`.
  std::int64_t count_through(std::int64_t failed) const;

  // tag_failure's message: head_words int64 {phase, replica, count, n, kind, m}, then n posted_op
  // records (posted_words each), then m missing replicas (int64 each), then the failure's text.
  static constexpr std::size_t head_words = 6;

  void learn_failure(int from, const std::vector<char>& bytes);

  void send_status(std::int64_t failed, const status& mine);

  // A dummy's request and what must outlive it.
  struct dummy {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<MPI_Request> requests;  // a post of its own requests (post_slots, post_blocks)
    std::unique_ptr<unsigned char[]> buffer, rows;
    std::vector<int> counts, displs, from, at;
  };

  /// Posts the match of `o` (another worker's post), with data that nobody reads.
  void post_dummy(const posted_op& o, dummy& d);

  /// The recovery from the failure of phase `failed` (see above). `interrupted`: the requests of
  /// this worker's post of that run that a job was waiting in, or none.
  void recover(std::int64_t failed, std::span<MPI_Request> interrupted);

  // ---------------- leaving: the strategy's destruction ----------------
  // Every worker destroys its strategy at the same point of the program, but not at the same
  // instant: one whose last run failed may still be recovering, and the others must still answer
  // it (its status, its dummies). So a worker that leaves first finishes its own recovery, then
  // tells the others it leaves (on tag_failure, after any status it sent, so a receiver has
  // every status of that worker once it sees it leave), and serves the control communicator,
  // recovering where asked, until every other worker has said so too; bounded by the timeout.
  // After a timeout or an MPI error (broken) nobody waits.
  static constexpr std::int64_t leaving = -2;  // tag_failure's phase field of a leave message
  std::vector<char> left;                      // per worker: it said it leaves

  void leave();

  [[noreturn]] void fail_recovery(const std::string& why);

  /// The recovery's timeout: the workers that did not `step` in time are named, and the group is
  /// broken (its dummies' buffers are kept: MPI may still write into them).
  [[noreturn]] void give_up(std::int64_t failed, clock::time_point start, const char* step,
                            std::vector<dummy>* dummies);

  void announce(std::int64_t kind, int replica, std::int64_t seq, const std::string& text);

  // ---------------- lost workers (group/lost_workers.cpp) ----------------
  // With MPI's fault-tolerance extension on (ULFM: built with it, launched with it), a dead
  // worker makes the MPI calls that involve it fail (MPIX_ERR_PROC_FAILED) instead of ending the
  // job. Whoever holds `driver` and catches an MPI error asks lose_if_failed() first: when the
  // communicators know of a failed process, or another survivor revoked them, the group becomes
  // lost (broken, workers_lost) and every later call throws the same worker_lost_error. It
  // revokes both communicators, so every survivor's pending and later MPI calls on them end at
  // once, wherever it waits (a collective, the agreement check, the control communicator).
  bool fault_tolerant = false;  // ULFM built in and on at run time
  /// The group's worker_lost_error once it is lost (above); null where nothing failed or the
  /// extension is off. Call while holding `driver`, not `mutex`.
  std::exception_ptr lose_if_failed();

  void send(int dest, int tag, const void* bytes, std::size_t n, MPI_Request*);

  void progress_sends();

  // Gives queued notices a moment to leave before the thread ends (a peer that is told fails
  // at once instead of after its timeout); never blocks on an unreachable peer.
  void flush_sends();

  void serve_control();
};

}  // namespace mirror::mpi
