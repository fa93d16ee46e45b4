// SPDX-License-Identifier: Apache-2.0
// The CUDA calls behind backends/cuda/cuda_runtime.hpp: compiled by g++ against the CUDA
// runtime API into libmirror_cuda. Every call is checked; a failure is a mirror::backend_error
// with the cudaError_t, its name and its text.

#include <mirror/backends/cuda/cuda_runtime.hpp>
#include <mirror/backends/cuda/cuda_device.hpp>
#include <mirror/backends/cuda/device_guard.hpp>
#include <mirror/backends/cuda/kernels.hpp>
#include <cuda_runtime_api.h>
#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>
#include <mirror/detail/format.hpp>
#include <mirror/error.hpp>

namespace mirror::cuda {

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

namespace impl {
namespace {

thread_local void* current = nullptr;  // set by bind() on the replica's thread

[[noreturn]] void fail(cudaError_t e, const std::string& what) {
  // The error is reported here, by the exception: a non-sticky one must not also stay behind as
  // the thread's last error, where the next cudaGetLastError() (a kernel launch's check, the
  // caller's own) would report it again as its own failure.
  (void)cudaGetLastError();
  throw backend_error(detail::format("mirror::devices::Cuda: %s failed: %s (%s)", what.c_str(), cudaGetErrorName(e),
                                     cudaGetErrorString(e)),
                      static_cast<long>(e));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(e, what);
}

struct runtime_api {
  static int current() {
    int d = 0;
    check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  static void make_current(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }
  static void restore(int device) noexcept {
    if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
  }
};
// Every entry point below that enqueues work or allocates holds one: the stream or the memory is
// the replica's device's, whichever device the calling thread had current, and the thread gets
// its own device back afterwards.
using device_guard = basic_device_guard<runtime_api>;

struct buffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

}  // namespace

struct replica_state {
  int device = 0;
  cudaStream_t stream = nullptr;
  // The communication stream: NCCL's collectives and their packing copies run here, ordered with
  // `stream` by events (fork_to_comm, mark_comm, join_comm), so the replica's kernels enqueued
  // after a started collective run beside it. Non-blocking: the legacy default stream, where
  // Thrust copies, does not serialise with it.
  cudaStream_t comm = nullptr;
  cudaEvent_t fork = nullptr;             // recorded on `stream` each time `comm` must catch up
  std::vector<cudaEvent_t> free_marks;  // recorded on `comm` by mark_comm, back here after join_comm
  buffer comm_scratch;                  // used by `comm` only: packs and padded reduce-scatters
  cudaEvent_t events[2] = {nullptr, nullptr};  // by parity of the barrier: see before_arrival
  std::size_t calls = 0;                        // exchanges + barriers in this parallel call
  buffer scratch;                               // the ops policy's accumulator
  buffer combine_stage;                         // for combines the device cannot reach directly
  std::vector<buffer> staging;                  // host leaves copied to the device, by attach order
  std::size_t next_staging = 0, attached = 0;
  std::vector<buffer> arguments;                // shared host arguments of run, by slot (kept)
};

struct state {
  std::vector<int> gpus;  // physical devices, in replica order
  int per_gpu = 1;
  std::vector<replica_state> replicas;
  int max_ordinal = 0;
  std::vector<char> peer;  // peer[a * (max_ordinal + 1) + b]: device a's kernels reach b's memory
  std::mutex bind_mutex;
  cudaError_t bind_error = cudaSuccess;
  int bind_replica = -1;

  bool reaches(int from, int to) const noexcept {
    if (from == to) return true;
    if (from < 0 || to < 0 || from > max_ordinal || to > max_ordinal) return false;  // a GPU the strategy does not use
    return peer[static_cast<std::size_t>(from * (max_ordinal + 1) + to)] != 0;
  }
  replica_state& at(int r) { return replicas[static_cast<std::size_t>(r)]; }

