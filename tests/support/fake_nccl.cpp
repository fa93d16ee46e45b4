// SPDX-License-Identifier: Apache-2.0
// The scripted CUDA runtime and NCCL of tests/support/fake_nccl.hpp: the functions
// backends/cuda/cuda_runtime.cpp and backends/nccl/nccl_comms.cpp call, with the signatures of
// <cuda_runtime_api.h> and <nccl.h>, defined over host memory; streams run everything at once.
// Rules it checks (each broken one is a violation): a kernel goes on a stream of the current
// device and reads memory that device can reach (its own, or a peer's with access enabled); no
// NCCL call on a communicator while another thread is inside one on it, none after
// ncclCommAbort freed it, no abort while another thread is inside a call; communicators
// non-blocking; each call of a communicator ordered after its previous one (same stream, or
// events between the streams). What it models: a failed call, and cudaEventQuery's cudaErrorNotReady, stay as
// the thread's last error (as the issue found), and a launch reports that error as its own, as a
// launch check that reads cudaGetLastError() does; a collective is enqueued (ncclGroupEnd's
// ncclInProgress resolves) only once every rank has launched it, and completes then unless its
// rank is scripted to hang. Collectives: all-reduce, reduce-scatter, all-gather and broadcast, for
// every ncclRedOp_t mirror uses, on float, double, half, bfloat16 and 32- and 64-bit integers,
// computed as NCCL's kernels do: each step rounded to the element type, ncclAvg of floating types
// as a sum of inputs pre-multiplied by 1/N rounded to the type (integers: the sum divided), min
// and max of floating types as fmin and fmax (a NaN is dropped unless every rank's is one).
// Asynchrony: work runs when enqueued, but every access of device memory is checked against the
// earlier ones it conflicts with (one of them a write): they must be ordered by stream or events,
// and the host may touch device memory (cudaMemcpy) only after synchronizing with the work that
// wrote or reads it. Device bookkeeping: a communicator's buffers and stream belong to the device
// current at its init; two ranks of one communicator on one device fail init (ncclInvalidUsage),
// as NCCL's duplicate-GPU check does within one host (here: one process).
#include "support/fake_nccl.hpp"
#include "support/half_float.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <span>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>
#include <mirror/backends/cuda/element_type.hpp>
#include <mirror/backends/cuda/kernels.hpp>
#include <mirror/detail/element_ops.hpp>

