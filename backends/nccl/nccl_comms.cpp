// SPDX-License-Identifier: Apache-2.0
// Communicators and the watchdog of ops::NcclAllReduce (declared in nccl_comms.hpp).
// Communicators are non-blocking (ncclConfig_t::blocking = 0), so no NCCL call can hang the
// host: every wait polls ncclCommGetAsyncError and the completion event against a deadline,
// and a deadline that passes aborts the communicators (ncclCommAbort), which is NCCL's
// documented way to get a hung collective off the GPU.
//
// NCCL forbids using one communicator from two threads at once, and ncclCommAbort frees it: every
// NCCL call on communicator i is made holding lock i, and abort_all takes each lock in turn, so it
// never frees a communicator another replica's thread is inside; a thread that finds its
// communicator gone (null) after an abort throws instead of calling NCCL.

#include <mirror/backends/nccl/nccl_comms.hpp>
#include <mirror/backends/cuda/device_guard.hpp>
#include <mirror/backends/cuda/kernels.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <mirror/backend/cut_of.hpp>
#include <mirror/flight_recorder.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/worker_group.hpp>
#include <mirror/error.hpp>

namespace mirror::nccl::impl {

// How many all-reduces a rank may have on its stream, unfinished, before the next one waits for
// the oldest: the host runs ahead of the GPU (docs/cuda.md#the-device) by at most this many NCCL
// collectives, and the watchdog still sees every one of them complete or time out.
constexpr std::size_t max_in_flight = 16;

// One rank's unfinished collectives: a ring of completion events, each with its deadline.
// Touched only by that rank's host thread (and by destroy once those threads are idle).
struct in_flight {
  cudaEvent_t events[max_in_flight] = {};
  std::chrono::steady_clock::time_point deadlines[max_in_flight] = {};
  std::uint64_t sequences[max_in_flight] = {};
  std::size_t oldest = 0, count = 0;
};

// Across workers (devices::Cluster<Cuda>) the set is the group's device_abort_listener: an abort
// here is reported to the other workers, and theirs abort this worker's communicators.
struct comms final : detail::worker_group::device_abort_listener {
  int nranks = 0;      // NCCL ranks of the set: W*G across workers
  int first_rank = 0;  // this worker's local rank 0: w*G
  std::vector<int> devices;
  std::vector<ncclComm_t> comm;                            // null once aborted (or never created)
  std::unique_ptr<std::mutex[]> comm_mutex;                // per rank: held around every NCCL call on comm[i]
  std::vector<in_flight> pending;                          // per rank
  std::unique_ptr<std::atomic<std::uint64_t>[]> entered;  // per rank: collectives handed to NCCL
  std::atomic<bool> aborted{false};
  std::mutex abort_mutex;
  std::string abort_reason;  // why they were aborted: written once, before `aborted` is set
  std::atomic<detail::worker_group*> workers{nullptr};  // null in one process, or once the group is gone

  void peer_aborted(int worker, const std::string& why) noexcept override;
  void group_gone() noexcept override { workers.store(nullptr); }
};

progress classify(int call_result, int async_state) noexcept {
  if (call_result == ncclInProgress) return progress::pending;
  if (call_result != ncclSuccess) return progress::failed;
  if (async_state == ncclInProgress) return progress::pending;
  return async_state == ncclSuccess ? progress::done : progress::failed;
}

namespace {

std::string nccl_failure(ncclResult_t r, const std::string& what) {
  return detail::format("%s failed: ncclResult_t %d (%s)", what.c_str(), static_cast<int>(r), ncclGetErrorString(r))
      .c_str();
}
[[noreturn]] void fail_nccl(ncclResult_t r, const std::string& what) {
  throw backend_error("mirror::ops::NcclAllReduce: " + nccl_failure(r, what), static_cast<long>(r));
}
void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, what);
}
void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // reported by the exception, not again by the next launch's check
    throw backend_error("mirror::ops::NcclAllReduce: " + what + " failed: " + cudaGetErrorName(e) + " (" +
                            cudaGetErrorString(e) + ")",
                        static_cast<long>(e));
  }
}