  ~state() {
    // Best effort: nothing here may throw, and a broken device must not stop the rest.
    const int previous = current_device();
    for (auto& rep : replicas) {
      if (cudaSetDevice(rep.device) != cudaSuccess) continue;
      if (rep.stream != nullptr) (void)cudaStreamSynchronize(rep.stream);
      if (rep.comm != nullptr) (void)cudaStreamSynchronize(rep.comm);
      (void)cudaFree(rep.scratch.ptr);
      (void)cudaFree(rep.comm_scratch.ptr);
      (void)cudaFree(rep.combine_stage.ptr);
      for (auto& b : rep.staging) (void)cudaFree(b.ptr);
      for (auto& b : rep.arguments) (void)cudaFree(b.ptr);
      for (auto& e : rep.events) {
        if (e != nullptr) (void)cudaEventDestroy(e);
      }
      for (auto& e : rep.free_marks) (void)cudaEventDestroy(e);
      if (rep.fork != nullptr) (void)cudaEventDestroy(rep.fork);
      if (rep.stream != nullptr) (void)cudaStreamDestroy(rep.stream);
      if (rep.comm != nullptr) (void)cudaStreamDestroy(rep.comm);
    }
    restore_device(previous);
    (void)cudaGetLastError();
  }
};

void destroy(state* s) noexcept { delete s; }

namespace {

// Makes b hold at least `bytes` on `device`. The old buffer is freed only once the streams that
// may still read or write it are idle: `user` alone, or (null) every replica's stream.
void grow(buffer& b, std::size_t bytes, int device, state& s, cudaStream_t user) {
  if (bytes <= b.bytes && b.ptr != nullptr) return;
  const device_guard on(device);
  if (b.ptr != nullptr) {
    if (user != nullptr) {
      check(cudaStreamSynchronize(user), "cudaStreamSynchronize before growing a buffer");
    } else {
      for (auto& rep : s.replicas) check(cudaStreamSynchronize(rep.stream), "cudaStreamSynchronize before growing a buffer");
    }
    check(cudaFree(b.ptr), "cudaFree");
    b = {};
  }
  // Round up so that slowly growing leaves do not reallocate every step.
  const std::size_t want = std::max<std::size_t>(256, bytes + bytes / 4);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, want);
  if (e != cudaSuccess) fail(e, detail::format("cudaMalloc of %zu bytes on device %d", want, device).c_str());
  b = {p, want};
}

}  // namespace

state* create_state(std::span<const int> gpus, int replicas_per_gpu) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    const cudaError_t why = e != cudaSuccess ? e : cudaErrorNoDevice;
    (void)cudaGetLastError();
    throw backend_error(detail::format("mirror::devices::Cuda: no usable CUDA device (cudaGetDeviceCount: %s: %s); run "
                                       "on mirror::devices::Threads, or let mirror::cuda::with_available_device choose "
                                       "at run time",
                                       cudaGetErrorName(why), cudaGetErrorString(why)),
                        static_cast<long>(why));
  }
  if (replicas_per_gpu < 1) {
    throw std::invalid_argument(
        detail::format("mirror::devices::Cuda{.replicas_per_gpu = %d}: replicas_per_gpu must be >= 1", replicas_per_gpu)
            .c_str());
  }
  std::unique_ptr<state> s(new state);
  s->per_gpu = replicas_per_gpu;
  if (gpus.empty()) {
    for (int g = 0; g < count; ++g) s->gpus.push_back(g);
  } else {
    for (const int g : gpus) {
      if (g < 0 || g >= count) {
        throw std::invalid_argument(detail::format("mirror::devices::Cuda{.gpus}: GPU %d does not exist; this process "
                                                   "sees %d (ordinals 0..%d, after CUDA_VISIBLE_DEVICES)",
                                                   g, count, count - 1)
                                        .c_str());
      }
      if (std::find(s->gpus.begin(), s->gpus.end(), g) != s->gpus.end()) {
        throw std::invalid_argument(detail::format("mirror::devices::Cuda{.gpus}: GPU %d is listed twice; list each GPU "
                                                   "once and set .replicas_per_gpu for several replicas on one GPU",
                                                   g)
                                        .c_str());
      }
      s->gpus.push_back(g);
    }
  }
  s->max_ordinal = *std::max_element(s->gpus.begin(), s->gpus.end());
  const std::size_t side = static_cast<std::size_t>(s->max_ordinal + 1);
  s->peer.assign(side * side, 0);
  s->replicas.resize(s->gpus.size() * static_cast<std::size_t>(replicas_per_gpu));
  for (std::size_t r = 0; r < s->replicas.size(); ++r) {
    replica_state& rep = s->replicas[r];
    rep.device = s->gpus[r / static_cast<std::size_t>(replicas_per_gpu)];
    const device_guard on(rep.device);
    // A blocking stream (not cudaStreamNonBlocking): it orders with the legacy default stream,
    // where Thrust's device_vector copies run, so they see the replica's earlier kernels.
    check(cudaStreamCreate(&rep.stream), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&rep.comm, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaEventCreateWithFlags(&rep.fork, cudaEventDisableTiming), "cudaEventCreate");
    for (auto& ev : rep.events) check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  }
  // Peer access where the hardware allows it: kernels then read and write other GPUs' memory
  // directly. Elsewhere combine() stages through its own device, and cudaMemcpyPeerAsync is
  // staged by the driver through host memory.
  for (const int a : s->gpus) {
    for (const int b : s->gpus) {
      if (a == b) continue;
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, a, b), "cudaDeviceCanAccessPeer");
      if (can == 0) continue;
      const device_guard on(a);
      const cudaError_t pe = cudaDeviceEnablePeerAccess(b, 0);
      // Any other failure (cudaErrorTooManyPeers on a 16-GPU node, a link the driver refuses) is
      // not fatal: this pair copies through host memory, as pairs without peer access do.
      if (pe != cudaSuccess) (void)cudaGetLastError();
      if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) continue;
      s->peer[static_cast<std::size_t>(a) * side + static_cast<std::size_t>(b)] = 1;
    }
  }
  return s.release();
}