namespace {

enum class kind { all_reduce, reduce_scatter, all_gather, broadcast };
const char* name_of(kind k) {
  switch (k) {
    case kind::all_reduce: return "ncclAllReduce";
    case kind::reduce_scatter: return "ncclReduceScatter";
    case kind::all_gather: return "ncclAllGather";
    case kind::broadcast: return "ncclBroadcast";
  }
  return "?";
}

// One NCCL call of a group, as the rank made it. `count` is NCCL's: the whole buffer for an
// all-reduce and a broadcast, each rank's block for a reduce-scatter (recvcount) and an all-gather
// (sendcount).
struct queued {
  kind what;
  ncclComm* comm;
  const void* send;
  void* recv;
  std::size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  cudaStream_t stream;
};

struct world {
  int nranks = 0;
  int joined = 0;           // ranks of this process that called init
  std::vector<int> device;  // per rank: its device (-1: not joined here)
  std::vector<std::uint64_t> launched;                                // per rank: groups launched
  std::map<std::uint64_t, std::vector<std::vector<queued>>> data;     // per collective: each rank's buffers
};

std::mutex lock;
fake_nccl::script plan;
fake_nccl::record seen;
std::map<std::string, std::unique_ptr<world>> worlds;
std::vector<std::unique_ptr<ncclComm>> all_comms;
std::uint64_t next_id = 0;

struct last_collective {
  world* w = nullptr;
  std::uint64_t seq = 0;
  int rank = -1;
};
std::map<cudaStream_t, last_collective> stream_last;

// The stream log (fake_nccl::stream_log): every piece of work in enqueue order, its position on
// its stream, and the event edges: the work of `to` from entry `to_from` on waits for the first
// `from_count` entries of `from`.
struct logged {
  fake_nccl::enqueued entry;
  std::size_t position;  // among its stream's entries
};
std::vector<logged> work_log;
// The edges by target and source stream: (to_from, the largest from_count of the edges so far),
// to_from non-decreasing, so that the closure below finds an edge by binary search.
std::map<const void*, std::map<const void*, std::vector<std::pair<std::size_t, std::size_t>>>> edges_into;

// How many of each stream's entries must complete before the first `count` entries of `stream`
// are (the closure of the event edges).
std::map<const void*, std::size_t> reach_from(const void* stream, std::size_t count) {  // (lock held)
  std::map<const void*, std::size_t> reach{{stream, count}};
  std::vector<const void*> work{stream};
  while (!work.empty()) {
    const void* u = work.back();
    work.pop_back();
    const auto into = edges_into.find(u);
    if (into == edges_into.end()) continue;
    const std::size_t r = reach[u];
    for (const auto& [from, list] : into->second) {
      // The last edge whose to_from < r.
      const auto it = std::lower_bound(list.begin(), list.end(), r,
                                       [](const std::pair<std::size_t, std::size_t>& e, std::size_t v) {
                                         return e.first < v;
                                       });
      if (it == list.begin()) continue;
      const std::size_t c = std::prev(it)->second;
      std::size_t& mine = reach[from];
      if (c > mine) {
        mine = c;
        work.push_back(from);
      }
    }
  }
  return reach;
}
std::map<const void*, std::size_t> stream_length;

void log_work(const void* stream, std::string what) {  // (lock held)
  work_log.push_back({{stream, std::move(what)}, stream_length[stream]++});
}

// For entry b: how many of each stream's entries must complete before b starts (b's own stream
// counting b itself); an edge into stream u at entry m carries its source's first entries along
// once m is reached.
std::map<const void*, std::size_t> reach_of(std::size_t b) {  // (lock held)
  return reach_from(work_log[b].entry.stream, work_log[b].position + 1);
}
bool ordered_by(const std::map<const void*, std::size_t>& reach, std::size_t a, std::size_t b) {  // (lock held)
  const logged& x = work_log[a];
  if (x.entry.stream == work_log[b].entry.stream) return x.position < work_log[b].position;
  const auto it = reach.find(x.entry.stream);
  return it != reach.end() && x.position < it->second;
}

// fake_nccl::happens_before, with the lock held.
bool ordered(std::size_t a, std::size_t b) {  // (lock held)
  if (a >= work_log.size() || b >= work_log.size() || a == b) return false;
  if (work_log[a].entry.stream == work_log[b].entry.stream) return work_log[a].position < work_log[b].position;
  return ordered_by(reach_of(b), a, b);
}

struct allocation {
  std::size_t bytes;
  int device;
};
std::map<const char*, allocation> allocations;  // device memory, by base address

// The allocation holding p, or allocations.end().
std::map<const char*, allocation>::iterator allocation_of(const void* p) {  // (lock held)
  auto it = allocations.upper_bound(static_cast<const char*>(p));
  if (it == allocations.begin()) return allocations.end();
  --it;
  return static_cast<const char*>(p) < it->first + it->second.bytes ? it : allocations.end();
}

// The device accesses of each allocation that later ones must be ordered after: a write drops
// the earlier accesses it covers (anything ordered after it is ordered after them).
struct access {
  std::size_t entry;  // its work_log entry
  std::size_t from, to;
  bool write;
};
std::map<const char*, std::vector<access>> accesses;
std::map<const void*, std::size_t> host_done;  // per stream: its first n entries the host has seen complete

std::string describe(std::size_t entry) {  // (lock held)
  char at[32];
  std::snprintf(at, sizeof at, "%p", work_log[entry].entry.stream);
  return work_log[entry].entry.what + " (stream " + at + ")";
}

// Work log entry `entry` reads or writes [p, p + bytes): any earlier conflicting access of that
// memory must happen before it, or the GPU may run the two in either order.
void touch(std::size_t entry, const void* p, std::size_t bytes, bool write) {  // (lock held)
  if (bytes == 0) return;
  const auto it = allocation_of(p);
  if (it == allocations.end()) return;  // host memory (a test's own buffers)
  const std::size_t from = static_cast<std::size_t>(static_cast<const char*>(p) - it->first), to = from + bytes;
  std::vector<access>& list = accesses[it->first];
  std::map<const void*, std::size_t> reach;  // computed once, at the first access on another stream
  bool have_reach = false;
  for (const access& a : list) {
    if (a.to <= from || to <= a.from || !(a.write || write) || a.entry == entry) continue;
    const bool same_stream = work_log[a.entry].entry.stream == work_log[entry].entry.stream;
    if (!same_stream && !have_reach) {
      reach = reach_of(entry);
      have_reach = true;
    }
    if (!ordered_by(reach, a.entry, entry)) {
      seen.violations.push_back(describe(entry) + (write ? " writes" : " reads") + " device memory that " +
                                describe(a.entry) + (a.write ? " writes" : " reads") +
                                ", with no stream order or event between them");
    }
  }
  if (write) {
    std::erase_if(list, [&](const access& a) { return from <= a.from && a.to <= to; });
  }
  list.push_back({entry, from, to, write});
  if (list.size() > 256) list.erase(list.begin());  // bounded: the oldest are long ordered
}
void touch_last(const void* p, std::size_t bytes, bool write) {  // the latest entry (lock held)
  touch(work_log.size() - 1, p, bytes, write);
}

// The host reads or writes [p, p + bytes) synchronously: every conflicting device access must be
// complete as far as the host knows (a synchronize, or a completed event after it).
void host_touch(const void* p, std::size_t bytes, bool write, const char* call) {  // (lock held)
  const auto it = allocation_of(p);
  if (it == allocations.end() || bytes == 0) return;
  const std::size_t from = static_cast<std::size_t>(static_cast<const char*>(p) - it->first), to = from + bytes;
  for (const access& a : accesses[it->first]) {
    if (a.to <= from || to <= a.from || !(a.write || write)) continue;
    const logged& l = work_log[a.entry];
    if (l.position >= host_done[l.entry.stream]) {
      seen.violations.push_back(std::string(call) + " on the host " + (write ? "writes" : "reads") +
                                " device memory that " + describe(a.entry) + (a.write ? " writes" : " reads") +
                                " and the host has not synchronized with");
    }
  }
}

// The host learns that stream s's first n entries are complete, and with them everything that
// they were ordered after by events.
void complete_through(const void* s, std::size_t n) {  // (lock held)
  const auto reach = reach_from(s, n);
  for (const auto& [stream, count] : reach) host_done[stream] = std::max(host_done[stream], count);
}
bool peer_enabled[8][8] = {};

thread_local int device = 0;
thread_local cudaError_t last = cudaSuccess;
thread_local int depth = 0;
thread_local std::vector<queued> group_ops;
thread_local ncclResult_t group_error = ncclSuccess;

void violation(const std::string& what) {
  std::lock_guard g(lock);
  seen.violations.push_back(what);
}

}  // namespace