// A device made current for a scope (cuda/device_guard.hpp), failing as the rest of this file does.
struct rank_device_api {
  static int current() {
    int d = 0;
    check_cuda(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  static void make_current(int device) { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }
  static void restore(int device) noexcept {
    if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
  }
};
using rank_device_guard = cuda::impl::basic_device_guard<rank_device_api>;

// cudaEventQuery, with its expected "not yet" taken off the thread's last error: left there, the
// next launch's cudaGetLastError() (the integer-mean divide kernel's) would report it as its own.
cudaError_t query(cudaEvent_t e) noexcept {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaErrorNotReady) (void)cudaGetLastError();
  return q;
}

// (`abort_reason` is final once `aborted` is set, or a communicator found null under its lock.)
[[noreturn]] void throw_aborted(const comms& c) {
  throw backend_error(detail::format("mirror::ops::NcclAllReduce: the communicators were aborted (%s); construct a "
                                     "new Strategy",
                                     c.abort_reason.empty() ? "after an earlier timeout or error" : c.abort_reason.c_str()),
                      static_cast<long>(ncclInvalidUsage));
}

ncclDataType_t nccl_type(detail::element_kind t) {
  switch (t.code()) {
    case cuda::kind_code<float>: return ncclFloat32;
    case cuda::kind_code<double>: return ncclFloat64;
    case cuda::kind_code<cuda::half>: return ncclFloat16;
    case cuda::kind_code<cuda::bfloat16>: return ncclBfloat16;
    case cuda::kind_code<std::int32_t>: return ncclInt32;
    case cuda::kind_code<std::int64_t>: return ncclInt64;
    case cuda::kind_code<std::uint8_t>: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op, detail::element_kind t) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::mean: return t.is_floating() ? ncclAvg : ncclSum;  // integers: sum, then divide as C++ does
  }
  return ncclSum;
}

// Called without holding any communicator's lock (it takes them all, one at a time). Whether
// this call aborted them (false: they were already).
bool abort_all(comms& c, const std::string& why) noexcept {
  std::lock_guard lock(c.abort_mutex);
  if (c.aborted.load()) return false;
  try {
    c.abort_reason = why;
  } catch (...) {
  }
  c.aborted.store(true);
  for (std::size_t i = 0; i < c.comm.size(); ++i) {
    std::lock_guard one(c.comm_mutex[i]);
    if (c.comm[i] != nullptr) (void)ncclCommAbort(c.comm[i]);
    c.comm[i] = nullptr;
  }
  return true;
}

// abort_all, and across workers the other workers abort theirs too: NCCL needs every rank to abort,
// and theirs would otherwise wait on the GPU for this worker's ranks until their own timeout.
void abort_everywhere(comms& c, const std::string& why) noexcept {
  if (!abort_all(c, why)) return;
  if (detail::worker_group* const w = c.workers.load()) {
    try {
      w->report_device_abort(why);
    } catch (...) {
    }
  }
}

// The failure path of every poll: abort everywhere, then the NCCL error.
[[noreturn]] void abort_and_fail(comms& c, ncclResult_t r, const std::string& what) {
  abort_everywhere(c, nccl_failure(r, what));
  fail_nccl(r, what);
}

// ncclCommGetAsyncError on rank i's communicator under its lock; `pending` when it was aborted
// meanwhile is never returned: an aborted set throws.
progress poll(comms& c, std::size_t i, ncclResult_t& state) {
  std::lock_guard lock(c.comm_mutex[i]);
  if (c.comm[i] == nullptr) throw_aborted(c);
  state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(c.comm[i], &state);
  if (r != ncclSuccess) state = r;
  return classify(r, state);
}