int num_replicas(const state& s) noexcept { return static_cast<int>(s.replicas.size()); }
int device_of(const state& s, int r) noexcept { return s.replicas[static_cast<std::size_t>(r)].device; }
int replicas_per_gpu(const state& s) noexcept { return s.per_gpu; }
std::span<const int> gpus(const state& s) noexcept { return s.gpus; }
void* stream_of(const state& s, int r) noexcept { return s.replicas[static_cast<std::size_t>(r)].stream; }
void* comm_stream_of(const state& s, int r) noexcept { return s.replicas[static_cast<std::size_t>(r)].comm; }

int current_device() noexcept {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return d;
}

void restore_device(int device) noexcept {
  if (device >= 0) runtime_api::restore(device);
}

void unbind() noexcept { current = nullptr; }

bool bind(state& s, int r) noexcept {
  const cudaError_t e = cudaSetDevice(s.at(r).device);
  current = s.at(r).stream;
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  current = nullptr;
  std::lock_guard lock(s.bind_mutex);
  if (s.bind_replica < 0) {
    s.bind_error = e;
    s.bind_replica = r;
  }
  return false;
}

void throw_bind_error(state& s) {
  cudaError_t e;
  int r;
  {
    std::lock_guard lock(s.bind_mutex);
    e = s.bind_error;
    r = s.bind_replica;
    s.bind_error = cudaSuccess;
    s.bind_replica = -1;
  }
  fail(e, detail::format("cudaSetDevice for replica %d", r).c_str());
}

void begin_parallel(state& s) noexcept {
  for (auto& rep : s.replicas) {
    rep.calls = 0;
    rep.next_staging = 0;
    rep.attached = 0;
  }
}

// The event of call k is events[k % 2]: a replica records events[p] again only two barriers
// later, and the second of those cannot open before every other replica has waited on it.
void before_arrival(state& s, int self) {
  replica_state& me = s.at(self);
  check(cudaEventRecord(me.events[me.calls & 1u], me.stream), "cudaEventRecord");
  ++me.calls;
}

void after_arrival(state& s, int self) {
  replica_state& me = s.at(self);
  const std::size_t parity = (me.calls - 1) & 1u;
  for (int r = 0; r < num_replicas(s); ++r) {
    if (r == self) continue;
    check(cudaStreamWaitEvent(me.stream, s.at(r).events[parity], 0), "cudaStreamWaitEvent");
  }
}

located attach(state& s, int self, void* host, std::size_t bytes) {
  replica_state& me = s.at(self);
  if (bytes == 0) return {host, me.device};
  const device_guard on(me.device);
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, host), "cudaPointerGetAttributes");
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
    return {host, attributes.device};  // a device leaf: reduced in place
  }
  if (me.next_staging == me.staging.size()) me.staging.emplace_back();
  buffer& b = me.staging[me.next_staging++];
  grow(b, bytes, me.device, s, me.stream);
  ++me.attached;
  check(cudaMemcpyAsync(b.ptr, host, bytes, cudaMemcpyHostToDevice, me.stream), "cudaMemcpyAsync to the device");
  return {b.ptr, me.device};
}

void detach(state& s, int self, located dev, void* host, std::size_t bytes, bool copy_back) {
  replica_state& me = s.at(self);
  if (bytes == 0 || dev.ptr == host) return;
  const device_guard on(me.device);
  // (Not copy_back: a read-only staged input, released without a copy.)
  if (copy_back) {
    check(cudaMemcpyAsync(host, dev.ptr, bytes, cudaMemcpyDeviceToHost, me.stream), "cudaMemcpyAsync to the host");
  }
  if (--me.attached == 0) {
    me.next_staging = 0;
    // The host reads its leaves as soon as the collective returns.
    check(cudaStreamSynchronize(me.stream), "cudaStreamSynchronize");
  }
}