struct ncclComm {
  world* w = nullptr;
  int rank = 0;
  int device = 0;            // current at its init: its buffers and streams must be this device's
  bool initialized = false;  // its init completed (successfully or not)
  last_collective last;      // its latest launched collective (finalize waits for it)
  int finalize_left = 0;     // polls before a finalize completes
  int init_polls = 0;
  std::uint64_t enqueuing = 0;   // a launched collective whose enqueue is still in progress
  ncclResult_t error = ncclSuccess;
  std::atomic<int> in_use{0};
  std::atomic<bool> aborted{false};
  bool destroyed = false;
  bool finalizing = false;  // ncclCommFinalize was called
  std::size_t last_work = static_cast<std::size_t>(-1);  // the log entry of its last launched call
};

struct CUevent_st {
  last_collective waits_for;
  cudaStream_t recorded_on = nullptr;  // the stream of the latest cudaEventRecord
  std::size_t recorded_after = 0;      // the work that stream had then (its first n entries)
};

namespace {

// Inside an NCCL call on `c`: NCCL's one-thread-per-communicator rule, and no use after abort. The
// call lasts a little, so that a missing lock shows up as an overlap here.
struct inside {
  ncclComm* c;
  explicit inside(ncclComm* comm, const char* call) : c(comm) {
    if (c->aborted.load()) violation(std::string(call) + " on an aborted (freed) communicator");
    if (c->destroyed) violation(std::string(call) + " on a destroyed communicator");
    if (c->in_use.fetch_add(1) != 0) violation(std::string(call) + " while another thread is inside an NCCL call on it");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ~inside() { c->in_use.fetch_sub(1); }
};

bool collective_done(const last_collective& l) {
  if (l.w == nullptr) return true;
  if (l.rank == plan.hang_rank) return false;
  for (const std::uint64_t n : l.w->launched) {
    if (n < l.seq) return false;
  }
  return true;
}

// The arithmetic type of an element type (float for half and bfloat16), and the two conversions.
template <class T>
struct num {
  using A = T;
  static A load(T x) { return x; }
  static T store(A x) { return x; }
};
template <>
struct num<mirror::cuda::half> {
  using A = float;
  static A load(mirror::cuda::half x) { return mirror::test::to_float(x); }
  static mirror::cuda::half store(A x) { return mirror::test::from_float<mirror::cuda::half>(x); }
};
template <>
struct num<mirror::cuda::bfloat16> {
  using A = float;
  static A load(mirror::cuda::bfloat16 x) { return mirror::test::to_float(x); }
  static mirror::cuda::bfloat16 store(A x) { return mirror::test::from_float<mirror::cuda::bfloat16>(x); }
};

// One step of NCCL's reduction in T's arithmetic, rounded to T: floating min and max are fmin and
// fmax (NCCL's, which drop a NaN operand), integers compare as integers.
template <class T>
T reduce_two(ncclRedOp_t op, T x, T y) {
  using N = num<T>;
  using A = typename N::A;
  const A a = N::load(x), b = N::load(y);
  switch (op) {
    case ncclProd: return N::store(static_cast<A>(a * b));
    case ncclMin:
      if constexpr (std::is_floating_point_v<A>) return N::store(std::fmin(a, b));
      else return b < a ? y : x;
    case ncclMax:
      if constexpr (std::is_floating_point_v<A>) return N::store(std::fmax(a, b));
      else return a < b ? y : x;
    default: return N::store(static_cast<A>(a + b));  // ncclSum, ncclAvg (pre-multiplied or divided)
  }
}

// The bytes [p, p + n) and [q, q + m) overlap.
bool overlap(const void* p, std::size_t n, const void* q, std::size_t m) {
  const char *a = static_cast<const char*>(p), *b = static_cast<const char*>(q);
  return a < b + m && b < a + n;
}

// Call `op` of every rank's group, once all have launched: NCCL's semantics over host memory,
// reducing in rank order (so a test's reference is the serial fold from rank 0). Every input is
// read before any output is written, which is what makes NCCL's in-place forms work here; any
// other overlap of a rank's send and receive buffers is a violation, as is ranks disagreeing on
// the call (a different kind, count, type, op or root would hang or corrupt on a GPU).
template <class T>
void run_call(std::vector<std::vector<queued>>& ranks, std::size_t op) {
  const std::size_t n_ranks = ranks.size();
  const queued& q0 = ranks[0][op];
  for (auto& r : ranks) {
    const queued& q = r[op];
    if (q.what != q0.what || q.count != q0.count || q.type != q0.type || q.op != q0.op || q.root != q0.root) {
      seen.violations.push_back(std::string("ranks disagree on call ") + std::to_string(op) + " of a group: " +
                                name_of(q.what) + " of " + std::to_string(q.count) + " vs " + name_of(q0.what) +
                                " of " + std::to_string(q0.count));
      return;
    }
  }
  const std::size_t c = q0.count;
  const std::size_t in_count = q0.what == kind::reduce_scatter ? c * n_ranks : c;
  const std::size_t out_count = q0.what == kind::all_gather ? c * n_ranks : c;
  for (std::size_t r = 0; r < n_ranks; ++r) {
    const queued& q = ranks[r][op];
    const bool reads = q0.what != kind::broadcast || static_cast<int>(r) == q0.root;
    if (!reads || !overlap(q.send, in_count * sizeof(T), q.recv, out_count * sizeof(T))) continue;
    const bool in_place = q.what == kind::reduce_scatter
                              ? q.recv == static_cast<const char*>(q.send) + r * c * sizeof(T)
                          : q.what == kind::all_gather ? q.send == static_cast<const char*>(q.recv) + r * c * sizeof(T)
                                                        : q.send == q.recv;
    if (!in_place) seen.violations.push_back(std::string(name_of(q.what)) + ": send and receive buffers overlap, not in place");
  }
  std::vector<std::vector<T>> inputs(n_ranks);
  for (std::size_t r = 0; r < n_ranks; ++r) {
    const queued& q = ranks[r][op];
    if (q0.what == kind::broadcast && static_cast<int>(r) != q0.root) continue;
    const T* x = static_cast<const T*>(q.send);
    inputs[r].assign(x, x + in_count);
  }
  using N = num<T>;
  using A = typename N::A;
  // ncclAvg of a floating type is NCCL's PreMulSum: each input times 1/N rounded to T, then summed.
  const bool premul = q0.op == ncclAvg && std::is_floating_point_v<A>;
  if (premul && (q0.what == kind::all_reduce || q0.what == kind::reduce_scatter)) {
    const A scale = N::load(N::store(static_cast<A>(1.0 / static_cast<double>(n_ranks))));
    for (auto& in : inputs) {
      for (T& x : in) x = N::store(static_cast<A>(N::load(x) * scale));
    }
  }
  switch (q0.what) {
    case kind::all_reduce:
    case kind::reduce_scatter: {
      std::vector<T> acc = inputs[0];
      for (std::size_t r = 1; r < n_ranks; ++r) {
        for (std::size_t i = 0; i < in_count; ++i) acc[i] = reduce_two(q0.op, acc[i], inputs[r][i]);
      }
      if (q0.op == ncclAvg && !premul) {  // integers: NCCL's SumPostDiv
        for (T& a : acc) a = N::store(static_cast<A>(N::load(a) / static_cast<A>(n_ranks)));
      }
      for (std::size_t r = 0; r < n_ranks; ++r) {
        const std::size_t from = q0.what == kind::reduce_scatter ? r * c : 0;
        std::memcpy(ranks[r][op].recv, acc.data() + from, c * sizeof(T));
      }
      break;
    }
    case kind::all_gather:
      for (std::size_t r = 0; r < n_ranks; ++r) {
        for (std::size_t from = 0; from < n_ranks; ++from) {
          std::memcpy(static_cast<T*>(ranks[r][op].recv) + from * c, inputs[from].data(), c * sizeof(T));
        }
      }
      break;
    case kind::broadcast:
      for (auto& r : ranks) std::memcpy(r[op].recv, inputs[static_cast<std::size_t>(q0.root)].data(), c * sizeof(T));
      break;
  }
}

void run_group(std::vector<std::vector<queued>>& ranks) {
  for (auto& r : ranks) {
    if (r.size() != ranks[0].size()) {
      seen.violations.push_back("ranks launched groups of different lengths (" + std::to_string(r.size()) + " vs " +
                                std::to_string(ranks[0].size()) + " calls)");
      return;
    }
  }
  for (std::size_t op = 0; op < ranks[0].size(); ++op) {
    switch (ranks[0][op].type) {
      case ncclFloat64: run_call<double>(ranks, op); break;
      case ncclInt32: run_call<std::int32_t>(ranks, op); break;
      case ncclInt64: run_call<std::int64_t>(ranks, op); break;
      case ncclFloat32: run_call<float>(ranks, op); break;
      case ncclFloat16: run_call<mirror::cuda::half>(ranks, op); break;
      case ncclBfloat16: run_call<mirror::cuda::bfloat16>(ranks, op); break;
      default: seen.violations.push_back("an element type the fake does not model"); return;
    }
  }
}

}  // namespace

namespace fake_nccl {

void reset(const script& s) {
  std::lock_guard g(lock);
  plan = s;
  seen = {};
  worlds.clear();
  all_comms.clear();
  stream_last.clear();
  work_log.clear();
  edges_into.clear();
  host_done.clear();
  accesses.clear();
  stream_length.clear();
  for (auto& row : peer_enabled) {
    for (bool& b : row) b = false;
  }
}
record snapshot() {
  std::lock_guard g(lock);
  return seen;
}
std::vector<enqueued> stream_log() {
  std::lock_guard g(lock);
  std::vector<enqueued> out;
  for (const auto& l : work_log) out.push_back(l.entry);
  return out;
}
std::size_t enqueue_marker(const void* stream, const std::string& what) {
  std::lock_guard g(lock);
  log_work(stream, what);
  return work_log.size() - 1;
}
bool happens_before(std::size_t a, std::size_t b) {
  std::lock_guard g(lock);
  return ordered(a, b);
}
int group_depth() { return depth; }
int last_error() { return static_cast<int>(last); }
int current_device() { return device; }

}  // namespace fake_nccl

// ---- the CUDA runtime ----

cudaError_t cudaGetDevice(int* d) {
  *d = device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= 8 || d >= plan.devices) return last = cudaErrorInvalidDevice;
  device = d;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = last;
  last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return last; }
