// SPDX-License-Identifier: Apache-2.0
// mirror::mpi::group: cross-worker collectives over MPI, driven by one communication thread
// per process (multi_worker.md 5.2): callers hand it one job at a time and wait; it posts the
// non-blocking MPI collective in program order, polls it with MPI_Test, and meanwhile serves
// the control communicator (who-has-arrived queries, failure notices), so that a timeout can
// name the workers that did not arrive and a failure on one worker reaches the others at once.

// mirror uses MPI's C API only: skip Open MPI's and MPICH's deprecated C++ bindings (no
// libmpi_cxx to link).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <backends/mpi/mpi_group.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#if defined(__linux__)
#include <sched.h>
#endif
#include <mirror/concepts/device.hpp>  // detail::collective_cancelled_rethrow_me
#include <mirror/detail/collective.hpp>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/replica_rows.hpp>
#include <mirror/error.hpp>

namespace mirror::mpi {
namespace {

using clock = std::chrono::steady_clock;

// Control-communicator tags. Data collectives use the data communicator, so tags never mix.
constexpr int tag_query = 1;   // "which collective have you entered?" payload: int64 asked sequence
constexpr int tag_reply = 2;   // payload: int64 {entered sequence, asked sequence}
constexpr int tag_notice = 3;  // payload: int64 {kind, replica, sequence} then text (a timeout)
// A failure in fn, and every worker's answer to it: int64 {phase, replica, count, n} then n
// posted_op records (posted_words each) then the failure's text (recover() says how it is used).
constexpr int tag_failure = 4;

enum notice_kind : std::int64_t { notice_failure = 0, notice_timeout = 1 };

// A collective posted on the data communicator, described well enough for a worker that did
// not post it to post its match (recover()): what, how many elements of which kind, the op or
// the root. Sent as posted_words int64.
// post_allgather_words: `count` int64 per worker; post_alltoall: blocks of `count` elements;
// post_allgather_bytes: blocks of `count` bytes, `op` 1 when in place.
enum post_kind : std::int64_t { post_allreduce = 0, post_bcast = 1, post_allgather_words = 2, post_alltoallv = 3,
                                post_allgatherv = 4, post_alltoall = 5, post_allgather_bytes = 6 };
struct posted_op {
  std::int64_t seq = 0;      // its number among this worker's posts (impl::sequence)
  std::int64_t kind = 0;     // post_kind
  std::int64_t count = 0;    // elements (bytes for a broadcast)
  std::int64_t element = 0;  // (category << 8) | bytes
  std::int64_t op = 0;       // ReduceOp, or the root of a broadcast
  std::int64_t phase = 0;    // the caller's phase when it was posted (not sent)
};
constexpr std::size_t posted_words = 5;

std::int64_t code_of(detail::element_kind k) { return static_cast<std::int64_t>(k.cat) << 8 | k.bytes; }
detail::element_kind kind_of(std::int64_t code) {
  return {static_cast<detail::element_kind::category>((code >> 8) & 0xff), static_cast<std::uint8_t>(code & 0xff)};
}
constexpr detail::element_kind int64_kind{detail::element_kind::category::signed_integer, 8};

std::string error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(buf, static_cast<std::size_t>(len));
}

[[noreturn]] void fail(int code, const std::string& call);

// Builds the message only on failure: the polling loops call it for every MPI_Test.
inline void check(int code, const char* call, const char* what = nullptr) {
  if (code != MPI_SUCCESS) fail(code, what == nullptr ? std::string(call) : std::string(call) + " in " + what);
}

void fail(int code, const std::string& call) {
  int cls = code;
  MPI_Error_class(code, &cls);
  throw backend_error("mirror::devices::Cluster: " + call + " failed with MPI error " + std::to_string(code) +
                          " (class " + std::to_string(cls) + "): " + error_text(code),
                      code);
}

MPI_Datatype datatype_of(detail::element_kind k) {
  using C = detail::element_kind::category;
  switch (k.cat) {
    case C::floating: return k.bytes == 4 ? MPI_FLOAT : k.bytes == 8 ? MPI_DOUBLE : MPI_LONG_DOUBLE;
    case C::signed_integer:
      return k.bytes == 1 ? MPI_INT8_T : k.bytes == 2 ? MPI_INT16_T : k.bytes == 4 ? MPI_INT32_T : MPI_INT64_T;
    case C::unsigned_integer:
      return k.bytes == 1 ? MPI_UINT8_T : k.bytes == 2 ? MPI_UINT16_T : k.bytes == 4 ? MPI_UINT32_T : MPI_UINT64_T;
  }
  return MPI_BYTE;
}

std::string kind_name(detail::element_kind k) {
  using C = detail::element_kind::category;
  const char* base = k.cat == C::floating ? "float" : k.cat == C::signed_integer ? "int" : "uint";
  return base + std::to_string(8 * k.bytes);
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
MPI_Op floating_min = MPI_OP_NULL, floating_max = MPI_OP_NULL;  // made once MPI is initialised
std::once_flag floating_ops_made;
void make_floating_ops() {
  std::call_once(floating_ops_made, [] {
    check(MPI_Op_create(&floating_extreme<false>, 1, &floating_min), "MPI_Op_create (min)");
    check(MPI_Op_create(&floating_extreme<true>, 1, &floating_max), "MPI_Op_create (max)");
  });
}

MPI_Op op_of(ReduceOp op, detail::element_kind kind) {
  const bool floating = kind.cat == detail::element_kind::category::floating;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean: return MPI_SUM;
    case ReduceOp::prod: return MPI_PROD;
    case ReduceOp::min: return floating ? floating_min : MPI_MIN;
    case ReduceOp::max: return floating ? floating_max : MPI_MAX;
  }
  return MPI_SUM;
}

// A 62-bit mix of what must agree across workers, so that {key, -key} under MAX tells equal
// from unequal in one 2-element all-reduce.
std::int64_t agreement_key(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::uint64_t x : {a, b, c}) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return static_cast<std::int64_t>(h & 0x3fffffffffffffffull);
}

std::once_flag finalize_registered;
void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
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

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

/// This worker's share of its host's cores: each CPU in its affinity mask counts 1/k, k = the
/// workers on this host whose masks hold it (2 unbound workers on 2 cores: 1 each; bound to a
/// core each: 1 each). At least 1. Collective over `comm`.
unsigned share_of_host_cores(MPI_Comm comm) {
  MPI_Comm host = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host), "MPI_Comm_split_type");
  int size = 1;
  MPI_Comm_size(host, &size);
  double share = 0;
#if defined(__linux__)
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
    for (int c = 0; c < static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) && c < CPU_SETSIZE; ++c) {
      CPU_SET(c, &mine);
    }
  }
  std::vector<cpu_set_t> all(static_cast<std::size_t>(size));
  const int code = MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, host);
  MPI_Comm_free(&host);
  check(code, "MPI_Allgather (affinity masks)");
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &mine)) continue;
    int k = 0;
    for (const cpu_set_t& m : all) k += CPU_ISSET(c, &m) ? 1 : 0;
    share += 1.0 / std::max(k, 1);
  }
#else
  MPI_Comm_free(&host);
  share = static_cast<double>(std::max(1u, std::thread::hardware_concurrency())) / size;