located stage_argument(state& s, int self, std::size_t slot, const void* host, std::size_t bytes) {
  replica_state& me = s.at(self);
  if (me.arguments.size() <= slot) me.arguments.resize(slot + 1);
  if (bytes == 0) return {nullptr, me.device};
  const device_guard on(me.device);
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, host), "cudaPointerGetAttributes");
  const bool on_device = attributes.type == cudaMemoryTypeDevice;
  if (attributes.type == cudaMemoryTypeManaged || (on_device && s.reaches(me.device, attributes.device))) {
    // A std::span over managed memory, or over device memory this replica's GPU can read (its
    // own, or a peer's with access enabled): viewed in place (a host-to-device copy from it
    // would be undefined).
    return {const_cast<void*>(host), attributes.device};
  }
  buffer& b = me.arguments[slot];
  grow(b, bytes, me.device, s, me.stream);  // only this replica's stream reads it
  if (on_device) {
    // Another GPU's memory this one cannot address: copied over, like a host array.
    check(cudaMemcpyPeerAsync(b.ptr, me.device, host, attributes.device, bytes, me.stream),
          "cudaMemcpyPeerAsync of a device argument of run to the replica's GPU");
  } else {
    check(cudaMemcpyAsync(b.ptr, host, bytes, cudaMemcpyHostToDevice, me.stream),
          "cudaMemcpyAsync of a host argument of run to the device");
  }
  // Wait for the copy, so the program may change or free the source once run returns: from
  // pinned memory (and from pageable memory where the device reads it directly, HMM/ATS) the
  // copy is asynchronous, and CUDA documents the pageable case only as "might be synchronous".
  check(cudaStreamSynchronize(me.stream), "cudaStreamSynchronize after an argument of run");
  return {b.ptr, me.device};
}

located scratch(state& s, int self, std::size_t bytes) {
  replica_state& me = s.at(self);
  grow(me.scratch, bytes, me.device, s, nullptr);  // other replicas use it: all streams must be idle
  return {me.scratch.ptr, me.device};
}

void copy(state& s, int self, located dst, located src, std::size_t bytes, bool on_comm) {
  replica_state& me = s.at(self);
  const device_guard on(me.device);
  cudaStream_t const lane = on_comm ? me.comm : me.stream;
  if (dst.device == src.device) {
    check(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, lane), "cudaMemcpyAsync");
  } else {
    check(cudaMemcpyPeerAsync(dst.ptr, dst.device, src.ptr, src.device, bytes, lane), "cudaMemcpyPeerAsync");
  }
}

located comm_scratch(state& s, int self, std::size_t bytes) {
  replica_state& me = s.at(self);
  grow(me.comm_scratch, bytes, me.device, s, me.comm);
  return {me.comm_scratch.ptr, me.device};
}

void fork_to_comm(state& s, int self) {
  replica_state& me = s.at(self);
  const device_guard on(me.device);
  check(cudaEventRecord(me.fork, me.stream), "cudaEventRecord on the replica's stream");
  check(cudaStreamWaitEvent(me.comm, me.fork, 0), "cudaStreamWaitEvent of the communication stream");
}

void* mark_comm(state& s, int self) {
  replica_state& me = s.at(self);
  const device_guard on(me.device);
  cudaEvent_t e = nullptr;
  if (me.free_marks.empty()) {
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  } else {
    e = me.free_marks.back();
    me.free_marks.pop_back();
  }
  const cudaError_t r = cudaEventRecord(e, me.comm);
  if (r != cudaSuccess) {
    me.free_marks.push_back(e);
    fail(r, "cudaEventRecord on the communication stream");
  }
  return e;
}

void join_comm(state& s, int self, void* mark) {
  replica_state& me = s.at(self);
  const auto e = static_cast<cudaEvent_t>(mark);
  me.free_marks.push_back(e);  // (a later record replaces what the wait below has already taken)
  const device_guard on(me.device);
  check(cudaStreamWaitEvent(me.stream, e, 0), "cudaStreamWaitEvent of the replica's stream");
}