const char* cudaGetErrorName(cudaError_t e) { return e == cudaErrorNotReady ? "cudaErrorNotReady" : "cudaError"; }
const char* cudaGetErrorString(cudaError_t) { return "fake CUDA error"; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard g(lock);
  e->waits_for = stream_last[s];
  e->recorded_on = s;
  e->recorded_after = stream_length[s];
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = plan.devices;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int d) {
  if (d < 0 || d >= plan.devices) return last = cudaErrorInvalidDevice;
  std::snprintf(id, static_cast<std::size_t>(len), "0000:%02x:00.0", 0x10 + d);
  return cudaSuccess;
}
namespace {
bool can_access(int from, int to) {
  if (!plan.can_access_peer) return false;
  for (const auto& [a, b] : plan.no_peer_access) {
    if (a == from && b == to) return false;
  }
  return true;
}
}  // namespace
cudaError_t cudaDeviceCanAccessPeer(int* can, int d, int peer) {
  *can = d != peer && can_access(d, peer) ? 1 : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int) {
  if (plan.enable_peer_error != 0) return last = static_cast<cudaError_t>(plan.enable_peer_error);
  if (peer < 0 || peer >= plan.devices) return last = cudaErrorInvalidDevice;
  if (!can_access(device, peer)) return last = cudaErrorPeerAccessUnsupported;
  std::lock_guard g(lock);
  if (peer_enabled[device][peer]) return last = cudaErrorPeerAccessAlreadyEnabled;
  peer_enabled[device][peer] = true;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new CUstream_st{-1, device};
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = new CUstream_st{-1, device};
  return cudaSuccess;
}
namespace {
// Destroyed streams are kept, so that no new stream reuses an address the log still names.
std::vector<std::unique_ptr<CUstream_st>> destroyed_streams;
}  // namespace
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard g(lock);
  complete_through(s, stream_length[s]);  // CUDA completes its work first
  destroyed_streams.emplace_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard g(lock);
  complete_through(s, stream_length[s]);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  std::lock_guard g(lock);
  if (e->recorded_on != nullptr && e->recorded_on != s) {
    auto& list = edges_into[s][e->recorded_on];
    const std::size_t most = list.empty() ? e->recorded_after : std::max(list.back().second, e->recorded_after);
    list.emplace_back(stream_length[s], most);
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  std::lock_guard g(lock);
  for (const auto& [stream, n] : stream_length) host_done[stream] = n;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (bytes > (std::size_t{1} << 36)) return last = cudaErrorMemoryAllocation;
  char* mem = new char[bytes];
  std::lock_guard g(lock);
  allocations[mem] = {bytes, device};
  *p = mem;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard g(lock);
  const auto it = allocations.find(static_cast<const char*>(p));
  if (it == allocations.end()) return last = cudaErrorInvalidValue;
  accesses.erase(it->first);  // cudaFree waits for the device's work on it
  delete[] it->first;
  allocations.erase(it);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::lock_guard g(lock);
  *a = {};
  a->type = cudaMemoryTypeUnregistered;
  a->device = -2;
  const auto it = allocation_of(p);
  if (it != allocations.end()) {
    a->type = cudaMemoryTypeDevice;
    a->device = it->second.device;
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind) {
  std::lock_guard g(lock);
  host_touch(src, n, false, "cudaMemcpy");
  host_touch(dst, n, true, "cudaMemcpy");
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind, cudaStream_t s) {
  std::memcpy(dst, src, n);
  std::lock_guard g(lock);
  log_work(s, "cudaMemcpyAsync");
  touch_last(src, n, false);
  touch_last(dst, n, true);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMaxPitch) return last = cudaErrorInvalidValue;  // the only one mirror asks
  *value = static_cast<int>(plan.max_pitch);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                              std::size_t height, cudaMemcpyKind, cudaStream_t s) {
  {
    std::lock_guard g(lock);
    log_work(s, "cudaMemcpy2DAsync");
    if (height > 0) {
      touch_last(src, spitch * (height - 1) + width, false);
      touch_last(dst, dpitch * (height - 1) + width, true);
    }
  }
  if (width > dpitch || width > spitch) return last = cudaErrorInvalidPitchValue;
  if (dpitch > plan.max_pitch || spitch > plan.max_pitch) {
    violation("cudaMemcpy2DAsync with a pitch above cudaDevAttrMaxPitch");
    return last = cudaErrorInvalidPitchValue;
  }
  for (std::size_t row = 0; row < height; ++row) {
    std::memcpy(static_cast<char*>(dst) + row * dpitch, static_cast<const char*>(src) + row * spitch, width);
  }
  return cudaSuccess;
}
cudaError_t cudaMemset2DAsync(void* p, std::size_t pitch, int value, std::size_t width, std::size_t height,
                              cudaStream_t s) {
  {
    std::lock_guard g(lock);
    log_work(s, "cudaMemset2DAsync");
    if (height > 0) touch_last(p, pitch * (height - 1) + width, true);
  }
  if (width > pitch) return last = cudaErrorInvalidPitchValue;
  if (pitch > plan.max_pitch) {
    violation("cudaMemset2DAsync with a pitch above cudaDevAttrMaxPitch");
    return last = cudaErrorInvalidPitchValue;
  }
  for (std::size_t row = 0; row < height; ++row) std::memset(static_cast<char*>(p) + row * pitch, value, width);
  return cudaSuccess;
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, std::size_t n, cudaStream_t s) {
  std::memcpy(dst, src, n);
  std::lock_guard g(lock);
  log_work(s, "cudaMemcpyPeerAsync");
  touch_last(src, n, false);
  touch_last(dst, n, true);
  ++seen.peer_copies;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  std::lock_guard g(lock);
  if (collective_done(e->waits_for)) {
    if (e->recorded_on != nullptr) complete_through(e->recorded_on, e->recorded_after);
    return cudaSuccess;
  }
  ++seen.not_ready_queries;
  return last = cudaErrorNotReady;  // the runtime leaves it as the thread's last error
}