#endif
  return std::max(1u, static_cast<unsigned>(share + 1e-9));
}

}  // namespace

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
    // The caller's collective of fn (detail::current_position, read on the caller's thread), for
    // messages; sequence 0 outside fn (then `what` names the API).
    detail::collective_position position{};
    std::int64_t phase = 0;  // the caller's phase (impl::phase) when it handed the job over
    // scatter: the leaf sizes (count: their sum) and where the worker's range goes; gather: the
    // leaves and the W*K counts (count: all leaves' bytes); counts: `out` gets W*count words.
    const std::size_t* sizes = nullptr;
    std::size_t num_sizes = 0;
    void* out = nullptr;
    void* const* leaves = nullptr;
    clock::rep done_at = 0;          // when the thread finished it (written before `done`)
    std::atomic<bool> done{false};  // set (under mutex) after everything else the thread writes
  };
  // Why the group cannot be used any more (guarded by mutex).
  struct broken_state {
    enum { none, timeout, mpi_error } why = none;
    int replica = -1;
    std::string text;
    std::vector<int> missing;
  };

  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL;
  int W = 1, w = 0, R = 1;
  bool worker_order = false;  // floating-point reductions fold in worker order (set before any collective)
  // Whether a reduction of `kind` folds in worker order. Integer reductions are exact in any
  // order (two's complement wraps alike): they keep MPI's own.
  bool in_worker_order(detail::element_kind kind) const noexcept {
    return worker_order && kind.cat == detail::element_kind::category::floating;
  }
  unsigned cores = 1;  // this worker's share of its host's cores
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
  // 0.93-0.94x; 3 workers on 2 cores: no change beyond the noise.
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

  // Caller <-> communication thread.
  std::mutex caller_mutex;  // serialises callers (held for a whole job; never by the thread)
  std::mutex mutex;
  std::condition_variable wake_comm, wake_caller;
  job* current = nullptr;  // the job being handed over or run
  bool taken = false;      // the communication thread has taken `current`
  std::atomic<bool> posted{false};  // `current` is set and not taken: what the idle thread spins on
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
  // either order, so for 2 workers the switch changes no result; with more it changes the
  // order of the sum, so they keep libnbc's own 64 KiB.
  static constexpr std::size_t ring_threshold_bytes = 64 * 1024;
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
  libnbc_algorithm ring_algorithm;  // used by the communication thread only (after construction)

  // Communication-thread state.
  std::int64_t sequence = 0;  // collectives entered so far (the last one's number)
  struct pending_send {
    std::vector<char> bytes;
    MPI_Request request;
  };
  std::list<pending_send> sends;
  std::vector<MPI_Request> abandoned;  // collectives given up on (MPI cannot cancel them)
  std::int64_t asked = -1;             // the sequence of our open query
  std::vector<std::int64_t> replies;   // per worker: the sequence it had entered, -1 = no reply
  std::vector<std::int64_t> known;     // per worker: the highest sequence it is known to have entered
  std::optional<broken_state> remote;  // a notice received from another worker

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
  std::atomic<std::int64_t> local_failed_phase{-1};  // report_failure's news for this thread
  // Communication-thread state of the recovery.
  std::int64_t job_phase = 0;  // the phase of the job being executed (or of the last one)
  std::int64_t drained = -1;   // the last failed phase recovered from
  std::int64_t pending = -1;   // a failed phase learned of and not recovered from yet
  std::deque<posted_op> posts;  // this worker's posts of the last phases (a recovery sends them)
  std::vector<std::pair<std::int64_t, std::int64_t>> phase_starts;  // (phase, sequence before its first job)
  struct status {
    std::int64_t count = 0;        // the worker's posts up to the end of the failed phase
    std::vector<posted_op> posts;  // those of them in that phase
  };
  std::map<std::int64_t, std::vector<std::optional<status>>> statuses;  // per failed phase, per worker

  // ---------------- the broken state (call with mutex held) ----------------
  std::exception_ptr broken_error() const {
    const std::string tail =
        "; Open MPI cannot cancel a posted collective, so this strategy cannot continue: end the job and restart "
        "it from the last checkpoint (mirror::restore)";
    switch (broken.why) {
      case broken_state::timeout: return std::make_exception_ptr(timeout_error(broken.text + tail, broken.missing));
      case broken_state::mpi_error:
        return std::make_exception_ptr(backend_error("mirror::devices::Cluster: an earlier MPI error: " + broken.text + tail, -1));
      case broken_state::none: break;
    }
    return nullptr;
  }

  // ---------------- caller side ----------------
  void run(job& j) {
    // One job at a time: the calling rule says one caller per worker, but a second thread must
    // not overwrite the job slot if a program breaks it (its order across workers is its own).
    std::lock_guard one_caller(caller_mutex);
    std::unique_lock lock(mutex);
    if (shut_down) {
      throw backend_error("mirror::devices::Cluster: MPI was finalized while the strategy exists; destroy the "
                          "strategy before MPI_Finalize (or let mirror finalize MPI at exit)", -1);
    }
    if (broken.why != broken_state::none) std::rethrow_exception(broken_error());
    current = &j;
    taken = false;
    auto now = clock::now();
    posted_at.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    posted.store(true, std::memory_order_release);
    wake_comm.notify_one();  // no system call when the thread is spinning rather than parked
    lock.unlock();
    spin_for(j.done, [&] { return j.done_at; }, now, caller_spin);
    lock.lock();
    wake_caller.wait(lock, [&] { return j.done.load(std::memory_order_relaxed); });
    if (j.error) std::rethrow_exception(j.error);
  }

  /// Ends the communication thread and frees the communicators; idempotent. Called by the
  /// destructor, or by MPI_Finalize (through the MPI_COMM_SELF attribute) when the program
  /// finalizes MPI first — so the thread never makes an MPI call after MPI_Finalize.
  void shutdown() {
    {
      std::lock_guard lock(mutex);
      if (shut_down) return;
      stop = true;
    }
    wake_comm.notify_one();
    if (thread.joinable()) thread.join();
    std::lock_guard lock(mutex);
    shut_down = true;
    // A broken group has collectives that will never complete on its communicators: leave them
    // (freeing them could wait forever); the job is ending anyway.
    ring_algorithm.close();
    if (broken.why == broken_state::none && abandoned.empty()) {
      MPI_Comm_free(&data);
      MPI_Comm_free(&control);
    }
  }

  static int on_finalize(MPI_Comm, int, void* attribute, void*) {
    static_cast<impl*>(attribute)->shutdown();
    return MPI_SUCCESS;
  }

  // ---------------- communication thread ----------------
  void main_loop() {
    for (bool after_job = false;;) {
      job* j = nullptr;
      bool stopping = false;
      // Right after a collective the next one usually follows at once (a training step's leaves,
      // a loop of all-reduces): spin for it briefly instead of parking, saving the wake-up.
      if (after_job) {
        spin_for(posted, [&] { return posted_at.load(std::memory_order_relaxed); }, clock::now(), idle_spin);
      }
      {
        std::unique_lock lock(mutex);
        // Idle: still serve the control communicator every millisecond (a late worker must
        // answer "which collective have you entered" while its replicas compute).
        wake_comm.wait_for(lock, std::chrono::milliseconds(1), [&] {
          return stop || (current != nullptr && !taken) ||
                 local_failed_phase.load(std::memory_order_relaxed) > drained;
        });
        if (current != nullptr && !taken) {
          taken = true;
          posted.store(false, std::memory_order_relaxed);
          j = current;
        }
        stopping = stop;
      }
      after_job = j != nullptr;
      try {
        serve_control();
        progress_sends();
        // A run failed here or on another worker: recover now, while this thread is free (the
        // others wait for this worker's answer), not when the next job comes.
        note_local_failure();
        if (pending > drained && !is_broken()) recover(pending, nullptr);
      } catch (const timeout_error&) {
        // recover() gave up on a worker and marked the group broken; later jobs throw it.
      } catch (...) {
        mark_broken_mpi(std::current_exception());
      }
      if (j != nullptr) {
        execute(*j);
        std::lock_guard lock(mutex);
        current = nullptr;
        j->done_at = clock::now().time_since_epoch().count();
        j->done.store(true, std::memory_order_release);
        wake_caller.notify_all();
      }
      if (stopping) {
        leave();
        flush_sends();
        return;
      }
    }
  }

  void mark_broken_mpi(const std::exception_ptr& e) {
    std::lock_guard lock(mutex);
    if (broken.why == broken_state::none) broken = {broken_state::mpi_error, -1, what_of(e), {}};
  }

  // How messages name job j: the user's collective as numbered in fn, or the API outside fn.
  static std::string where_of(const job& j) {
    if (j.position.sequence == 0) return j.what;
    return "collective #" + std::to_string(j.position.sequence) + " (" +
           detail::to_string(j.position.kind, j.position.param).text + ") of fn, its cross-worker step";
  }
  std::string where;  // where_of(the job being executed), for wait()'s messages

  void execute(job& j) {
    where = where_of(j);
    job_phase = j.phase;
    if (phase_starts.empty() || phase_starts.back().first < j.phase) {
      phase_starts.emplace_back(j.phase, sequence);
      if (phase_starts.size() > 64) phase_starts.erase(phase_starts.begin());
    }
    try {
      {
        std::lock_guard lock(mutex);
        if (broken.why != broken_state::none) std::rethrow_exception(broken_error());
      }
      if (remote) adopt_remote(j);  // a timeout notice arrived while we were idle
      // A failed run is recovered from before anything later is posted; the failed run's own
      // later collectives are not posted at all.
      note_local_failure();
      if (pending > drained && pending <= j.phase) recover(pending, nullptr);
      throw_if_failed(j.phase);
      // An all-gather's counts were gathered (and checked) just before: equal on every worker.
      const bool check_first =
          j.kind == job::check || (validate && !((j.kind == job::reduce || j.kind == job::gather) && j.checked));
      if (check_first) agree(j);
      if (j.kind == job::check) return;
      // An empty payload still waits for every worker (MPI completes an empty collective at
      // once, alone): a worker whose run failed before this collective must fail it here too.
      if ((j.kind == job::reduce || j.kind == job::bcast || j.kind == job::scatter) && j.count == 0) return sync(j);
      if (j.kind == job::scatter) return scatter(j);
      if (j.kind == job::gather) return gather(j);
      if (j.kind == job::counts) return gather_counts(j);
      if (j.kind == job::reduce && j.in_worker_order) {
        reduce_in_worker_order(j);
        return;
      }
      MPI_Request request = MPI_REQUEST_NULL;
      if (j.kind == job::reduce) {
        log_post(post_allreduce, j.count, code_of(j.element), static_cast<std::int64_t>(j.op));
        const bool ring = use_ring(j.count * j.element.bytes);
        if (ring) ring_algorithm.set(1);
        const int code = MPI_Iallreduce(MPI_IN_PLACE, j.data, static_cast<int>(j.count), datatype_of(j.element),
                                        op_of(j.op, j.element), data, &request);
        if (ring) ring_algorithm.set(0);
        check(code, "MPI_Iallreduce", j.what);
      } else {
        log_post(post_bcast, j.count, 0, j.root);
        check(MPI_Ibcast(j.data, static_cast<int>(j.count), MPI_BYTE, j.root, data, &request),
              "MPI_Ibcast", j.what);
      }
      wait(request, j.what);
    } catch (const backend_error&) {
      j.error = std::current_exception();
      std::lock_guard lock(mutex);
      if (broken.why == broken_state::none) broken = {broken_state::mpi_error, -1, what_of(j.error), {}};
    } catch (...) {
      j.error = std::current_exception();
    }
  }

  /// An all-reduce whose every element folds the workers' values in worker order, (((x0 op x1)
  /// op x2) ...), whatever MPI's algorithms and settings (multi_worker.md 5.2): worker p gets
  /// slice p of every worker's buffer (MPI_Ialltoallv), folds the W copies in worker order
  /// (MPI_Reduce_local: inout = in op inout, and a op b == b op a bitwise for IEEE sums and
  /// products, so each step is acc op x_p), and every worker gathers every slice
  /// (MPI_Iallgatherv in place). The bytes moved equal a ring all-reduce's: 2 (W-1)/W of the
  /// buffer per worker.
  /// Worker p's slice of `n` elements: balanced, as input rows over replicas.
  void slices(std::size_t n, std::vector<int>& counts, std::vector<int>& displs) const {
    counts.assign(static_cast<std::size_t>(W), 0);
    displs.assign(static_cast<std::size_t>(W), 0);
    for (int p = 0; p < W; ++p) {
      const auto [first, count] = detail::replica_rows(n, W, p);
      displs[static_cast<std::size_t>(p)] = static_cast<int>(first);
      counts[static_cast<std::size_t>(p)] = static_cast<int>(count);
    }
  }

  void reduce_in_worker_order(job& j) {
    const std::size_t bytes = j.element.bytes;
    std::vector<int> counts, displs;
    slices(j.count, counts, displs);
    const int mine = counts[static_cast<std::size_t>(w)];
    const MPI_Datatype type = datatype_of(j.element);
    std::vector<int> from(static_cast<std::size_t>(W), mine), at(static_cast<std::size_t>(W));
    for (int p = 0; p < W; ++p) at[static_cast<std::size_t>(p)] = p * mine;
    // On the heap, and kept if the exchange is given up on (keep_until_exit says why).
    auto rows = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W) *
                                                                              static_cast<std::size_t>(mine) * bytes));
    log_post(post_alltoallv, j.count, code_of(j.element), static_cast<std::int64_t>(j.op));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ialltoallv(j.data, counts.data(), displs.data(), type, rows.get(), from.data(), at.data(), type, data,
                         &request),
          "MPI_Ialltoallv (in worker order)", j.what);
    wait_keeping(request, j.what, rows);
    const std::size_t row = static_cast<std::size_t>(mine) * bytes;
    for (int p = 1; p < W; ++p) {
      check(MPI_Reduce_local(rows.get() + static_cast<std::size_t>(p) * row, rows.get(), mine, type,
                             op_of(j.op, j.element)),
            "MPI_Reduce_local (in worker order)", j.what);
    }
    if (row != 0) {
      std::memcpy(static_cast<unsigned char*>(j.data) + static_cast<std::size_t>(displs[static_cast<std::size_t>(w)]) * bytes,
                  rows.get(), row);
    }
    log_post(post_allgatherv, j.count, code_of(j.element), static_cast<std::int64_t>(j.op));
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, counts.data(), displs.data(), type, data,
                          &request),
          "MPI_Iallgatherv (in worker order)", j.what);
    wait(request, j.what);
  }

  /// A collective of nothing that still completes only once every worker has posted it: one
  /// int64 all-reduce (max), in place of an empty payload.
  void sync(job& j) {
    auto word = std::make_unique<std::int64_t[]>(1);
    word[0] = 0;
    log_post(post_allreduce, 1, code_of(int64_kind), static_cast<std::int64_t>(ReduceOp::max));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, word.get(), 1, MPI_INT64_T, MPI_MAX, data, &request),
          "MPI_Iallreduce (empty collective)", j.what);
    wait_keeping(request, j.what, word);
  }

  /// Worker p's range of each of the `K` leaves of `sizes` in a reduce-scatter over the W*R
  /// global replicas: the cuts of its replicas p*R .. p*R+R-1, [first[k*W+p], first + count).
  void worker_ranges(const std::size_t* sizes, std::size_t K, std::vector<std::size_t>& first,
                     std::vector<std::size_t>& count) const {
    first.assign(K * static_cast<std::size_t>(W), 0);
    count.assign(K * static_cast<std::size_t>(W), 0);
    for (std::size_t k = 0; k < K; ++k) {
      for (int p = 0; p < W; ++p) {
        const std::size_t lo = detail::replica_rows(sizes[k], W * R, p * R).first;
        const std::size_t hi = p + 1 == W ? sizes[k] : detail::replica_rows(sizes[k], W * R, (p + 1) * R).first;
        first[k * static_cast<std::size_t>(W) + static_cast<std::size_t>(p)] = lo;
        count[k * static_cast<std::size_t>(W) + static_cast<std::size_t>(p)] = hi - lo;
      }
    }
  }

  /// A reduce-scatter with the bits of the all-reduce (worker_group::reduce_scatter). Where the
  /// all-reduce folds in worker order, or where any order gives the same bits (integers; two
  /// workers, one operation per element), an all-to-all of each worker's ranges and a fold in
  /// worker order as reduce_in_worker_order does it: the bytes of MPI_Reduce_scatter,
  /// (W-1)/W of the buffer per worker. The blocks are the largest worker's range (they differ
  /// by at most R elements per leaf), so that a worker that never posted it can post its match
  /// from one number (recover()). Otherwise (floating point in MPI's order, three workers or
  /// more) only the all-reduce itself gives its bits: the same MPI_Iallreduce of the whole
  /// buffer, of which the worker keeps its range.
  void scatter(job& j) {
    const std::size_t K = j.num_sizes, bytes = j.element.bytes, Wn = static_cast<std::size_t>(W);
    std::vector<std::size_t> first, count, at(K, 0);
    worker_ranges(j.sizes, K, first, count);
    for (std::size_t k = 1; k < K; ++k) at[k] = at[k - 1] + j.sizes[k - 1];
    const auto* in = static_cast<const unsigned char*>(j.data);
    auto* out = static_cast<unsigned char*>(j.out);
    const MPI_Datatype type = datatype_of(j.element);
    const bool by_worker =
        j.in_worker_order || W == 2 || j.element.cat != detail::element_kind::category::floating;
    if (!by_worker) {
      auto whole = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, j.count * bytes));
      if (j.count != 0) std::memcpy(whole.get(), in, j.count * bytes);
      log_post(post_allreduce, j.count, code_of(j.element), static_cast<std::int64_t>(j.op));
      const bool ring = use_ring(j.count * bytes);
      if (ring) ring_algorithm.set(1);
      MPI_Request request = MPI_REQUEST_NULL;
      const int code = MPI_Iallreduce(MPI_IN_PLACE, whole.get(), static_cast<int>(j.count), type,
                                      op_of(j.op, j.element), data, &request);
      if (ring) ring_algorithm.set(0);
      check(code, "MPI_Iallreduce (reduce-scatter)", j.what);
      wait_keeping(request, j.what, whole);
      std::size_t pos = 0;
      for (std::size_t k = 0; k < K; ++k) {
        const std::size_t i = k * Wn + static_cast<std::size_t>(w);
        if (count[i] != 0) std::memmove(out + pos * bytes, whole.get() + (at[k] + first[i]) * bytes, count[i] * bytes);
        pos += count[i];
      }
      return;
    }
    std::vector<std::size_t> per(Wn, 0);  // each worker's elements over all leaves
    for (std::size_t k = 0; k < K; ++k) {
      for (std::size_t p = 0; p < Wn; ++p) per[p] += count[k * Wn + p];
    }
    const std::size_t block = *std::max_element(per.begin(), per.end());
    const std::size_t mine = per[static_cast<std::size_t>(w)];
    if (block > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw std::invalid_argument(std::string(j.what) + ": " + std::to_string(block) +
                                  " elements per worker in one cross-worker reduce-scatter exceed MPI's int count; "
                                  "split the leaf");
    }
    // One leaf whose ranges are equal is already laid out as W blocks: sent as it is.
    const bool direct = K == 1 && std::all_of(per.begin(), per.end(), [&](std::size_t c) { return c == block; });
    // On the heap, and kept if the exchange is given up on (keep_until_exit says why).
    std::unique_ptr<unsigned char[]> packed;
    if (!direct) {
      packed = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, Wn * block * bytes));
      for (std::size_t p = 0; p < Wn; ++p) {
        std::size_t pos = p * block;
        for (std::size_t k = 0; k < K; ++k) {
          const std::size_t i = k * Wn + p;
          if (count[i] != 0) std::memcpy(packed.get() + pos * bytes, in + (at[k] + first[i]) * bytes, count[i] * bytes);
          pos += count[i];
        }
      }
    }
    auto rows = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, Wn * block * bytes));
    log_post(post_alltoall, block, code_of(j.element), static_cast<std::int64_t>(j.op));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ialltoall(direct ? in : packed.get(), static_cast<int>(block), type, rows.get(), static_cast<int>(block),
                        type, data, &request),
          "MPI_Ialltoall (reduce-scatter)", j.what);
    try {
      wait(request, j.what);
    } catch (...) {
      keep_until_exit(rows);
      if (packed) keep_until_exit(packed);
      throw;
    }
    const std::size_t row = block * bytes;
    for (std::size_t p = 1; p < Wn && mine != 0; ++p) {
      check(MPI_Reduce_local(rows.get() + p * row, rows.get(), static_cast<int>(mine), type, op_of(j.op, j.element)),
            "MPI_Reduce_local (reduce-scatter)", j.what);
    }
    if (mine != 0) std::memmove(out, rows.get(), mine * bytes);
  }

  /// worker_group::all_gather: one MPI_Iallgather of blocks of the largest worker's bytes
  /// (a worker that never posted it can post its match from that one number), in place when
  /// there is one leaf and every worker's block has that size; otherwise packed and unpacked.
  void gather(job& j) {
    const std::size_t K = j.num_sizes, bytes = j.element.bytes, Wn = static_cast<std::size_t>(W);
    const std::size_t* counts = j.sizes;
    std::vector<std::size_t> per(Wn, 0);
    for (std::size_t p = 0; p < Wn; ++p) {
      for (std::size_t k = 0; k < K; ++k) per[p] += counts[p * K + k] * bytes;
    }
    const std::size_t block = *std::max_element(per.begin(), per.end());
    if (block == 0) return sync(j);  // nothing anywhere (every worker has the same counts)
    if (block > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw std::invalid_argument(std::string(j.what) + ": " + std::to_string(block) +
                                  " bytes per worker in one cross-worker all-gather exceed MPI's int count; split the "
                                  "leaf");
    }
    MPI_Request request = MPI_REQUEST_NULL;
    if (K == 1 && std::all_of(per.begin(), per.end(), [&](std::size_t c) { return c == block; })) {
      log_post(post_allgather_bytes, block, 0, 1);
      check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.leaves[0], static_cast<int>(block), MPI_BYTE, data,
                           &request),
            "MPI_Iallgather (all-gather)", j.what);
      wait(request, j.what);
      return;
    }
    // Where worker p's block of leaf k starts in leaf k: after the blocks of workers 0..p-1.
    std::vector<std::size_t> at(Wn * K, 0);
    for (std::size_t k = 0; k < K; ++k) {
      for (std::size_t p = 1; p < Wn; ++p) at[p * K + k] = at[(p - 1) * K + k] + counts[(p - 1) * K + k] * bytes;
    }
    // On the heap, and kept if the exchange is given up on (keep_until_exit says why).
    auto send = std::make_unique<unsigned char[]>(block);
    auto recv = std::make_unique<unsigned char[]>(Wn * block);
    std::size_t pos = 0;
    for (std::size_t k = 0; k < K; ++k) {
      const std::size_t n = counts[static_cast<std::size_t>(w) * K + k] * bytes;
      if (n != 0) std::memcpy(send.get() + pos, static_cast<unsigned char*>(j.leaves[k]) + at[static_cast<std::size_t>(w) * K + k], n);
      pos += n;
    }
    log_post(post_allgather_bytes, block, 0, 0);
    check(MPI_Iallgather(send.get(), static_cast<int>(block), MPI_BYTE, recv.get(), static_cast<int>(block), MPI_BYTE,
                         data, &request),
          "MPI_Iallgather (all-gather)", j.what);
    try {
      wait(request, j.what);
    } catch (...) {
      keep_until_exit(send);
      keep_until_exit(recv);
      throw;
    }
    for (std::size_t p = 0; p < Wn; ++p) {
      if (p == static_cast<std::size_t>(w)) continue;
      pos = p * block;
      for (std::size_t k = 0; k < K; ++k) {
        const std::size_t n = counts[p * K + k] * bytes;
        if (n != 0) std::memcpy(static_cast<unsigned char*>(j.leaves[k]) + at[p * K + k], recv.get() + pos, n);
        pos += n;
      }
    }
  }

  /// worker_group::all_gather_counts: one MPI_Iallgather of `count` words per worker.
  void gather_counts(job& j) {
    const std::size_t n = j.count, Wn = static_cast<std::size_t>(W);
    // On the heap, and kept if the exchange is given up on (keep_until_exit says why).
    auto words = std::make_unique<std::int64_t[]>(std::max<std::size_t>(1, n + n * Wn));
    const auto* mine = static_cast<const std::size_t*>(j.data);
    for (std::size_t i = 0; i < n; ++i) words[i] = static_cast<std::int64_t>(mine[i]);
    log_post(post_allgather_words, n, code_of(int64_kind), 0);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgather(words.get(), static_cast<int>(n), MPI_INT64_T, words.get() + n, static_cast<int>(n),
                         MPI_INT64_T, data, &request),
          "MPI_Iallgather (counts)", j.what);
    wait_keeping(request, j.what, words);
    auto* all = static_cast<std::size_t*>(j.out);
    for (std::size_t i = 0; i < n * Wn; ++i) all[i] = static_cast<std::size_t>(words[n + i]);
  }

  /// A 64-bit mix of a text (the API a job names): equal texts, equal hashes.
  static std::uint64_t text_hash(const char* text) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (const char* c = text; c != nullptr && *c != '\0'; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 0x100000001b3ull;
    return h;
  }

  // One worker's description of its collective, gathered only on a mismatch: count, element,
  // what_kind, flag | leaves << 8, its position in fn (sequence; kind << 32 | param), its phase,
  // then the API's name (what_words int64, NUL-padded, cut short if longer).
  static constexpr std::size_t what_words = 10;
  static constexpr std::size_t description_words = 7 + what_words;

  /// The agreement check: {key, -key} under MAX; on a mismatch every worker gathers every
  /// worker's description and throws the same error. The key covers what the collective moves
  /// (count, element type, op or root, leaf sizes) and which call of the program it is: the
  /// user's collective in fn (its number, kind and op or root, as ReplicaContext numbers them) or
  /// the cross-replica API outside fn (`what`), and the run (the phase), so that two different
  /// calls never pair, however alike their payloads (a Strategy::reduce outside run against an
  /// all_reduce in fn; collective #1 of one run against collective #1 of the next). Phases stay
  /// equal on every worker: runs are collective, and a disagreement realigns them (resync_phase).
  void agree(job& j) {
    // What the collective is, in one number: an op in worker order is another collective (an
    // all-to-all and an all-gather): +100; a reduce-scatter +200; a broadcast 1000 + its root.
    std::uint64_t what_kind = 0, element = static_cast<std::uint64_t>(j.element.cat) << 8 | j.element.bytes;
    std::int64_t flag = 0;  // how the message describes it
    switch (j.checks_broadcast ? job::bcast : j.kind) {
      case job::bcast: what_kind = 1000 + static_cast<std::uint64_t>(j.root), element = 0, flag = 1; break;
      case job::scatter: what_kind = 200 + static_cast<std::uint64_t>(j.op) + (j.in_worker_order ? 100 : 0), flag = 2; break;
      case job::gather: what_kind = 500, flag = 3; break;
      case job::counts: what_kind = 600, element = 0, flag = 4; break;
      default: what_kind = static_cast<std::uint64_t>(j.op) + (j.in_worker_order ? 100 : 0); break;
    }
    const std::uint64_t call = static_cast<std::uint64_t>(j.position.kind) << 32 |
                               static_cast<std::uint32_t>(j.position.param);
    std::int64_t key = agreement_key(j.count, element, what_kind);
    key = agreement_key(static_cast<std::uint64_t>(key), j.position.sequence, call);
    // And the run: the phase (odd inside a run, even between runs) tells a worker still in run n
    // from one that returned from it and is in run n + 1 at the same collective number.
    key = agreement_key(static_cast<std::uint64_t>(key), text_hash(j.what), static_cast<std::uint64_t>(j.phase));
    if (j.sizes != nullptr) {
      // Each leaf's size (or each worker's count of each leaf) must agree too, not only the sum.
      const std::size_t n = j.kind == job::gather ? j.num_sizes * static_cast<std::size_t>(W) : j.num_sizes;
      key = agreement_key(static_cast<std::uint64_t>(key), detail::shape_hash(j.sizes, n), j.num_sizes);
    }
    // On the heap, and kept if the check is given up on (keep_until_exit says why).
    auto both = std::make_unique<std::int64_t[]>(2);
    both[0] = key;
    both[1] = -key;
    log_post(post_allreduce, 2, code_of(int64_kind), static_cast<std::int64_t>(ReduceOp::max));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, both.get(), 2, MPI_INT64_T, MPI_MAX, data, &request),
          "MPI_Iallreduce (agreement check)", j.what);
    wait_keeping(request, j.what, both);
    if (both[0] == -both[1]) return;
    // Mine, then every worker's.
    constexpr std::size_t D = description_words;
    auto gathered = std::make_unique<std::int64_t[]>(D + D * static_cast<std::size_t>(W));
    std::int64_t* const mine = gathered.get();
    const std::int64_t* const all = mine + D;
    mine[0] = static_cast<std::int64_t>(j.count);
    mine[1] = static_cast<std::int64_t>(element);
    mine[2] = static_cast<std::int64_t>(what_kind);
    mine[3] = flag | static_cast<std::int64_t>(j.num_sizes) << 8;
    mine[4] = static_cast<std::int64_t>(j.position.sequence);
    mine[5] = static_cast<std::int64_t>(call);
    mine[6] = phase.load(std::memory_order_relaxed);
    std::strncpy(reinterpret_cast<char*>(mine + 7), j.what != nullptr ? j.what : "", what_words * sizeof(std::int64_t) - 1);
    log_post(post_allgather_words, D, code_of(int64_kind), 0);
    check(MPI_Iallgather(mine, static_cast<int>(D), MPI_INT64_T, mine + D, static_cast<int>(D), MPI_INT64_T, data,
                         &request),
          "MPI_Iallgather (agreement check)", j.what);
    wait_keeping(request, j.what, gathered);
    throw_disagreement(all);
  }

  /// The error of a failed agreement check, from every worker's description (`all`, W of
  /// description_words): the same text and type on every worker. Every worker also aligns its
  /// phase with the others' (resync_phase), so that a worker that made a call outside run while
  /// the others ran fn still tells the same runs apart afterwards.
  [[noreturn]] void throw_disagreement(const std::int64_t* all) {
    constexpr std::size_t D = description_words;
    const auto desc = [&](int p) { return &all[D * static_cast<std::size_t>(p)]; };
    const auto replicas_of = [&](int p) {
      return "replicas " + std::to_string(p * R) + ".." + std::to_string(p * R + R - 1);
    };
    // Where each worker is: what its cross-worker step moves, then the user's call.
    std::string table;
    bool described_alike = true;
    for (int p = 0; p < W; ++p) {
      const std::int64_t* d = desc(p);
      described_alike = described_alike && std::equal(d, d + 6, desc(0)) && std::equal(d + 7, d + D, desc(0) + 7);
      table += (p == 0 ? " " : "; ") + std::string("worker ") + std::to_string(p) + " (" + replicas_of(p) + ") ";
      const detail::element_kind k{static_cast<detail::element_kind::category>(d[1] >> 8),
                                   static_cast<std::uint8_t>(d[1] & 0xff)};
      const std::string leaves = " in " + std::to_string(d[3] >> 8) + " leaves";
      const std::string order = (d[2] % 200) >= 100 ? " in worker order (MpiAllReduce{.deterministic = true})" : "";
      switch (d[3] & 0xff) {
        case 1:
          table += "broadcasts " + (d[0] != 0 ? std::to_string(d[0]) + " bytes " : std::string()) + "from worker " +
                   std::to_string(d[2] - 1000);
          break;
        case 2:
          table += "reduce-scatters " + std::to_string(d[0]) + " " + kind_name(k) + " elements" + leaves + " with " +
                   std::string(mirror::to_string(static_cast<ReduceOp>(d[2] % 100))) + order;
          break;
        case 3: table += "all-gathers " + std::to_string(d[0]) + " bytes of " + kind_name(k) + " elements" + leaves; break;
        case 4: table += "all-gathers " + std::to_string(d[0]) + " counts per worker"; break;
        default:
          table += "reduces " + std::to_string(d[0]) + " " + kind_name(k) + " elements with " +
                   std::string(mirror::to_string(static_cast<ReduceOp>(d[2] % 100))) + order;
      }
      std::string what(reinterpret_cast<const char*>(d + 7), what_words * sizeof(std::int64_t));
      what.resize(std::strlen(what.c_str()));
      const auto call_kind = static_cast<detail::collective_kind>(static_cast<std::uint64_t>(d[5]) >> 32);
      const auto call_param = static_cast<int>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(d[5])));
      if (d[4] == 0) {
        table += ", in " + what + " called outside fn";
      } else {
        table += ", at collective #" + std::to_string(d[4]) + " (" + detail::to_string(call_kind, call_param).text +
                 ") of fn (" + what + ")";
      }
    }
    // Phases: odd inside a run. Workers ahead of one that is inside a run have returned from that
    // run's fn without reaching the collective it waits in (a worker whose every replica
    // returned early has nobody local to notice): a timeout_error naming them, as within a worker.
    std::int64_t lowest = desc(0)[6];
    for (int p = 1; p < W; ++p) lowest = std::min(lowest, desc(p)[6]);
    std::vector<int> missing;
    std::string ahead, behind;
    for (int p = 0; p < W; ++p) {
      std::string& list = desc(p)[6] > lowest ? ahead : behind;
      list += (list.empty() ? "" : ", ") + std::to_string(p);
      if (desc(p)[6] > lowest) {
        for (int r = 0; r < R; ++r) missing.push_back(p * R + r);
      }
    }
    resync_phase(all);
    std::exception_ptr e;
    if ((lowest & 1) != 0 && !missing.empty()) {
      std::string names;
      for (const int m : missing) names += (names.empty() ? "" : ", ") + std::to_string(m);
      e = std::make_exception_ptr(timeout_error(
          "mirror: replicas {" + names + "} (workers " + ahead + ") returned from fn without reaching the collective "
          "that workers " + behind + " wait in, and made a later call:" + table +
          "; every replica of every worker must make the same collective calls",
          missing));
    } else {
      std::string text = "mirror: the workers disagree on a cross-worker collective:" + table;
      if (described_alike) text += "; the sizes of individual leaves differ between the workers";
      text += "; every replica of every worker must make the same collective calls, in the same order, with leaves "
              "of the same sizes";
      e = std::make_exception_ptr(shape_error(text));
    }
    {
      std::lock_guard lock(mutex);
      symmetric.push_back(e);
      if (symmetric.size() > 16) symmetric.erase(symmetric.begin());
    }
    std::rethrow_exception(e);
  }

  /// After a failed agreement check: moves this worker's phase to where the others' will be once
  /// every worker's current call has ended (a run ends on an even phase), so that phases keep
  /// naming the same runs on every worker. Runs on the communication thread while the caller
  /// waits for this job, so nothing else advances the phase meanwhile.
  void resync_phase(const std::int64_t* all) {
    std::int64_t target = 0;
    for (int p = 0; p < W; ++p) {
      const std::int64_t ph = all[description_words * static_cast<std::size_t>(p) + 6];
      target = std::max(target, ph + (ph & 1));
    }
    const std::int64_t now = phase.load(std::memory_order_relaxed);
    const std::int64_t want = (now & 1) != 0 ? target - 1 : target;
    if (want > now) phase.store(want, std::memory_order_relaxed);
  }

  /// wait(), and when it gives up, `buffer` (the request's) is kept alive for the rest of the
  /// process, since MPI may still write into it.
  template <class T>
  void wait_keeping(MPI_Request& request, const char* what, std::unique_ptr<T[]>& buffer) {
    try {
      wait(request, what);
    } catch (...) {
      keep_until_exit(buffer);
      throw;
    }
  }

  /// Polls `request` to completion, serving the control communicator meanwhile. A failure in fn
  /// of this run (on any worker) ends it with replica_error once recover() has completed it; one
  /// of an earlier run is recovered from, and the wait goes on. timeout_error after the timeout.
  void wait(MPI_Request& request, const char* what) {
    auto start = clock::now();
    auto deadline = start + timeout;
    for (unsigned polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
      if (done) return;
      // The control communicator, the failure flag and the clock every 8th poll only: MPI_Test
      // is what moves the collective along, the rest is bookkeeping (a probe costs a progress
      // call).
      if ((polls & 7) != 7) continue;
      serve_control();
      progress_sends();
      if (remote) {  // another worker gave up waiting for this one
        abandoned.push_back(request);
        time_out(start, what);
      }
      note_local_failure();
      if (pending > drained && pending <= job_phase) {
        const std::int64_t failed = pending;
        try {
          recover(failed, failed == job_phase ? &request : nullptr);
        } catch (...) {
          if (request != MPI_REQUEST_NULL) abandoned.push_back(request);
          throw;
        }
        if (failed == job_phase) throw_failure();
        start = clock::now();  // the peers were recovering too: this collective's wait starts now
        deadline = start + timeout;
        continue;
      }
      const auto now = clock::now();
      if (now >= deadline) {
        abandoned.push_back(request);
        time_out(start, what);
      }
      // Never sleep for the first second: Open MPI's shared-memory and libnbc collectives
      // advance only inside MPI calls, so a sleeping comm thread stalls its peers too (the 20 us
      // sleeps this loop had after 200 us put 5.8 % of a 1 MiB run's samples in do_nanosleep,
      // each costing ~80 us with timer slack). Nor yield for the first `unyielding_wait`: the
      // caller spins with yields beside this thread, and handing it the core mid-collective
      // stalls the exchange for the peers as well; as in a blocking MPI_Allreduce (which spins
      // in opal_progress) this thread keeps the core. After that, a yield every 8 tests (a
      // transfer that long is bandwidth-bound; a late worker needs the cores), and after a
      // second (a straggler, not a slow transfer) 100 us sleeps, so waiting burns no core.
      if (now - start < std::chrono::seconds(1)) {
        if (now - start >= unyielding_wait) std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

  // Another worker gave up waiting for this one before this collective started: it is the late
  // worker, and fails the same way.
  [[noreturn]] void adopt_remote(job&) {
    std::lock_guard lock(mutex);
    broken = *remote;
    broken.missing.clear();
    for (int r = 0; r < R; ++r) broken.missing.push_back(w * R + r);
    std::rethrow_exception(broken_error());
  }

  /// Asks every peer which collective it has entered; names those behind; marks the group
  /// broken and tells the peers (so a late worker fails at its next collective, not after
  /// its own timeout).
  [[noreturn]] void time_out(clock::time_point start, const char*) {
    // The wait itself, measured before the peers are asked (asking takes up to 5 s more).
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
    const std::int64_t seq = sequence;
    asked = seq;
    replies.assign(static_cast<std::size_t>(W), -1);
    replies[static_cast<std::size_t>(w)] = seq;
    // A worker that already told us it entered this collective (its own query or its notice
    // that it gave up) has arrived, even if it has shut down since and cannot answer.
    for (int p = 0; p < W; ++p) {
      if (known[static_cast<std::size_t>(p)] >= seq) replies[static_cast<std::size_t>(p)] = known[static_cast<std::size_t>(p)];
    }
    for (int p = 0; p < W; ++p) {
      if (p != w) send(p, tag_query, &seq, sizeof seq, nullptr);
    }
    const auto reply_deadline = clock::now() + std::min<clock::duration>(timeout, std::chrono::seconds(5));
    while (clock::now() < reply_deadline &&
           std::count(replies.begin(), replies.end(), std::int64_t{-1}) > 0) {
      serve_control();
      progress_sends();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    asked = -1;
    std::vector<int> missing;
    std::string late, unreachable;
    for (int p = 0; p < W; ++p) {
      const std::int64_t got = replies[static_cast<std::size_t>(p)];
      if (got >= seq) continue;
      (got < 0 ? unreachable : late) += (got < 0 ? (unreachable.empty() ? "" : ", ") : (late.empty() ? "" : ", ")) +
                                        std::to_string(p);
      for (int r = 0; r < R; ++r) missing.push_back(p * R + r);
    }
    std::string names;
    for (int m : missing) names += (names.empty() ? "" : ", ") + std::to_string(m);
    const auto limit = static_cast<long long>(timeout.count());
    std::string text = "mirror: worker " + std::to_string(w);
    if (remote && remote->why == broken_state::timeout) {
      text += " waited " + std::to_string(waited) + " ms in " + where + " until worker " +
              std::to_string(remote->replica / R) + " gave up waiting for it";
    } else {
      text += " waited for the timeout of " + std::to_string(limit) + " ms (devices::Cluster{.timeout})";
      // A wait restarts after a recovery from another worker's failure; say so when it shows.
      if (waited > limit + limit / 10 + 100) text += " (" + std::to_string(waited) + " ms in all, with a recovery)";
      text += " in " + where;
    }
    text += "; replicas {" + names + "} did not reach this collective";
    if (!late.empty()) text += " (workers " + late + " answered: they are at an earlier collective or computing)";
    if (!unreachable.empty()) {
      text += " (workers " + unreachable + " did not answer within " +
              std::to_string(std::min<long long>(limit, 5000)) + " ms either: busy outside mirror, or gone)";
    }
    if (missing.empty()) text += " (every worker says it arrived: the network is slow or partitioned)";
    text += "; raise devices::Cluster{.timeout} if they are just slow";
    announce(notice_timeout, w * R, seq, text);
    std::lock_guard lock(mutex);
    broken = {broken_state::timeout, -1, text, missing};
    throw timeout_error(text, missing);
  }

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

  void log_post(post_kind kind, std::size_t count, std::int64_t element, std::int64_t op) {
    ++sequence;
    posts.push_back({sequence, kind, static_cast<std::int64_t>(count), element, op, job_phase});
    if (posts.size() > kept_posts) posts.pop_front();
  }

  bool use_ring(std::size_t bytes) const {
    const std::size_t ring_from = W == 2 ? two_worker_ring_threshold_bytes : ring_threshold_bytes;
    return ring_algorithm.usable && bytes >= ring_from;
  }

  bool is_broken() {
    std::lock_guard lock(mutex);
    return broken.why != broken_state::none;
  }

  void note_local_failure() {
    const std::int64_t failed = local_failed_phase.load(std::memory_order_acquire);
    if (failed > drained && failed > pending) pending = failed;
  }

  /// Ends a job of the failed run. On the worker where the failure happened its replica's own
  /// exception is what the run reports (with the original nested): the job is only cancelled, as
  /// the local runtime cancels the other replicas. Elsewhere the job throws the failure's kind
  /// with its text: a replica_error (message only; the original exception stays on its worker),
  /// or the same shape_error or timeout_error (with the same missing replicas).
  [[noreturn]] void throw_failure() {
    std::lock_guard lock(mutex);
    const int from = failure.replica / R;
    if (from == w) throw detail::collective_cancelled_rethrow_me{};
    switch (failure.kind) {
      case failed_shape: throw shape_error(failure.text);
      case failed_timeout: throw timeout_error(failure.text, failure.missing);
      default: throw replica_error(failure.replica, "worker " + std::to_string(from) + ": " + failure.text);
    }
  }
  void throw_if_failed(std::int64_t ph) {
    bool failed = false;
    {
      std::lock_guard lock(mutex);
      failed = failure.phase == ph;
    }
    if (failed) throw_failure();
  }

  /// This worker's posts up to the end of phase `failed`.
  std::int64_t count_through(std::int64_t failed) const {
    for (const auto& [ph, seq] : phase_starts) {
      if (ph > failed) return seq;
    }
    return sequence;
  }

  // tag_failure's message: head_words int64 {phase, replica, count, n, kind, m}, then n posted_op
  // records (posted_words each), then m missing replicas (int64 each), then the failure's text.
  static constexpr std::size_t head_words = 6;

  void learn_failure(int from, const std::vector<char>& bytes) {
    std::int64_t head[head_words] = {};
    if (bytes.size() < sizeof head) return;
    std::memcpy(head, bytes.data(), sizeof head);
    const std::int64_t failed = head[0], n = head[3], m = head[5];
    if (failed == leaving) {
      left[static_cast<std::size_t>(from)] = 1;
      return;
    }
    if (n < 0 || m < 0 ||
        bytes.size() < sizeof head + (static_cast<std::size_t>(n) * posted_words + static_cast<std::size_t>(m)) *
                                         sizeof(std::int64_t)) {
      return;
    }
    status st;
    st.count = head[2];
    const char* at = bytes.data() + sizeof head;
    for (std::int64_t k = 0; k < n; ++k) {
      std::int64_t words[posted_words];
      std::memcpy(words, at, sizeof words);
      at += sizeof words;
      st.posts.push_back({words[0], words[1], words[2], words[3], words[4], failed});
    }
    std::vector<int> missing(static_cast<std::size_t>(m));
    for (int& id : missing) {
      std::int64_t word = 0;
      std::memcpy(&word, at, sizeof word);
      at += sizeof word;
      id = static_cast<int>(word);
    }
    const std::string text(at, bytes.data() + bytes.size());
    if (failed <= drained) return;  // a status of a run already recovered from cannot come: ignore
    auto& got = statuses[failed];
    if (got.empty()) got.resize(static_cast<std::size_t>(W));
    got[static_cast<std::size_t>(from)] = std::move(st);
    {
      std::lock_guard lock(mutex);
      const int replica = static_cast<int>(head[1]);
      if (failure.phase < failed || (failure.phase == failed && replica < failure.replica)) {
        failure = {failed, replica, text, head[4], std::move(missing)};
      }
    }
    if (failed > pending) pending = failed;
  }

  void send_status(std::int64_t failed, const status& mine) {
    failure_info f;
    {
      std::lock_guard lock(mutex);
      f = failure;
    }
    const std::int64_t head[head_words] = {failed, f.replica, mine.count, static_cast<std::int64_t>(mine.posts.size()),
                                           f.kind, static_cast<std::int64_t>(f.missing.size())};
    std::vector<char> bytes(sizeof head + (mine.posts.size() * posted_words + f.missing.size()) * sizeof(std::int64_t) +
                            f.text.size());
    char* at = bytes.data();
    std::memcpy(at, head, sizeof head);
    at += sizeof head;
    for (const posted_op& o : mine.posts) {
      const std::int64_t words[posted_words] = {o.seq, o.kind, o.count, o.element, o.op};
      std::memcpy(at, words, sizeof words);
      at += sizeof words;
    }
    for (const int id : f.missing) {
      const std::int64_t word = id;
      std::memcpy(at, &word, sizeof word);
      at += sizeof word;
    }
    if (!f.text.empty()) std::memcpy(at, f.text.data(), f.text.size());
    for (int p = 0; p < W; ++p) {
      if (p != w) send(p, tag_failure, bytes.data(), bytes.size(), nullptr);
    }
  }

  // A dummy's request and what must outlive it.
  struct dummy {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<unsigned char[]> buffer, rows;
    std::vector<int> counts, displs, from, at;
  };

  /// Posts the match of `o` (another worker's post), with data that nobody reads.
  void post_dummy(const posted_op& o, dummy& d) {
    const detail::element_kind k = kind_of(o.element);
    const std::size_t n = static_cast<std::size_t>(o.count);
    const char* what = "recovery from a failed run";
    log_post(static_cast<post_kind>(o.kind), n, o.element, o.op);
    switch (o.kind) {
      case post_allreduce: {
        d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, n * k.bytes));
        const bool ring = use_ring(n * k.bytes);
        if (ring) ring_algorithm.set(1);
        const int code = MPI_Iallreduce(MPI_IN_PLACE, d.buffer.get(), static_cast<int>(n), datatype_of(k),
                                        op_of(static_cast<ReduceOp>(o.op), k), data, &d.request);
        if (ring) ring_algorithm.set(0);
        check(code, "MPI_Iallreduce", what);
        return;
      }
      case post_bcast:
        d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, n));
        check(MPI_Ibcast(d.buffer.get(), static_cast<int>(n), MPI_BYTE, static_cast<int>(o.op), data, &d.request),
              "MPI_Ibcast", what);
        return;
      case post_allgather_words:
        d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, (n + n * static_cast<std::size_t>(W)) *
                                                                                  sizeof(std::int64_t)));
        check(MPI_Iallgather(d.buffer.get(), static_cast<int>(n), MPI_INT64_T, d.buffer.get() + n * sizeof(std::int64_t),
                             static_cast<int>(n), MPI_INT64_T, data, &d.request),
              "MPI_Iallgather", what);
        return;
      case post_alltoall:
        d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W) * n * k.bytes));
        d.rows = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W) * n * k.bytes));
        check(MPI_Ialltoall(d.buffer.get(), static_cast<int>(n), datatype_of(k), d.rows.get(), static_cast<int>(n),
                            datatype_of(k), data, &d.request),
              "MPI_Ialltoall", what);
        return;
      case post_allgather_bytes:
        d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, static_cast<std::size_t>(W + 1) * n));
        if (o.op == 1) {
          check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d.buffer.get(), static_cast<int>(n), MPI_BYTE, data,
                               &d.request),
                "MPI_Iallgather", what);
        } else {
          check(MPI_Iallgather(d.buffer.get(), static_cast<int>(n), MPI_BYTE, d.buffer.get() + n, static_cast<int>(n),
                               MPI_BYTE, data, &d.request),
                "MPI_Iallgather", what);
        }
        return;
      case post_alltoallv:
      case post_allgatherv: {
        slices(n, d.counts, d.displs);
        const int mine = d.counts[static_cast<std::size_t>(w)];
        const MPI_Datatype type = datatype_of(k);
        d.buffer = std::make_unique<unsigned char[]>(std::max<std::size_t>(1, n * k.bytes));
        if (o.kind == post_allgatherv) {
          check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d.buffer.get(), d.counts.data(), d.displs.data(),
                                type, data, &d.request),
                "MPI_Iallgatherv", what);
          return;
        }
        d.from.assign(static_cast<std::size_t>(W), mine);
        d.at.assign(static_cast<std::size_t>(W), 0);
        for (int p = 0; p < W; ++p) d.at[static_cast<std::size_t>(p)] = p * mine;
        d.rows = std::make_unique<unsigned char[]>(
            std::max<std::size_t>(1, static_cast<std::size_t>(W) * static_cast<std::size_t>(mine) * k.bytes));
        check(MPI_Ialltoallv(d.buffer.get(), d.counts.data(), d.displs.data(), type, d.rows.get(), d.from.data(),
                             d.at.data(), type, data, &d.request),
              "MPI_Ialltoallv", what);
        return;
      }
      default:
        throw backend_error("mirror::devices::Cluster: recovery from a failed run: another worker reports a "
                            "collective of unknown kind " + std::to_string(o.kind), -1);
    }
  }

  /// The recovery from the failure of phase `failed` (see above). `interrupted`: this worker's
  /// post of that run that a job was waiting in, or null.
  void recover(std::int64_t failed, MPI_Request* interrupted) {
    const auto start = clock::now();
    const auto deadline = start + timeout;
    auto& got = statuses[failed];
    if (got.empty()) got.resize(static_cast<std::size_t>(W));
    status mine;
    mine.count = count_through(failed);
    for (const posted_op& o : posts) {
      if (o.phase == failed && o.seq <= mine.count) mine.posts.push_back(o);
    }
    send_status(failed, mine);
    got[static_cast<std::size_t>(w)] = std::move(mine);
    // 1. Every worker's status (each sends one as it learns of the failure).
    for (;;) {
      if (std::all_of(got.begin(), got.end(), [](const auto& st) { return st.has_value(); })) break;
      if (clock::now() >= deadline) give_up(failed, start, "answer", nullptr);
      serve_control();
      progress_sends();
      if (interrupted != nullptr && *interrupted != MPI_REQUEST_NULL) {
        int done = 0;
        check(MPI_Test(interrupted, &done, MPI_STATUS_IGNORE), "MPI_Test (recovery)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // 2. Dummies up to the most any worker posted.
    std::int64_t most = 0;
    for (const auto& st : got) most = std::max(most, st->count);
    const std::int64_t own = got[static_cast<std::size_t>(w)]->count;
    std::vector<dummy> dummies;
    if (own < most) {
      if (sequence != own) {
        fail_recovery("this worker has posted later collectives (" + std::to_string(sequence - own) +
                      ") than the failed run's, while another posted " + std::to_string(most - own) +
                      " more of the failed run's: the workers' programs diverged");
      }
      const std::int64_t outer_phase = job_phase;
      job_phase = failed;
      dummies.resize(static_cast<std::size_t>(most - own));
      for (std::int64_t k = own + 1; k <= most; ++k) {
        const posted_op* found = nullptr;
        for (const auto& st : got) {
          for (const posted_op& o : st->posts) {
            if (o.seq == k) found = &o;
          }
        }
        if (found == nullptr) {
          job_phase = outer_phase;
          fail_recovery("no worker described collective " + std::to_string(k) + " of the failed run");
        }
        post_dummy(*found, dummies[static_cast<std::size_t>(k - own - 1)]);
      }
      job_phase = outer_phase;
    }
    // 3. This worker's outstanding post of the run and its dummies complete.
    for (;;) {
      bool all_done = true;
      if (interrupted != nullptr && *interrupted != MPI_REQUEST_NULL) {
        int done = 0;
        check(MPI_Test(interrupted, &done, MPI_STATUS_IGNORE), "MPI_Test (recovery)");
        all_done = all_done && done;
      }
      for (dummy& d : dummies) {
        if (d.request == MPI_REQUEST_NULL) continue;
        int done = 0;
        check(MPI_Test(&d.request, &done, MPI_STATUS_IGNORE), "MPI_Test (recovery)");
        all_done = all_done && done;
      }
      if (all_done) break;
      if (clock::now() >= deadline) give_up(failed, start, "complete the failed run's collectives", &dummies);
      serve_control();
      progress_sends();
    }
    drained = failed;
    statuses.erase(statuses.begin(), statuses.upper_bound(failed));
  }

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

  void leave() {
    if (W == 1 || is_broken()) return;
    const auto deadline = clock::now() + timeout;
    try {
      note_local_failure();
      if (pending > drained) recover(pending, nullptr);
      const std::int64_t head[head_words] = {leaving, 0, 0, 0, 0, 0};
      for (int p = 0; p < W; ++p) {
        if (p != w) send(p, tag_failure, head, sizeof head, nullptr);
      }
      while (std::count(left.begin(), left.end(), 1) < W - 1 && clock::now() < deadline) {
        serve_control();
        progress_sends();
        if (pending > drained) recover(pending, nullptr);
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    } catch (...) {
      // A recovery that timed out, or an MPI error: leave anyway.
    }
  }

  [[noreturn]] void fail_recovery(const std::string& why) {
    const std::string text = "mirror::devices::Cluster: cannot recover from a failed run: " + why;
    {
      std::lock_guard lock(mutex);
      if (broken.why == broken_state::none) broken = {broken_state::mpi_error, -1, text, {}};
    }
    throw backend_error(text, -1);
  }

  /// The recovery's timeout: the workers that did not `step` in time are named, and the group is
  /// broken (its dummies' buffers are kept: MPI may still write into them).
  [[noreturn]] void give_up(std::int64_t failed, clock::time_point start, const char* step,
                            std::vector<dummy>* dummies) {
    std::vector<int> missing;
    std::string names;
    const auto& got = statuses[failed];
    for (int p = 0; p < W; ++p) {
      if (got[static_cast<std::size_t>(p)].has_value() && dummies == nullptr) continue;
      if (p == w) continue;
      names += (names.empty() ? "" : ", ") + std::to_string(p);
      for (int r = 0; r < R; ++r) missing.push_back(p * R + r);
    }
    if (dummies != nullptr) {
      for (dummy& d : *dummies) {
        if (d.request != MPI_REQUEST_NULL) abandoned.push_back(d.request);
        keep_until_exit(d.buffer);
        keep_until_exit(d.rows);
      }
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
    const std::string text = "mirror: worker " + std::to_string(w) + " waited " + std::to_string(waited) +
                             " ms for workers {" + names + "} to " + step + " after a run failed; raise "
                             "devices::Cluster{.timeout} if they are just slow";
    std::lock_guard lock(mutex);
    broken = {broken_state::timeout, -1, text, missing};
    throw timeout_error(text, missing);
  }

  void announce(std::int64_t kind, int replica, std::int64_t seq, const std::string& text) {
    std::vector<char> bytes(3 * sizeof(std::int64_t) + text.size());
    const std::int64_t head[3] = {kind, replica, seq};
    std::memcpy(bytes.data(), head, sizeof head);
    std::memcpy(bytes.data() + sizeof head, text.data(), text.size());
    for (int p = 0; p < W; ++p) {
      if (p != w) send(p, tag_notice, bytes.data(), bytes.size(), nullptr);
    }
  }

  void send(int dest, int tag, const void* bytes, std::size_t n, MPI_Request*) {
    pending_send& s = sends.emplace_back();
    s.bytes.assign(static_cast<const char*>(bytes), static_cast<const char*>(bytes) + n);
    check(MPI_Isend(s.bytes.data(), static_cast<int>(n), MPI_BYTE, dest, tag, control, &s.request), "MPI_Isend (control)");
  }

  void progress_sends() {
    for (auto it = sends.begin(); it != sends.end();) {
      int done = 0;
      check(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test (control send)");
      it = done ? sends.erase(it) : std::next(it);
    }
  }

  // Gives queued notices a moment to leave before the thread ends (a peer that is told fails
  // at once instead of after its timeout); never blocks on an unreachable peer.
  void flush_sends() {
    const auto until = clock::now() + std::chrono::seconds(1);
    try {
      while (!sends.empty() && clock::now() < until) {
        serve_control();
        progress_sends();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    } catch (...) {
    }
  }

  void serve_control() {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      check(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, control, &flag, &status), "MPI_Iprobe (control)");
      if (!flag) return;
      int n = 0;
      MPI_Get_count(&status, MPI_BYTE, &n);
      std::vector<char> bytes(static_cast<std::size_t>(std::max(n, 0)));
      check(MPI_Recv(bytes.data(), n, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, control, MPI_STATUS_IGNORE),
            "MPI_Recv (control)");
      const int from = status.MPI_SOURCE;
      std::int64_t head[3] = {0, 0, 0};
      std::memcpy(head, bytes.data(), std::min(bytes.size(), sizeof head));
      std::int64_t& seen = known[static_cast<std::size_t>(from)];
      if (status.MPI_TAG == tag_query) {
        seen = std::max(seen, head[0]);  // it asks about a collective it has entered
        const std::int64_t reply[2] = {sequence, head[0]};
        send(from, tag_reply, reply, sizeof reply, nullptr);
      } else if (status.MPI_TAG == tag_reply) {
        seen = std::max(seen, head[0]);
        if (head[1] == asked && asked >= 0) replies[static_cast<std::size_t>(from)] = head[0];
      } else if (status.MPI_TAG == tag_notice && head[0] == notice_timeout) {
        seen = std::max(seen, head[2]);  // it gave up waiting in that collective
      } else if (status.MPI_TAG == tag_failure) {
        learn_failure(from, bytes);
      }
      if (status.MPI_TAG == tag_notice && head[0] == notice_timeout && !remote) {
        broken_state s;
        s.why = broken_state::timeout;
        s.replica = static_cast<int>(head[1]);
        const std::string text(bytes.begin() + static_cast<std::ptrdiff_t>(std::min(bytes.size(), sizeof head)),
                               bytes.end());
        s.text = "mirror: worker " + std::to_string(from) + " gave up waiting for this worker: " + text;
        remote = s;
      }
    }
  }
};

group::group(const group_options& o) : impl_(new impl()) {
  impl& m = *impl_;
  if (o.timeout.count() <= 0) {
    throw std::invalid_argument("mirror::devices::Cluster{.timeout = " + std::to_string(o.timeout.count()) +
                                " ms}: the cross-worker timeout must be positive");
  }
  m.timeout = o.timeout;
  m.validate = o.validate_shapes;
  m.R = o.local_replicas;
  int initialised = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw std::invalid_argument("mirror::devices::Cluster: MPI was already finalized; build the strategy before "
                                "MPI_Finalize");
  }
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::call_once(finalize_registered, [] { std::atexit(finalize_at_exit); });
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    throw std::invalid_argument(
        "mirror::devices::Cluster: MPI was initialised with thread level " + std::to_string(provided) +
        ", below MPI_THREAD_SERIALIZED; mirror makes its MPI calls on its own communication thread (never two at "
        "once), which needs at least MPI_THREAD_SERIALIZED. Initialise MPI with MPI_Init_thread(..., "
        "MPI_THREAD_MULTIPLE, ...) (needed anyway if your code calls MPI while a strategy exists), or let mirror "
        "initialise it");
  }
  make_floating_ops();
  static_assert(sizeof(MPI_Comm) <= sizeof(std::uint64_t));
  const MPI_Comm comm = o.comm.is_world() ? MPI_COMM_WORLD : o.comm.get<MPI_Comm>();
  // Every collective of the construction is non-blocking and waited with the timeout: a worker
  // that never builds its strategy must not hang the others, not even in the duplications.
  const auto deadline = clock::now() + m.timeout;
  const auto wait_for_everyone = [&](MPI_Request& request, const char* call) {
    for (int done = 0;;) {
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
      if (done) return;
      if (clock::now() >= deadline) {
        int size = 0, rank = 0;
        MPI_Comm_size(comm, &size);
        MPI_Comm_rank(comm, &rank);
        throw timeout_error("mirror::devices::Cluster: not every worker of the communicator built its strategy "
                            "within " + std::to_string(m.timeout.count()) + " ms (worker " + std::to_string(rank) +
                                " of " + std::to_string(size) + " waited in " + call + "); every worker must "
                                "construct it, in the same order",
                            {});
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  };
  {
    // On the heap, and kept if the wait gives up: MPI writes the handle when the duplication
    // completes, whenever that is (keep_until_exit says why).
    auto handles = std::make_unique<MPI_Comm[]>(2);
    handles[0] = handles[1] = MPI_COMM_NULL;
    try {
      for (int k = 0; k < 2; ++k) {
        const char* call = k == 0 ? "MPI_Comm_idup (data)" : "MPI_Comm_idup (control)";
        MPI_Request request = MPI_REQUEST_NULL;
        check(MPI_Comm_idup(comm, &handles[static_cast<std::size_t>(k)], &request), call);
        wait_for_everyone(request, call);
      }
    } catch (...) {
      keep_until_exit(handles);
      throw;
    }
    m.data = handles[0];
    m.control = handles[1];
  }
  MPI_Comm_set_errhandler(m.data, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(m.control, MPI_ERRORS_RETURN);
  MPI_Comm_size(m.data, &m.W);
  MPI_Comm_rank(m.data, &m.w);
  m.known.assign(static_cast<std::size_t>(m.W), -1);
  m.left.assign(static_cast<std::size_t>(m.W), 0);

  // Equal R everywhere (TF leaves it undefined): {R, -R} under MAX, then the names.
  // Non-blocking with the timeout: a worker that never builds its strategy must not hang the
  // others here either.
  // The same message settles whether every worker can select libnbc's ring (ring_algorithm):
  // a worker where the MPI_T variable is fixed (an --mca setting, a host's own
  // mca-params.conf) would otherwise post another schedule than its peers.
  m.ring_algorithm.open();
  // On the heap, and kept if the check times out (keep_until_exit says why).
  auto both = std::make_unique<int[]>(3);
  both[0] = m.R;
  both[1] = -m.R;
  both[2] = m.ring_algorithm.usable ? 0 : 1;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, both.get(), 3, MPI_INT, MPI_MAX, m.data, &request),
        "MPI_Iallreduce (replica count check)");
  try {
    wait_for_everyone(request, "MPI_Iallreduce (replica count check)");
  } catch (...) {
    m.ring_algorithm.close();
    keep_until_exit(both);  // the request is still posted
    throw;
  }
  if (both[0] != -both[1]) {
    std::vector<int> all(static_cast<std::size_t>(m.W));
    check(MPI_Allgather(&m.R, 1, MPI_INT, all.data(), 1, MPI_INT, m.data), "MPI_Allgather (replica count check)");
    std::string text;
    for (int p = 0; p < m.W; ++p) {
      text += (p == 0 ? "" : ", ") + std::string("worker ") + std::to_string(p) + " has " +
              std::to_string(all[static_cast<std::size_t>(p)]);
    }
    m.ring_algorithm.close();
    MPI_Comm_free(&m.data);
    MPI_Comm_free(&m.control);
    throw std::invalid_argument("mirror::devices::Cluster: the workers have different numbers of local replicas (" +
                                text + "); every worker must use the same local device settings (TF: \"every "
                                "worker to have the same number of replicas\")");
  }
  // Every worker is here (the check above completed): the blocking calls cannot hang.
  m.cores = share_of_host_cores(m.data);
  // MPI_Finalize deletes MPI_COMM_SELF's attributes first: that stops the thread in time.
  check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &impl::on_finalize, &m.keyval, nullptr), "MPI_Comm_create_keyval");
  check(MPI_Comm_set_attr(MPI_COMM_SELF, m.keyval, &m), "MPI_Comm_set_attr");
  if (both[2] != 0) m.ring_algorithm.usable = false;  // some worker cannot: none does
  m.thread = std::thread([&m] { m.main_loop(); });
}

group::~group() {
  impl& m = *impl_;
  m.shutdown();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Comm_delete_attr(MPI_COMM_SELF, m.keyval);  // its callback finds the group already shut down
    MPI_Comm_free_keyval(&m.keyval);
  }
}

