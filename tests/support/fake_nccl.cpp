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
// every ncclRedOp_t mirror uses, on float, double and 32- and 64-bit integers.
#include "support/fake_nccl.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <span>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <mirror/backends/cuda/kernels.hpp>

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
struct edge {
  const void* from;
  std::size_t from_count;
  const void* to;
  std::size_t to_from;
};
std::vector<logged> work_log;
std::vector<edge> edges;
std::map<const void*, std::size_t> stream_length;

void log_work(const void* stream, std::string what) {  // (lock held)
  work_log.push_back({{stream, std::move(what)}, stream_length[stream]++});
}
void log_locked(const void* stream, std::string what) {
  std::lock_guard g(lock);
  log_work(stream, std::move(what));
}

// fake_nccl::happens_before, with the lock held.
bool ordered(std::size_t a, std::size_t b) {  // (lock held)
  if (a >= work_log.size() || b >= work_log.size() || a == b) return false;
  // reach[s]: how many of stream s's entries precede b, b's own stream counting b itself; an
  // edge into stream u at entry m carries its source's first entries along once m is reached.
  const void* const target = work_log[b].entry.stream;
  std::map<const void*, std::size_t> reach{{target, work_log[b].position + 1}};
  for (bool grew = true; grew;) {
    grew = false;
    for (const edge& e : edges) {
      const auto it = reach.find(e.to);
      if (it == reach.end() || e.to_from >= it->second) continue;
      std::size_t& r = reach[e.from];
      if (e.from_count > r) {
        r = e.from_count;
        grew = true;
      }
    }
  }
  const logged& x = work_log[a];
  const auto it = reach.find(x.entry.stream);
  if (it == reach.end()) return false;
  return x.entry.stream == target ? x.position < work_log[b].position : x.position < it->second;
}

struct allocation {
  std::size_t bytes;
  int device;
};
std::map<const char*, allocation> allocations;  // device memory, by base address
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