// kernels.hpp's launchers, as a launch check sees them: the thread's last error, whatever left
// it; then CUDA's rules for a launch (the stream's device current, the memory reachable from it);
// then the arithmetic, for the element types the tests use.
namespace {

// cudaSuccess, or why this launch on `s` would fail on a GPU. A launch that would run is logged
// with its accesses: it reads `in` and writes `out` (n elements of `bytes` each; a buffer both
// read and written is in `out`, whose writes conflict with any access).
cudaError_t launch_error(cudaStream_t s, std::span<const void* const> in, std::span<void* const> out, std::size_t n,
                         std::size_t bytes) {
  const cudaError_t stale = last;
  last = cudaSuccess;
  if (stale != cudaSuccess) return stale;
  if (s != nullptr && s->rank < 0 && s->device != device) {
    violation("a kernel launched on a stream of device " + std::to_string(s->device) + " while device " +
              std::to_string(device) + " was current");
    return cudaErrorInvalidResourceHandle;
  }
  std::lock_guard g(lock);
  // Memory this device can reach: its own, a peer's with access enabled, or host memory (a test's
  // own buffers).
  auto reachable = [&](const void* p) {
    const auto it = allocation_of(p);
    if (it == allocations.end() || it->second.device == device || peer_enabled[device][it->second.device]) return true;
    seen.violations.push_back("a kernel on device " + std::to_string(device) + " touched device " +
                              std::to_string(it->second.device) + "'s memory without peer access");
    return false;
  };
  for (const void* p : in) {
    if (!reachable(p)) return cudaErrorIllegalAddress;
  }
  for (const void* p : out) {
    if (!reachable(p)) return cudaErrorIllegalAddress;
  }
  ++seen.launches;
  log_work(s, "kernel");
  for (const void* p : in) touch_last(p, n * bytes, false);
  for (void* p : out) touch_last(p, n * bytes, true);
  return cudaSuccess;
}



// As kernels.cu computes: in the arithmetic type, min and max as mirror::detail's, each result
// rounded to the element type.
template <class T>
void combine(mirror::ReduceOp op, T* d, const T* s, std::size_t n) {
  using N = num<T>;
  using A = typename N::A;
  for (std::size_t i = 0; i < n; ++i) {
    const A a = N::load(d[i]), b = N::load(s[i]);
    switch (op) {
      case mirror::ReduceOp::sum:
      case mirror::ReduceOp::mean: d[i] = N::store(static_cast<A>(a + b)); break;
      case mirror::ReduceOp::prod: d[i] = N::store(static_cast<A>(a * b)); break;
      case mirror::ReduceOp::min: d[i] = N::store(mirror::detail::minimum(a, b)); break;
      case mirror::ReduceOp::max: d[i] = N::store(mirror::detail::maximum(a, b)); break;
    }
  }
}

template <class T>
void divide(T* p, std::size_t n, std::size_t count) {
  using N = num<T>;
  using A = typename N::A;
  for (std::size_t i = 0; i < n; ++i) p[i] = N::store(static_cast<A>(N::load(p[i]) / static_cast<A>(count)));
}

// Calls f with a null pointer of the element type of `type`; false for a type the fake lacks.
template <class F>
bool with_element(mirror::detail::element_kind type, F&& f) {
  using mirror::cuda::kind_code;
  switch (type.code()) {
    case kind_code<float>: f(static_cast<float*>(nullptr)); return true;
    case kind_code<double>: f(static_cast<double*>(nullptr)); return true;
    case kind_code<mirror::cuda::half>: f(static_cast<mirror::cuda::half*>(nullptr)); return true;
    case kind_code<mirror::cuda::bfloat16>: f(static_cast<mirror::cuda::bfloat16*>(nullptr)); return true;
    case kind_code<std::int32_t>: f(static_cast<std::int32_t*>(nullptr)); return true;
    case kind_code<std::int64_t>: f(static_cast<std::int64_t*>(nullptr)); return true;
  }
  return false;
}

// launch_fold_into_all as its contract says: combine from part 0 in order, divide for mean, write
// every part (elementwise, so a part may be any replica's buffer).
template <class T>
void fold(mirror::ReduceOp op, void* const* parts, int count, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    T acc = static_cast<T*>(parts[0])[i];
    for (int r = 1; r < count; ++r) combine(op, &acc, static_cast<const T*>(parts[r]) + i, 1);
    if (op == mirror::ReduceOp::mean) divide(&acc, 1, static_cast<std::size_t>(count));
    for (int r = 0; r < count; ++r) static_cast<T*>(parts[r])[i] = acc;
  }
}

}  // namespace