void combine(state& s, int self, ReduceOp op, detail::element_kind type, located dst, located src, std::size_t n,
             std::size_t element_bytes) {
  if (n == 0) return;
  replica_state& me = s.at(self);
  const device_guard on(me.device);  // the kernel goes on me.stream: its device must be current
  if (s.reaches(me.device, dst.device) && s.reaches(me.device, src.device)) {
    const int e = launch_combine(me.stream, op, type, dst.ptr, src.ptr, n);
    if (e != 0) fail(static_cast<cudaError_t>(e), "the combine kernel launch");
    return;
  }
  // No peer access: bring both operands to this replica's device, combine, send the result back.
  const std::size_t bytes = n * element_bytes;
  grow(me.combine_stage, 2 * bytes, me.device, s, me.stream);
  const located a{me.combine_stage.ptr, me.device};
  const located b{static_cast<char*>(me.combine_stage.ptr) + bytes, me.device};
  copy(s, self, a, dst, bytes);
  copy(s, self, b, src, bytes);
  const int e = launch_combine(me.stream, op, type, a.ptr, b.ptr, n);
  if (e != 0) fail(static_cast<cudaError_t>(e), "the combine kernel launch");
  copy(s, self, dst, a, bytes);
}

void divide(state& s, int self, detail::element_kind type, located p, std::size_t n, std::size_t count,
            std::size_t element_bytes) {
  if (n == 0) return;
  replica_state& me = s.at(self);
  const device_guard on(me.device);
  if (s.reaches(me.device, p.device)) {
    const int e = launch_divide(me.stream, type, p.ptr, n, count);
    if (e != 0) fail(static_cast<cudaError_t>(e), "the divide kernel launch");
    return;
  }
  const std::size_t bytes = n * element_bytes;
  grow(me.combine_stage, bytes, me.device, s, me.stream);
  const located a{me.combine_stage.ptr, me.device};
  copy(s, self, a, p, bytes);
  const int e = launch_divide(me.stream, type, a.ptr, n, count);
  if (e != 0) fail(static_cast<cudaError_t>(e), "the divide kernel launch");
  copy(s, self, p, a, bytes);
}

bool fold_into_all(state& s, int self, ReduceOp op, detail::element_kind type, const located* parts, int count,
                   std::size_t n) {
  replica_state& me = s.at(self);
  for (int r = 0; r < count; ++r) {
    if (!s.reaches(me.device, parts[r].device)) return false;
  }
  if (n == 0) return true;
  const device_guard on(me.device);  // the kernel goes on me.stream: its device must be current
  void* ptrs[max_fold_parts];
  for (int r = 0; r < count; ++r) ptrs[r] = parts[r].ptr;
  const int e = launch_fold_into_all(me.stream, op, type, ptrs, count, n);
  if (e != 0) fail(static_cast<cudaError_t>(e), "the fold kernel launch");
  return true;
}

void synchronize(state& s, int r) {
  const device_guard on(s.at(r).device);
  check(cudaStreamSynchronize(s.at(r).comm), "cudaStreamSynchronize of the communication stream");
  check(cudaStreamSynchronize(s.at(r).stream), "cudaStreamSynchronize");
}

}  // namespace impl

void* current_stream() noexcept { return impl::current; }

std::string pci_bus_id(int device) {
  char id[64] = {};
  impl::check(cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof id), device), "cudaDeviceGetPCIBusId");
  return id;
}

}  // namespace mirror::cuda

namespace mirror::cuda::impl {

// These are called from anywhere (inside fn too, for another GPU's buffer): each leaves the
// thread's current device as it found it.
void* buffer_allocate(int device, std::size_t bytes) {
  const device_guard on(device);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
  if (e != cudaSuccess) fail(e, detail::format("cudaMalloc of %zu bytes on device %d", bytes, device).c_str());
  return p;
}

void buffer_free(int device, void* p) noexcept {
  if (p == nullptr) return;
  int previous = 0;
  const bool known = cudaGetDevice(&previous) == cudaSuccess;
  if (cudaSetDevice(device) == cudaSuccess) (void)cudaFree(p);
  if (known) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();  // nothing to report from a destructor; nothing left for the next check
}

// cudaMemcpy orders with the legacy default stream, which the replicas' blocking streams also
// order with; the device synchronisation makes "the data is there" plain for the caller.
void buffer_upload(int device, void* dst, const void* src, std::size_t bytes) {
  const device_guard on(device);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}

void buffer_download(int device, void* dst, const void* src, std::size_t bytes) {
  const device_guard on(device);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}

}  // namespace mirror::cuda::impl

namespace mirror::devices {
Cuda::runtime::runtime(const Cuda& d)
    : cuda::runtime(std::span<const int>(d.gpus.data(), d.gpus.size()), d.replicas_per_gpu, d.timeout) {}
}  // namespace mirror::devices