template <class T>
T reduce_two(ncclRedOp_t op, T a, T b) {
  switch (op) {
    case ncclProd: return static_cast<T>(a * b);
    case ncclMin: return b < a ? b : a;
    case ncclMax: return a < b ? b : a;
    default: return static_cast<T>(a + b);  // ncclSum, ncclAvg (divided at the end)
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
  switch (q0.what) {
    case kind::all_reduce:
    case kind::reduce_scatter: {
      std::vector<T> acc = inputs[0];
      for (std::size_t r = 1; r < n_ranks; ++r) {
        for (std::size_t i = 0; i < in_count; ++i) acc[i] = reduce_two(q0.op, acc[i], inputs[r][i]);
      }
      if (q0.op == ncclAvg) {
        for (T& a : acc) a = static_cast<T>(a / static_cast<T>(n_ranks));
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
  edges.clear();
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
cudaError_t cudaDeviceCanAccessPeer(int* can, int, int) {
  *can = plan.can_access_peer ? 1 : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int) {
  if (plan.enable_peer_error != 0) return last = static_cast<cudaError_t>(plan.enable_peer_error);
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
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  std::lock_guard g(lock);
  if (e->recorded_on != nullptr && e->recorded_on != s) {
    edges.push_back({e->recorded_on, e->recorded_after, s, stream_length[s]});
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
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
  delete[] it->first;
  allocations.erase(it);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::lock_guard g(lock);
  *a = {};
  a->type = cudaMemoryTypeUnregistered;
  a->device = -2;
  auto it = allocations.upper_bound(static_cast<const char*>(p));
  if (it != allocations.begin()) {
    --it;
    if (static_cast<const char*>(p) < it->first + it->second.bytes) {
      a->type = cudaMemoryTypeDevice;
      a->device = it->second.device;
    }
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind) {
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind, cudaStream_t s) {
  std::memcpy(dst, src, n);
  log_locked(s, "cudaMemcpyAsync");
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMaxPitch) return last = cudaErrorInvalidValue;  // the only one mirror asks
  *value = static_cast<int>(plan.max_pitch);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                              std::size_t height, cudaMemcpyKind, cudaStream_t s) {
  log_locked(s, "cudaMemcpy2DAsync");
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
  log_locked(s, "cudaMemset2DAsync");
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
  ++seen.peer_copies;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  std::lock_guard g(lock);
  if (collective_done(e->waits_for)) return cudaSuccess;
  ++seen.not_ready_queries;
  return last = cudaErrorNotReady;  // the runtime leaves it as the thread's last error
}

// kernels.hpp's launchers, as a launch check sees them: the thread's last error, whatever left
// it; then CUDA's rules for a launch (the stream's device current, the memory reachable from it);
// then the arithmetic, for the element types the tests use.
namespace {

// cudaSuccess, or why this launch on `s` touching `ptrs` would fail on a GPU.
cudaError_t launch_error(cudaStream_t s, std::span<const void* const> ptrs) {
  const cudaError_t stale = last;
  last = cudaSuccess;
  if (stale != cudaSuccess) return stale;
  if (s != nullptr && s->rank < 0 && s->device != device) {
    violation("a kernel launched on a stream of device " + std::to_string(s->device) + " while device " +
              std::to_string(device) + " was current");
    return cudaErrorInvalidResourceHandle;
  }
  std::lock_guard g(lock);
  for (const void* p : ptrs) {
    auto it = allocations.upper_bound(static_cast<const char*>(p));
    if (it == allocations.begin()) continue;  // not device memory (a test's own host buffers)
    --it;
    if (static_cast<const char*>(p) >= it->first + it->second.bytes) continue;
    const int d = it->second.device;
    if (d != device && !peer_enabled[device][d]) {
      seen.violations.push_back("a kernel on device " + std::to_string(device) + " touched device " +
                                std::to_string(d) + "'s memory without peer access");
      return cudaErrorIllegalAddress;
    }
  }
  ++seen.launches;
  log_work(s, "kernel");
  return cudaSuccess;
}

template <class T>
void combine(mirror::ReduceOp op, T* d, const T* s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    switch (op) {
      case mirror::ReduceOp::sum:
      case mirror::ReduceOp::mean: d[i] = static_cast<T>(d[i] + s[i]); break;
      case mirror::ReduceOp::prod: d[i] = static_cast<T>(d[i] * s[i]); break;
      case mirror::ReduceOp::min: d[i] = s[i] < d[i] ? s[i] : d[i]; break;
      case mirror::ReduceOp::max: d[i] = d[i] < s[i] ? s[i] : d[i]; break;
    }
  }
}

template <class T>
void divide(T* p, std::size_t n, std::size_t count) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(count));
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
  const void* const touched[] = {p};
  if (const cudaError_t e = launch_error(static_cast<cudaStream_t>(stream), touched)) return static_cast<int>(e);
  switch (type.code()) {
    case kind_code<float>: divide(static_cast<float*>(p), n, count); break;
    case kind_code<double>: divide(static_cast<double*>(p), n, count); break;
    case kind_code<std::int32_t>: divide(static_cast<std::int32_t*>(p), n, count); break;
    case kind_code<std::int64_t>: divide(static_cast<std::int64_t*>(p), n, count); break;
    default: return cudaErrorNotSupported;
  }
  return 0;
}
int launch_combine(void* stream, ReduceOp op, detail::element_kind type, void* dst, const void* src, std::size_t n) noexcept {
  const void* const touched[] = {dst, src};
  if (const cudaError_t e = launch_error(static_cast<cudaStream_t>(stream), touched)) return static_cast<int>(e);
  switch (type.code()) {
    case kind_code<float>: combine(op, static_cast<float*>(dst), static_cast<const float*>(src), n); break;
    case kind_code<double>: combine(op, static_cast<double*>(dst), static_cast<const double*>(src), n); break;
    case kind_code<std::int32_t>:
      combine(op, static_cast<std::int32_t*>(dst), static_cast<const std::int32_t*>(src), n);
      break;
    case kind_code<std::int64_t>:
      combine(op, static_cast<std::int64_t*>(dst), static_cast<const std::int64_t*>(src), n);
      break;
    default: return cudaErrorNotSupported;
  }
  return 0;
}

int launch_fold_into_all(void* stream, ReduceOp op, detail::element_kind type, void* const* parts, int count,
                         std::size_t n) noexcept {
  if (count < 1 || count > max_fold_parts) return cudaErrorInvalidValue;
  if (const cudaError_t e = launch_error(static_cast<cudaStream_t>(stream),
                                         std::span<const void* const>(const_cast<const void* const*>(parts),
                                                                      static_cast<std::size_t>(count)))) {
    return static_cast<int>(e);
  }
  {
    std::lock_guard g(lock);
    ++seen.folds;
  }
  switch (type.code()) {
    case kind_code<float>: fold<float>(op, parts, count, n); break;
    case kind_code<double>: fold<double>(op, parts, count, n); break;
    case kind_code<std::int32_t>: fold<std::int32_t>(op, parts, count, n); break;
    case kind_code<std::int64_t>: fold<std::int64_t>(op, parts, count, n); break;
    default: return cudaErrorNotSupported;
  }
  return 0;
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
  *v = 22809;
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
  }
  auto c = std::make_unique<ncclComm>();
  c->w = w.get();
  c->rank = rank;
  c->init_polls = plan.init_polls;
  c->error = static_cast<ncclResult_t>(plan.init_async);
  *comm = c.get();
  all_comms.push_back(std::move(c));
  return ncclInProgress;
}
namespace {
// What every collective call does here: the rules, the count, a scripted failure, and the call
// queued on the thread's group.
ncclResult_t queue(const queued& q, int& counter) {
  const inside in(q.comm, name_of(q.what));
  if (depth == 0) violation(std::string(name_of(q.what)) + " outside a group");
  int call = 0;
  {
    std::lock_guard g(lock);
    call = ++counter;
  }
  if (q.what == kind::all_reduce && call == plan.fail_all_reduce_call) return group_error = ncclInvalidArgument;
  group_ops.push_back(q);
  return ncclSuccess;
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
  ncclComm* c = ops[0].comm;
  const inside in(c, "ncclGroupEnd");
  std::lock_guard g(lock);
  world& w = *c->w;
  const std::uint64_t seq = ++w.launched[static_cast<std::size_t>(c->rank)];
  auto& per_rank = w.data[seq];
  per_rank.resize(static_cast<std::size_t>(w.nranks));
  per_rank[static_cast<std::size_t>(c->rank)] = ops;
  stream_last[ops[0].stream] = {&w, seq, c->rank};
  // NCCL runs a communicator's calls in the order they reach the GPU: a call on another stream
  // than the one before must come after it by stream order (events), or the GPU may run them
  // in another order on each rank.
  const std::size_t first = work_log.size();
  for (const queued& q : ops) log_work(q.stream, name_of(q.what));
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
  return static_cast<ncclResult_t>(plan.group_end);
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  const inside in(comm, "ncclCommGetAsyncError");
  std::lock_guard g(lock);
  if (comm->finalizing && plan.finalize_hangs) {
    *state = ncclInProgress;
    return ncclSuccess;
  }
  if (comm->init_polls > 0) {
    --comm->init_polls;
    *state = ncclInProgress;
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
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  const inside in(comm, "ncclCommFinalize");
  std::lock_guard g(lock);
  comm->finalizing = true;
  return plan.finalize_hangs ? ncclInProgress : ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  {
    const inside in(comm, "ncclCommDestroy");
  }
  if (comm->finalizing && plan.finalize_hangs) {
    // NCCL frees a communicator only once its finalize has completed; one still in progress
    // must be aborted instead.
    violation("ncclCommDestroy of a communicator whose ncclCommFinalize is still in progress");
    return ncclInProgress;
  }
  comm->destroyed = true;
  std::lock_guard g(lock);
  ++seen.destroys;
  return ncclSuccess;
}