namespace mirror::cuda::impl {
int launch_divide(void* stream, detail::element_kind type, void* p, std::size_t n, std::size_t count) noexcept {
  void* const out[] = {p};
  if (const cudaError_t e = launch_error(static_cast<cudaStream_t>(stream), {}, out, n, type.bytes)) {
    return static_cast<int>(e);
  }
  const bool known = with_element(type, [&]<class T>(T*) { divide(static_cast<T*>(p), n, count); });
  return known ? 0 : static_cast<int>(cudaErrorNotSupported);
}
int launch_combine(void* stream, ReduceOp op, detail::element_kind type, void* dst, const void* src, std::size_t n) noexcept {
  const void* const in[] = {src};
  void* const out[] = {dst};
  if (const cudaError_t e = launch_error(static_cast<cudaStream_t>(stream), in, out, n, type.bytes)) {
    return static_cast<int>(e);
  }
  const bool known =
      with_element(type, [&]<class T>(T*) { combine(op, static_cast<T*>(dst), static_cast<const T*>(src), n); });
  return known ? 0 : static_cast<int>(cudaErrorNotSupported);
}

int launch_fold_into_all(void* stream, ReduceOp op, detail::element_kind type, void* const* parts, int count,
                         std::size_t n) noexcept {
  if (count < 1 || count > max_fold_parts) return cudaErrorInvalidValue;
  const std::span<void* const> all(parts, static_cast<std::size_t>(count));  // each read and written
  if (const cudaError_t e = launch_error(static_cast<cudaStream_t>(stream), {}, all, n, type.bytes)) {
    return static_cast<int>(e);
  }
  {
    std::lock_guard g(lock);
    ++seen.folds;
  }
  const bool known = with_element(type, [&]<class T>(T*) { fold<T>(op, parts, count, n); });
  return known ? 0 : static_cast<int>(cudaErrorNotSupported);
}
}  // namespace mirror::cuda::impl