int group::num_workers() const noexcept { return impl_->W; }
int group::worker_index() const noexcept { return impl_->w; }
int group::local_replicas() const noexcept { return impl_->R; }
void group::reduce_in_worker_order(bool on) noexcept { impl_->worker_order = on; }
unsigned group::host_cores() const noexcept { return impl_->cores; }

void group::check_all_reduce(std::size_t count, detail::element_kind kind, ReduceOp op, const char* what) {
  if (!impl_->validate) return;  // Cluster{.validate_shapes = false}: trust the program
  impl::job j{impl::job::check, nullptr, count, kind, op, 0, what, false, nullptr};
  j.in_worker_order = impl_->in_worker_order(kind);
  j.position = detail::current_position;
  j.phase = impl_->phase.load(std::memory_order_relaxed);
  impl_->run(j);
}

void group::all_reduce(void* data, std::size_t count, detail::element_kind kind, ReduceOp op, const char* what,
                       bool checked) {
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(count) +
                                " elements in one cross-worker all-reduce exceed MPI's int count; split the leaf");
  }
  impl::job j{impl::job::reduce, data, count, kind, op, 0, what, checked, nullptr};
  j.in_worker_order = impl_->in_worker_order(kind);
  j.position = detail::current_position;
  j.phase = impl_->phase.load(std::memory_order_relaxed);
  impl_->run(j);
}