// Polls until `ready()` or the deadline; between polls, NCCL's asynchronous error of rank i's
// communicator (an error aborts the set and throws).
template <class Ready>
bool wait_until(comms& c, std::size_t i, std::chrono::steady_clock::time_point deadline, Ready&& ready) {
  for (unsigned spins = 0;; ++spins) {
    if (ready()) return true;
    ncclResult_t state = ncclSuccess;
    if (poll(c, i, state) == progress::failed) abort_and_fail(c, state, "an NCCL collective (asynchronous error)");
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// ncclGroupStart .. ncclGroupEnd as a scope: an exception between the two (a failed ncclAllReduce)
// still ends the group, or the thread would stay inside it and every later NCCL call on it would
// be deferred. NCCL discards a group in which a call failed, so nothing half-built is launched.
class group_scope {
 public:
  group_scope() { check_nccl(ncclGroupStart(), "ncclGroupStart"); }
  group_scope(const group_scope&) = delete;
  group_scope& operator=(const group_scope&) = delete;
  ~group_scope() {
    if (open_) (void)ncclGroupEnd();
  }
  ncclResult_t end() noexcept {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_ = true;
};

}  // namespace

void comms::peer_aborted(int worker, const std::string& why) noexcept {
  try {
    (void)abort_all(*this, detail::format("worker %d aborted its communicators: %s", worker, why.c_str()).c_str());
  } catch (...) {
    (void)abort_all(*this, "another worker aborted its communicators");
  }
}

int num_ranks(const comms& c) noexcept { return c.nranks; }
int first_rank(const comms& c) noexcept { return c.first_rank; }
std::uint64_t enqueued(const comms& c, int rank) noexcept { return c.entered[static_cast<std::size_t>(rank)].load(); }

int version() noexcept {
  int v = 0;
  (void)ncclGetVersion(&v);
  return v;
}

bool shared_gpus_enabled() noexcept {
  const char* on = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return on != nullptr && std::string(on) == "1" && version() >= 23000;
}

comms* create_comms(std::span<const int> devices, std::chrono::milliseconds timeout,
                    detail::worker_group* workers) {
  auto c = std::make_unique<comms>();
  const int n = static_cast<int>(devices.size());
  c->devices.assign(devices.begin(), devices.end());
  c->comm.assign(devices.size(), nullptr);
  c->comm_mutex = std::make_unique<std::mutex[]>(devices.size());
  c->pending.resize(devices.size());
  c->entered = std::make_unique<std::atomic<std::uint64_t>[]>(devices.size());
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
  // The caller's device is its own again however this ends.
  struct restore {
    int device;
    ~restore() {
      if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
    }
  } const restore_previous{previous};
  // A failure below frees (aborts) whatever was created, here and on the other workers (who would
  // otherwise wait for this worker's ranks to join until their timeout).
  struct abort_on_failure {
    comms* c;
    ~abort_on_failure() {
      if (c == nullptr) return;
      abort_everywhere(*c, "creating the communicators failed");
      if (detail::worker_group* const w = c->workers.load()) w->set_device_abort_listener(nullptr);
    }
  } guard{c.get()};
  if (workers != nullptr && workers->num_workers() > 1) {
    c->workers.store(workers);
    workers->set_device_abort_listener(c.get());
  }
  const int num_workers = workers != nullptr ? workers->num_workers() : 1;
  const int worker = workers != nullptr ? workers->worker_index() : 0;
  c->nranks = num_workers * n;
  c->first_rank = worker * n;
  // Worker 0 creates the id; the group broadcasts it with worker 0's result, so a failure there
  // is an error on every worker instead of a wait for an id that never comes.
  struct {
    ncclUniqueId id;
    std::int32_t result;
  } boot{};
  if (worker == 0) boot.result = static_cast<std::int32_t>(ncclGetUniqueId(&boot.id));
  if (workers != nullptr) {
    workers->broadcast(&boot, sizeof boot, 0, "mirror::ops::NcclAllReduce (the NCCL unique id, from worker 0)");
  }
  if (boot.result != ncclSuccess) {
    fail_nccl(static_cast<ncclResult_t>(boot.result),
              worker == 0 ? "ncclGetUniqueId" : "ncclGetUniqueId (on worker 0)");
  }
  const ncclUniqueId& id = boot.id;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // Every rank of this process inside one group: NCCL's single-thread, several-GPU init. (No other
  // thread knows these communicators yet: no locks.)
  ncclResult_t end = ncclSuccess;
  {
    group_scope group;
    for (int i = 0; i < n; ++i) {
      check_cuda(cudaSetDevice(devices[static_cast<std::size_t>(i)]), "cudaSetDevice");
      check_nccl(ncclCommInitRankConfig(&c->comm[static_cast<std::size_t>(i)], c->nranks, id, c->first_rank + i,
                                        &config),
                 "ncclCommInitRankConfig");
    }
    end = group.end();
  }
  if (classify(end, ncclSuccess) == progress::failed) fail_nccl(end, "ncclGroupEnd (communicator creation)");
  // Each communicator is ready when its asynchronous state leaves ncclInProgress: ncclSuccess, or
  // an error (a failed init), which must not pass for ready. Every rank is polled in each round:
  // one rank's failure leaves the others in progress (waiting for it to join), so a wait on the
  // first alone would end at the timeout instead of at the failure.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> ready(devices.size(), false);
  for (unsigned spins = 0, left = static_cast<unsigned>(n); left > 0; ++spins) {
    for (int i = 0; i < n; ++i) {
      const auto rank = static_cast<std::size_t>(i);
      if (ready[rank]) continue;
      ncclResult_t state = ncclSuccess;
      const progress p = poll(*c, rank, state);
      if (p == progress::failed) {
        fail_nccl(state, detail::format("ncclCommInitRankConfig (rank %d)", c->first_rank + i).c_str());
      }
      if (p == progress::done) {
        ready[rank] = true;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<int> pending;
      for (int r = 0; r < n; ++r) {
        if (!ready[static_cast<std::size_t>(r)]) pending.push_back(c->first_rank + r);
      }
      throw timeout_error(
          detail::format("mirror::ops::NcclAllReduce: creating the communicators took longer than %lld ms%s; they "
                         "were aborted",
                         static_cast<long long>(timeout.count()),
                         num_workers > 1 ? detail::format(" (%d ranks over %d workers)", c->nranks, num_workers).c_str()
                                         : ""),
          pending);
    }
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (int i = 0; i < n; ++i) {
    check_cuda(cudaSetDevice(devices[static_cast<std::size_t>(i)]), "cudaSetDevice");
    for (cudaEvent_t& e : c->pending[static_cast<std::size_t>(i)].events) {
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    }
  }
  guard.c = nullptr;
  return c.release();
}

void destroy(comms* c) noexcept {
  if (c == nullptr) return;
  // No peer's abort reaches the set from here on (the group may also be gone already: then it
  // told the set so). An abort below is this worker's own and is not reported: the peers are
  // tearing down too, or will time out.
  if (detail::worker_group* const w = c->workers.exchange(nullptr)) w->set_device_abort_listener(nullptr);
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  for (std::size_t i = 0; i < c->comm.size(); ++i) {
    if (cudaSetDevice(c->devices[i]) != cudaSuccess) continue;
    // Unfinished collectives get until their deadline; then the communicators are aborted, so
    // destruction never waits forever on a lost GPU or link. (Deadlines are absolute: ranks
    // after the first wait only for what is left of theirs, and an abort ends every wait.)
    in_flight& f = c->pending[i];
    for (; f.count > 0; --f.count, f.oldest = (f.oldest + 1) % max_in_flight) {
      cudaError_t q = cudaErrorNotReady;
      while ((q = query(f.events[f.oldest])) == cudaErrorNotReady && !c->aborted.load() &&
             std::chrono::steady_clock::now() < f.deadlines[f.oldest]) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (q == cudaErrorNotReady) (void)abort_all(*c, "a collective did not complete before the Strategy was destroyed");
    }
    for (cudaEvent_t e : f.events) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    std::lock_guard lock(c->comm_mutex[i]);
    if (c->comm[i] != nullptr) {
      // Non-blocking: finalize may report ncclInProgress; it gets 5 s to complete. NCCL
      // frees only a communicator whose finalize has completed: one still in progress (a peer
      // that never finalizes, a lost link) is aborted instead, which frees it in any state.
      (void)ncclCommFinalize(c->comm[i]);
      ncclResult_t state = ncclInProgress;
      const auto finalize_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (state == ncclInProgress && std::chrono::steady_clock::now() < finalize_by) {
        if (ncclCommGetAsyncError(c->comm[i], &state) != ncclSuccess) break;
        if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (state == ncclInProgress) {
        (void)ncclCommAbort(c->comm[i]);
      } else {
        (void)ncclCommDestroy(c->comm[i]);
      }
      c->comm[i] = nullptr;
    }
  }
  if (previous >= 0) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
  delete c;
}

namespace {

// One group of NCCL calls on local rank `rank`'s communicator, enqueued on `stream`: the watchdog
// over the rank's earlier collectives, the group under the communicator's lock (`calls(comm)`
// makes the NCCL calls and returns the first failure), the wait for a non-blocking enqueue, then
// `after()` (work on the stream that must follow the collective: a copy out, a divide), and the
// completion event. Every collective of the set goes through here, so each has the same timeout,
// abort and naming rules. `noun` names the collective in messages ("all-reduce"), `call` the
// NCCL function ("ncclAllReduce").
template <class Calls, class After>
void enqueue_group(comms& c, int rank, cudaStream_t s, std::chrono::milliseconds timeout, const char* noun,
                   const char* call, Calls&& calls, After&& after) {
  if (c.aborted.load()) throw_aborted(c);
  const std::size_t me = static_cast<std::size_t>(rank);
  in_flight& f = c.pending[me];
  auto expire_for = [&](const std::string& stage, std::uint64_t seq) {
    // A rank counts as having enqueued collective `seq` once it handed it to NCCL (`entered`);
    // one still draining its own ring, or never come, is missing.
    std::vector<int> missing;
    for (std::size_t r = 0; r < c.comm.size(); ++r) {
      if (c.entered[r].load() < seq) missing.push_back(c.first_rank + static_cast<int>(r));
    }
    abort_everywhere(c, detail::format("after replica %d waited %lld ms %s", c.first_rank + rank,
                                       static_cast<long long>(timeout.count()), stage.c_str())
                            .c_str());
    std::string names;
    for (int r : missing) names += detail::format("%s%d", names.empty() ? "" : ", ", r).c_str();
    // Where each local replica is: the call it waits in, or its last one (empty outside a run).
    const detail::message replicas = detail::describe_replicas(
        c.first_rank, rank, [&](int r) { return c.entered[static_cast<std::size_t>(r)].load() >= seq; });
    const bool described = replicas.c_str()[0] != '\0';
    throw timeout_error(
        detail::with_flight_record(detail::format(
            "mirror::ops::NcclAllReduce: replica %d waited %lld ms %s in %s; replicas {%s} had not "
                       "enqueued it%s%s%s%s; the communicators were aborted",
                       c.first_rank + rank, static_cast<long long>(timeout.count()), stage.c_str(),
                       detail::describe_position("a collective").c_str(), names.c_str(), described ? " (" : "",
                       replicas.c_str(), described ? ")" : "",
                       missing.empty() ? (c.nranks > static_cast<int>(c.comm.size())
                                              ? " (all of this worker's had: the GPUs, links or other workers did "
                                                "not complete it)"
                                              : " (all had: the GPUs or links did not complete it)")
                                       : "")),
        missing);
  };
  // The watchdog, deferred: earlier collectives of this rank that have finished are retired; one
  // past its deadline aborts the communicators. When the ring is full, wait for the oldest.
  while (f.count > 0) {
    const std::size_t slot = f.oldest;
    const cudaError_t q = query(f.events[slot]);
    if (q == cudaErrorNotReady) {
      const bool full = f.count == max_in_flight;
      if (!full && std::chrono::steady_clock::now() < f.deadlines[slot]) break;
      cudaError_t polled = cudaErrorNotReady;
      if (!wait_until(c, me, f.deadlines[slot], [&] {
            polled = query(f.events[slot]);
            return polled != cudaErrorNotReady;
          })) {
        expire_for("for an earlier collective to complete", f.sequences[slot]);
      }
      if (polled != cudaSuccess) check_cuda(polled, "cudaEventQuery (an earlier collective)");
    } else if (q != cudaSuccess) {
      check_cuda(q, "cudaEventQuery (an earlier collective)");
    }
    f.oldest = (f.oldest + 1) % max_in_flight;
    --f.count;
  }
  // Counted only now, after this rank's own ring has drained: the others' timeouts name it
  // while it is still waiting there.
  const std::uint64_t sequence = c.entered[me].fetch_add(1) + 1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  ncclResult_t end = ncclSuccess;
  {
    std::unique_lock lock(c.comm_mutex[me]);
    ncclComm_t comm = c.comm[me];
    if (comm == nullptr) throw_aborted(c);
    ncclResult_t failed = ncclSuccess;
    {
      group_scope group;
      failed = calls(comm);
      end = group.end();
    }
    if (failed != ncclSuccess) {
      lock.unlock();
      abort_and_fail(c, failed, call);
    }
  }
  if (classify(end, ncclSuccess) == progress::failed) abort_and_fail(c, end, "ncclGroupEnd");
  // Non-blocking communicators may still be enqueuing (ncclInProgress): wait for that first (NCCL
  // orders later work on the stream after the collective only once it is enqueued). An
  // asynchronous error instead of success is a failure, not "enqueued".
  if (end == ncclInProgress) {
    if (!wait_until(c, me, deadline, [&] {
          ncclResult_t state = ncclSuccess;
          const progress p = poll(c, me, state);
          if (p == progress::failed) abort_and_fail(c, state, std::string("ncclGroupEnd (enqueuing the ") + noun + ")");
          return p == progress::done;
        })) {
      expire_for(std::string("for NCCL to enqueue the ") + noun, sequence);
    }
  }
  {
    // What follows the collective on the stream (a mean's division, a cut's copy) launches on the
    // rank's device, whichever device the replica's fn left current; the caller's comes back.
    const rank_device_guard on(c.devices[me]);
    after();
  }
  // Completion is watched, not waited for: the event joins this rank's ring with its deadline,
  // and the next collective on this rank (or destroy) retires it or times it out. So the
  // host returns once the work is enqueued (docs/cuda.md#the-device); a lost peer cannot enqueue
  // anything here unnoticed, since NcclAllReduce's agreement exchange precedes every call.
  const std::size_t slot = (f.oldest + f.count) % max_in_flight;
  check_cuda(cudaEventRecord(f.events[slot], s), "cudaEventRecord");
  f.deadlines[slot] = deadline;
  f.sequences[slot] = sequence;
  ++f.count;
}

// The integer mean: NCCL summed, and C++'s division (truncation) follows on the stream.
void divide_for_mean(void* stream, detail::element_kind type, void* p, std::size_t n, int nranks) {
  if (n == 0) return;
  const int e = cuda::impl::launch_divide(stream, type, p, n, static_cast<std::size_t>(nranks));
  if (e != 0) check_cuda(static_cast<cudaError_t>(e), "the divide kernel launch");
}

char* at(void* p, std::size_t elements, std::size_t bytes) noexcept { return static_cast<char*>(p) + elements * bytes; }
const char* at(const void* p, std::size_t elements, std::size_t bytes) noexcept {
  return static_cast<const char*>(p) + elements * bytes;
}

}  // namespace

void all_reduce(comms& c, int rank, void* stream, ReduceOp op, detail::element_kind type,
                std::span<void* const> buffers, std::span<const std::size_t> counts,
                std::chrono::milliseconds timeout) {
  auto s = static_cast<cudaStream_t>(stream);
  enqueue_group(
      c, rank, s, timeout, "all-reduce", "ncclAllReduce",
      [&](ncclComm_t comm) {
        for (std::size_t i = 0; i < buffers.size(); ++i) {
          if (counts[i] == 0) continue;
          const ncclResult_t r =
              ncclAllReduce(buffers[i], buffers[i], counts[i], nccl_type(type), nccl_op(op, type), comm, s);
          if (classify(r, ncclSuccess) == progress::failed) return r;
        }
        return ncclSuccess;
      },
      [&] {
        if (op != ReduceOp::mean || type.is_floating()) return;
        for (std::size_t i = 0; i < buffers.size(); ++i) divide_for_mean(stream, type, buffers[i], counts[i], c.nranks);
      });
}

std::size_t reduce_scatter_scratch(const comms& c, std::span<const std::size_t> sizes) noexcept {
  const std::size_t n_ranks = static_cast<std::size_t>(c.nranks);
  std::size_t total = 0;
  for (const std::size_t n : sizes) {
    if (n % n_ranks != 0) total += n_ranks * (n / n_ranks + 1);
  }
  return total;
}

void reduce_scatter(comms& c, int rank, void* stream, ReduceOp op, detail::element_kind type,
                    std::span<const void* const> in, std::span<void* const> out, std::span<const std::size_t> sizes,
                    void* scratch, std::chrono::milliseconds timeout) {
  auto s = static_cast<cudaStream_t>(stream);
  const int N = c.nranks;
  const int g = c.first_rank + rank;
  const std::size_t es = type.bytes, n_ranks = static_cast<std::size_t>(N);
  if (N == 1) {
    // One replica has nothing to reduce: its cut is the whole leaf (a mean of one value is that
    // value). NCCL is not called: on one rank, ncclReduceScatter with ncclAvg returned wrong
    // values for leaves of 64 Ki floats and more (NCCL 2.28.9, H100), where ncclAllReduce did not.
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      if (sizes[k] == 0 || in[k] == out[k]) continue;
      check_cuda(cudaMemcpyAsync(out[k], in[k], sizes[k] * es, cudaMemcpyDeviceToDevice, s),
                 "cudaMemcpyAsync (reduce_scatter on one replica)");
    }
    return;
  }
  // Where each leaf is reduced: in place in the leaf when its length is a multiple of N (NCCL's
  // equal blocks are then exactly the cuts), else in a padded block of the scratch (offset per
  // leaf; none for the others).
  std::vector<std::size_t> padded_at(sizes.size(), 0);
  std::size_t used = 0;
  // The 2D copy and set below take the block as their pitch, which CUDA limits
  // (cudaDevAttrMaxPitch, 2^31-1 bytes today): a larger block goes row by row (N rows at most).
  std::size_t max_pitch = 0;
  for (std::size_t k = 0; k < sizes.size() && max_pitch == 0; ++k) {
    if (sizes[k] % n_ranks == 0) continue;
    int v = 0;
    check_cuda(cudaDeviceGetAttribute(&v, cudaDevAttrMaxPitch, c.devices[static_cast<std::size_t>(rank)]),
               "cudaDeviceGetAttribute (cudaDevAttrMaxPitch)");
    max_pitch = static_cast<std::size_t>(v);
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t n = sizes[k];
    if (n % n_ranks == 0) continue;
    padded_at[k] = used;
    const std::size_t b = n / n_ranks, e = n % n_ranks, block = b + 1;
    char* const pad = at(scratch, used, es);
    // Cuts 0..e-1 (b+1 elements each) are the leaf's first e*(b+1) elements, already in block
    // layout; cuts e..N-1 (b each) go one per block of b+1, leaving the last element of each, which
    // is zeroed: every rank reduces the same defined values there, and nobody reads the result.
    check_cuda(cudaMemcpyAsync(pad, in[k], e * block * es, cudaMemcpyDeviceToDevice, s),
               "cudaMemcpyAsync (reduce_scatter: the leaf into the padded scratch)");
    if (block * es <= max_pitch) {
      if (b > 0) {
        check_cuda(cudaMemcpy2DAsync(at(pad, e * block, es), block * es, at(in[k], e * block, es), b * es, b * es,
                                     n_ranks - e, cudaMemcpyDeviceToDevice, s),
                   "cudaMemcpy2DAsync (reduce_scatter: the short cuts into the padded scratch)");
      }
      check_cuda(cudaMemset2DAsync(at(pad, e * block + b, es), block * es, 0, es, n_ranks - e, s),
                 "cudaMemset2DAsync (reduce_scatter: the padding)");
    } else {
      for (std::size_t r = e; r < n_ranks; ++r) {
        char* const row = at(pad, r * block, es);
        check_cuda(cudaMemcpyAsync(row, at(in[k], e * block + (r - e) * b, es), b * es, cudaMemcpyDeviceToDevice, s),
                   "cudaMemcpyAsync (reduce_scatter: a short cut into the padded scratch)");
        check_cuda(cudaMemset2DAsync(at(row, b, es), es, 0, es, 1, s), "cudaMemset2DAsync (reduce_scatter: the padding)");
      }
    }
    used += n_ranks * block;
  }
  enqueue_group(
      c, rank, s, timeout, "reduce-scatter", "ncclReduceScatter",
      [&](ncclComm_t comm) {
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const std::size_t n = sizes[k];
          if (n == 0) continue;
          const std::size_t block = (n + n_ranks - 1) / n_ranks;
          // Padded leaves are reduced in place in the scratch (recvbuff = sendbuff + rank * count).
          const void* send = n % n_ranks == 0 ? in[k] : at(scratch, padded_at[k], es);
          void* recv = n % n_ranks == 0 ? out[k] : at(scratch, padded_at[k] + static_cast<std::size_t>(g) * block, es);
          const ncclResult_t r = ncclReduceScatter(send, recv, block, nccl_type(type), nccl_op(op, type), comm, s);
          if (classify(r, ncclSuccess) == progress::failed) return r;
        }
        return ncclSuccess;
      },
      [&] {
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const std::size_t n = sizes[k];
          const std::size_t mine = mirror::backend::cut_of(n, N, g).second;
          if (n % n_ranks != 0 && mine > 0) {
            const std::size_t block = n / n_ranks + 1;
            check_cuda(cudaMemcpyAsync(out[k], at(scratch, padded_at[k] + static_cast<std::size_t>(g) * block, es),
                                       mine * es, cudaMemcpyDeviceToDevice, s),
                       "cudaMemcpyAsync (reduce_scatter: the cut out of the padded scratch)");
          }
          if (op == ReduceOp::mean && !type.is_floating()) divide_for_mean(stream, type, out[k], mine, N);
        }
      });
}

void all_gather(comms& c, int rank, void* stream, detail::element_kind type, std::span<const void* const> in,
                std::span<void* const> out, std::span<const std::size_t> counts, std::chrono::milliseconds timeout) {
  auto s = static_cast<cudaStream_t>(stream);
  const std::size_t n_ranks = static_cast<std::size_t>(c.nranks), k_leaves = in.size();
  const int g = c.first_rank + rank;
  if (counts.size() != n_ranks * k_leaves) {
    throw std::invalid_argument(detail::format("mirror::nccl::impl::all_gather: counts has %zu entries, not ranks * "
                                               "leaves = %zu; pass every rank's count of every leaf",
                                               counts.size(), n_ranks * k_leaves)
                                    .c_str());
  }
  const std::size_t es = type.bytes;
  enqueue_group(
      c, rank, s, timeout, "all-gather", "ncclAllGather or ncclBroadcast",
      [&](ncclComm_t comm) {
        for (std::size_t k = 0; k < k_leaves; ++k) {
          bool equal = true;
          for (std::size_t r = 1; r < n_ranks; ++r) equal = equal && counts[r * k_leaves + k] == counts[k];
          if (equal) {
            if (counts[k] == 0) continue;
            const ncclResult_t r = ncclAllGather(in[k], out[k], counts[k], nccl_type(type), comm, s);
            if (classify(r, ncclSuccess) == progress::failed) return r;
            continue;
          }
          // Counts that differ: NCCL's allgatherv recipe, one broadcast per rank into its offset,
          // all in this group (NCCL runs them together).
          std::size_t offset = 0;
          for (std::size_t r = 0; r < n_ranks; ++r) {
            const std::size_t count = counts[r * k_leaves + k];
            if (count == 0) continue;
            void* recv = at(out[k], offset, es);
            // sendbuff is read on the root only; elsewhere it is given the (valid) receive address.
            const void* send = static_cast<int>(r) == g ? in[k] : recv;
            const ncclResult_t res =
                ncclBroadcast(send, recv, count, nccl_type(type), static_cast<int>(r), comm, s);
            if (classify(res, ncclSuccess) == progress::failed) return res;
            offset += count;
          }
        }
        return ncclSuccess;
      },
      [] {});
}

}  // namespace mirror::nccl::impl