// ---- NCCL ----

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInProgress: return "in progress";
    case ncclSystemError: return "fake system error";
    case ncclInvalidArgument: return "fake invalid argument";
    default: return "fake NCCL error";
  }
}
ncclResult_t ncclGetVersion(int* v) {
  *v = plan.version;
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::lock_guard g(lock);
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "world-%llu", static_cast<unsigned long long>(++next_id));
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  ++depth;
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (depth == 0) violation("ncclCommInitRankConfig outside a group (several ranks on one thread need one)");
  if (config == nullptr || config->blocking != 0) violation("a blocking communicator");
  std::lock_guard g(lock);
  auto& w = worlds[id.internal];
  if (!w) {
    w = std::make_unique<world>();
    w->nranks = nranks;
    w->launched.assign(static_cast<std::size_t>(nranks), 0);
    w->device.assign(static_cast<std::size_t>(nranks), -1);
  }
  auto c = std::make_unique<ncclComm>();
  c->w = w.get();
  c->rank = rank;
  c->device = device;
  c->init_polls = plan.init_polls;
  c->error = static_cast<ncclResult_t>(rank == plan.fail_init_rank ? ncclSystemError : plan.init_async);
  ++w->joined;
  w->device[static_cast<std::size_t>(rank)] = device;
  *comm = c.get();
  all_comms.push_back(std::move(c));
  return ncclInProgress;
}
namespace {
// What every collective call does here: the rules, the count, a scripted failure, and the call
// queued on the thread's group. A communicator works on its own device's memory and streams:
// NCCL does not check a buffer's device (unless NCCL_CHECK_POINTERS=1) and would work on another
// GPU's memory through peer access, so either is a violation.
ncclResult_t queue(const queued& q, int& counter) {
  const inside in(q.comm, name_of(q.what));
  if (depth == 0) violation(std::string(name_of(q.what)) + " outside a group");
  if (!q.comm->initialized) violation(std::string(name_of(q.what)) + " before the communicator's init completed");
  const int d = q.comm->device;
  if (q.stream != nullptr && q.stream->rank < 0 && q.stream->device != d) {
    violation(std::string(name_of(q.what)) + " on a stream of device " + std::to_string(q.stream->device) +
              " for a communicator of device " + std::to_string(d));
  }
  int call = 0;
  {
    std::lock_guard g(lock);
    for (const void* p : {q.send, static_cast<const void*>(q.recv)}) {
      const auto it = allocation_of(p);
      if (it != allocations.end() && it->second.device != d) {
        seen.violations.push_back(std::string(name_of(q.what)) + " with a buffer of device " +
                                  std::to_string(it->second.device) + " on a communicator of device " +
                                  std::to_string(d));
      }
    }
    call = ++counter;
  }
  if (q.what == kind::all_reduce && call == plan.fail_all_reduce_call) return group_error = ncclInvalidArgument;
  group_ops.push_back(q);
  return ncclSuccess;
}

std::size_t element_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclFloat64:
    case ncclInt64:
    case ncclUint64: return 8;
    case ncclInt8:
    case ncclUint8: return 1;
    default: return 4;
  }
}