void group::check_broadcast(const std::size_t* shape, std::size_t num_leaves, int root, const char* what) {
  if (!impl_->validate) return;
  impl::job j{impl::job::check, nullptr, 0, {}, ReduceOp::sum, root, what, false, nullptr};
  j.checks_broadcast = true;
  j.sizes = shape;
  j.num_sizes = num_leaves;
  j.position = detail::current_position;
  j.phase = impl_->phase.load(std::memory_order_relaxed);
  impl_->run(j);
}

void group::broadcast(void* data, std::size_t bytes, int root, const char* what) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(bytes) +
                                " bytes in one cross-worker broadcast exceed MPI's int count; split the leaf");
  }
  impl::job j{impl::job::bcast, data, bytes, {}, ReduceOp::sum, root, what, false, nullptr};
  j.position = detail::current_position;
  j.phase = impl_->phase.load(std::memory_order_relaxed);
  impl_->run(j);
}

void group::reduce_scatter(const void* in, const std::size_t* leaf_sizes, std::size_t num_leaves, void* out,
                           detail::element_kind kind, ReduceOp op, const char* what) {
  std::size_t total = 0;
  for (std::size_t k = 0; k < num_leaves; ++k) total += leaf_sizes[k];
  if (total > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(total) +
                                " elements in one cross-worker reduce-scatter exceed MPI's int count; split the leaf");
  }
  impl::job j{impl::job::scatter, const_cast<void*>(in), total, kind, op, 0, what, false, nullptr};
  j.in_worker_order = impl_->in_worker_order(kind);
  j.sizes = leaf_sizes;
  j.num_sizes = num_leaves;
  j.out = out;
  j.position = detail::current_position;
  j.phase = impl_->phase.load(std::memory_order_relaxed);
  impl_->run(j);
}

void group::all_gather(void* const* leaves, std::size_t num_leaves, const std::size_t* counts,
                       std::size_t element_bytes, const char* what, bool checked) {
  std::size_t total = 0;
  for (std::size_t i = 0; i < num_leaves * static_cast<std::size_t>(impl_->W); ++i) total += counts[i];
  const detail::element_kind kind{detail::element_kind::category::unsigned_integer,
                                  static_cast<std::uint8_t>(element_bytes)};
  impl::job j{impl::job::gather, nullptr, total * element_bytes, kind, ReduceOp::sum, 0, what, checked, nullptr};
  j.sizes = counts;
  j.num_sizes = num_leaves;
  j.leaves = leaves;
  j.position = detail::current_position;
  j.phase = impl_->phase.load(std::memory_order_relaxed);
  impl_->run(j);
}

void group::all_gather_counts(const std::size_t* mine, std::size_t per_worker, std::size_t* all, const char* what) {
  impl::job j{impl::job::counts, const_cast<std::size_t*>(mine), per_worker, int64_kind, ReduceOp::sum, 0, what, false,
              nullptr};
  j.out = all;
  j.position = detail::current_position;
  j.phase = impl_->phase.load(std::memory_order_relaxed);
  impl_->run(j);
}

void group::next_phase() noexcept { impl_->phase.fetch_add(1, std::memory_order_relaxed); }

void group::report_failure(int global_replica, const std::exception_ptr& failure) noexcept {
  impl& m = *impl_;
  try {
    std::lock_guard lock(m.mutex);
    if (m.broken.why != impl::broken_state::none) return;  // already known to be over (and told)
    for (const auto& e : m.symmetric) {
      if (e == failure) return;  // every worker raised it together; the group is still usable
    }
    const std::int64_t now = m.phase.load(std::memory_order_relaxed);
    if (m.failure.phase == now) return;  // this run has failed already (here or elsewhere): all are told
    impl::failure_info f{now, global_replica, what_of(failure), impl::failed_in_fn, {}};
    try {
      std::rethrow_exception(failure);
    } catch (const shape_error&) {
      f.kind = impl::failed_shape;  // a mismatch among this worker's replicas
    } catch (const timeout_error& e) {
      f.kind = impl::failed_timeout;  // a replica of this worker did not reach a collective
      f.missing = e.missing();
    } catch (...) {
    }
    m.failure = std::move(f);
    m.local_failed_phase.store(now, std::memory_order_release);
  } catch (...) {
    return;  // out of memory while describing: the peers will time out instead
  }
  m.wake_comm.notify_one();
}

}  // namespace mirror::mpi