// One communicator's calls of a group, launched: its rank's part of the collective, run once
// every rank has launched its part. (lock held)
void launch(ncclComm* c, const std::vector<queued>& ops) {
  world& w = *c->w;
  const std::uint64_t seq = ++w.launched[static_cast<std::size_t>(c->rank)];
  auto& per_rank = w.data[seq];
  per_rank.resize(static_cast<std::size_t>(w.nranks));
  per_rank[static_cast<std::size_t>(c->rank)] = ops;
  stream_last[ops[0].stream] = {&w, seq, c->rank};
  c->last = {&w, seq, c->rank};
  // NCCL runs a communicator's calls in the order they reach the GPU: a call on another stream
  // than the one before must come after it by stream order (events), or the GPU may run them
  // in another order on each rank.
  const std::size_t first = work_log.size();
  for (const queued& q : ops) {
    log_work(q.stream, name_of(q.what));
    const std::size_t n = w.nranks;
    const std::size_t in = q.what == kind::reduce_scatter ? q.count * n : q.count;
    const std::size_t out = q.what == kind::all_gather ? q.count * n : q.count;
    const std::size_t b = element_bytes(q.type);
    if (q.what != kind::broadcast || q.root == c->rank) touch_last(q.send, in * b, false);
    touch_last(q.recv, out * b, true);
  }
  if (c->last_work != static_cast<std::size_t>(-1) && !ordered(c->last_work, first)) {
    seen.violations.push_back(std::string(name_of(ops[0].what)) + " on a stream not ordered after the " +
                              "communicator's previous call (NCCL needs its calls in one order on every rank)");
  }
  c->last_work = work_log.size() - 1;
  ++seen.groups_launched;
  bool all = true;
  for (const std::uint64_t n : w.launched) all = all && n >= seq;
  if (all) {
    run_group(per_rank);
    w.data.erase(seq);
  }
  if (plan.group_end == ncclInProgress) c->enqueuing = seq;
  else if (plan.enqueue_async != ncclSuccess) c->error = static_cast<ncclResult_t>(plan.enqueue_async);
}
}  // namespace

ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return queue({kind::all_reduce, comm, send, recv, count, type, op, 0, stream}, seen.all_reduce_calls);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return queue({kind::reduce_scatter, comm, send, recv, recvcount, type, op, 0, stream}, seen.reduce_scatter_calls);
}
ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return queue({kind::all_gather, comm, send, recv, sendcount, type, ncclSum, 0, stream}, seen.all_gather_calls);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return queue({kind::broadcast, comm, send, recv, count, type, ncclSum, root, stream}, seen.broadcast_calls);
}
ncclResult_t ncclGroupEnd() {
  if (depth == 0) {
    violation("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--depth > 0) return ncclSuccess;
  std::vector<queued> ops;
  ops.swap(group_ops);
  if (group_error != ncclSuccess) {  // NCCL discards a group in which a call failed
    const ncclResult_t e = group_error;
    group_error = ncclSuccess;
    return e;
  }
  if (ops.empty()) return ncclInProgress;  // communicator creation
  // A group may span several communicators (one thread driving several ranks): each launches its
  // own calls, in the order they were made.
  std::vector<std::pair<ncclComm*, std::vector<queued>>> by_comm;
  for (const queued& q : ops) {
    auto it = std::find_if(by_comm.begin(), by_comm.end(), [&](const auto& e) { return e.first == q.comm; });
    if (it == by_comm.end()) it = by_comm.insert(by_comm.end(), {q.comm, {}});
    it->second.push_back(q);
  }
  std::vector<std::unique_ptr<inside>> in;
  for (const auto& e : by_comm) in.push_back(std::make_unique<inside>(e.first, "ncclGroupEnd"));
  std::lock_guard g(lock);
  for (const auto& [c, calls] : by_comm) launch(c, calls);
  return static_cast<ncclResult_t>(plan.group_end);
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  const inside in(comm, "ncclCommGetAsyncError");
  std::lock_guard g(lock);
  if (!comm->initialized) {
    // Init completes once every rank joined (those of other processes count as joined), after
    // the scripted polls; a rank scripted to fail fails, and the others wait for it for ever.
    world& w = *comm->w;
    const bool joined = w.joined + plan.ranks_elsewhere >= w.nranks;
    const bool failing = plan.fail_init_rank >= 0 && plan.fail_init_rank < w.nranks;
    if (!joined || comm->init_polls > 0 || (failing && comm->rank != plan.fail_init_rank)) {
      if (joined && comm->init_polls > 0) --comm->init_polls;
      *state = ncclInProgress;
      return ncclSuccess;
    }
    comm->initialized = true;
    const char* shared = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    const bool duplicates_allowed = plan.version >= 23000 && shared != nullptr && std::string(shared) == "1";
    for (int r = 0; r < w.nranks && !duplicates_allowed; ++r) {
      if (r != comm->rank && w.device[static_cast<std::size_t>(r)] == comm->device && comm->error == ncclSuccess) {
        comm->error = ncclInvalidUsage;  // NCCL: "Duplicate GPU detected"
      }
    }
  }
  if (comm->finalizing) {
    const bool drained = collective_done(comm->last);
    if (plan.finalize_hangs || !drained || comm->finalize_left > 0) {
      if (drained && comm->finalize_left > 0) --comm->finalize_left;
      *state = ncclInProgress;
      return ncclSuccess;
    }
    *state = ncclSuccess;
    return ncclSuccess;
  }
  if (comm->enqueuing != 0) {
    bool all = true;
    for (const std::uint64_t n : comm->w->launched) all = all && n >= comm->enqueuing;
    if (!all) {
      *state = ncclInProgress;
      return ncclSuccess;
    }
    comm->enqueuing = 0;
    if (plan.enqueue_async != ncclSuccess) comm->error = static_cast<ncclResult_t>(plan.enqueue_async);
  }
  *state = comm->error;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm->in_use.load() != 0) violation("ncclCommAbort while another thread is inside an NCCL call on the communicator");
  if (comm->aborted.exchange(true)) violation("ncclCommAbort twice");
  std::lock_guard g(lock);
  ++seen.aborts;
  return ncclSuccess;
}
// Non-blocking finalize (NCCL's documentation): it returns ncclInProgress, completes once the
// communicator's outstanding collectives have, and ncclCommGetAsyncError says when; destroy is
// allowed only after that (without a finalize, destroy finalizes itself).
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  const inside in(comm, "ncclCommFinalize");
  std::lock_guard g(lock);
  if (comm->finalizing) violation("ncclCommFinalize twice");
  comm->finalizing = true;
  comm->finalize_left = plan.finalize_polls;
  const bool done = !plan.finalize_hangs && plan.finalize_polls == 0 && collective_done(comm->last);
  return done ? ncclSuccess : ncclInProgress;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  {
    const inside in(comm, "ncclCommDestroy");
  }
  {
    std::lock_guard g(lock);
    if (comm->finalizing && (plan.finalize_hangs || comm->finalize_left > 0 || !collective_done(comm->last))) {
      // NCCL frees a communicator only once its finalize has completed; one still in progress
      // must be aborted instead.
      seen.violations.push_back("ncclCommDestroy of a communicator whose ncclCommFinalize is still in progress");
      return ncclInProgress;
    }
  }
  comm->destroyed = true;
  std::lock_guard g(lock);
  ++seen.destroys;
  return ncclSuccess;
}
