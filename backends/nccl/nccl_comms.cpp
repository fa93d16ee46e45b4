// SPDX-License-Identifier: Apache-2.0
// Communicators and the watchdog of ops::NcclAllReduce (declared in nccl_comms.hpp).
// Communicators are non-blocking (ncclConfig_t::blocking = 0), so no NCCL call can hang the
// host: every wait polls ncclCommGetAsyncError and the completion event against a deadline,
// and a deadline that passes aborts the communicators (ncclCommAbort), which is NCCL's
// documented way to get a hung collective off the GPU.

#include <backends/nccl/nccl_comms.hpp>
#include <backends/cuda/kernels.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <mirror/error.hpp>

namespace mirror::nccl::impl {

struct comms {
  std::vector<int> devices;
  std::vector<ncclComm_t> comm;
  std::vector<cudaEvent_t> done;                       // per rank: recorded after its group
  std::unique_ptr<std::atomic<std::uint64_t>[]> entered;  // per rank: collectives enqueued
  std::atomic<bool> aborted{false};
  std::mutex abort_mutex;
};

namespace {

[[noreturn]] void fail_nccl(ncclResult_t r, const std::string& what) {
  throw backend_error("mirror::ops::NcclAllReduce: " + what + " failed: ncclResult_t " + std::to_string(r) + " (" +
                          ncclGetErrorString(r) + ")",
                      static_cast<long>(r));
}
void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, what);
}
void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw backend_error("mirror::ops::NcclAllReduce: " + what + " failed: " + cudaGetErrorName(e) + " (" +
                            cudaGetErrorString(e) + ")",
                        static_cast<long>(e));
  }
}

ncclDataType_t nccl_type(cuda::element_type t) {
  switch (t) {
    case cuda::element_type::f32: return ncclFloat32;
    case cuda::element_type::f64: return ncclFloat64;
    case cuda::element_type::f16: return ncclFloat16;
    case cuda::element_type::bf16: return ncclBfloat16;
    case cuda::element_type::i32: return ncclInt32;
    case cuda::element_type::i64: return ncclInt64;
    case cuda::element_type::u8: return ncclUint8;
  }
  return ncclFloat32;
}

bool is_float(cuda::element_type t) {
  return t == cuda::element_type::f32 || t == cuda::element_type::f64 || t == cuda::element_type::f16 ||
         t == cuda::element_type::bf16;
}

ncclRedOp_t nccl_op(ReduceOp op, cuda::element_type t) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::mean: return is_float(t) ? ncclAvg : ncclSum;  // integers: sum, then divide as C++ does
  }
  return ncclSum;
}

void abort_all(comms& c) {
  std::lock_guard lock(c.abort_mutex);
  if (c.aborted.exchange(true)) return;
  for (ncclComm_t comm : c.comm) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
  }
}

// Polls until `ready()` or the deadline; between polls, NCCL's asynchronous error of `comm`.
template <class Ready>
bool wait_until(ncclComm_t comm, std::chrono::steady_clock::time_point deadline, Ready&& ready) {
  for (unsigned spins = 0;; ++spins) {
    if (ready()) return true;
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) fail_nccl(async, "an NCCL collective (asynchronous error)");
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

int version() noexcept {
  int v = 0;
  (void)ncclGetVersion(&v);
  return v;
}

comms* create_comms(std::span<const int> devices, std::chrono::milliseconds timeout) {
  auto c = std::make_unique<comms>();
  const int n = static_cast<int>(devices.size());
  c->devices.assign(devices.begin(), devices.end());
  c->comm.assign(devices.size(), nullptr);
  c->done.assign(devices.size(), nullptr);
  c->entered = std::make_unique<std::atomic<std::uint64_t>[]>(devices.size());
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // Every rank of this process inside one group: NCCL's single-thread, several-GPU init.
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (int i = 0; i < n; ++i) {
    check_cuda(cudaSetDevice(devices[static_cast<std::size_t>(i)]), "cudaSetDevice");
    check_nccl(ncclCommInitRankConfig(&c->comm[static_cast<std::size_t>(i)], n, id, i, &config),
               "ncclCommInitRankConfig");
  }
  const ncclResult_t end = ncclGroupEnd();
  if (end != ncclSuccess && end != ncclInProgress) {
    abort_all(*c);
    fail_nccl(end, "ncclGroupEnd (communicator creation)");
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int i = 0; i < n; ++i) {
    ncclResult_t state = ncclInProgress;
    const bool ready = wait_until(c->comm[static_cast<std::size_t>(i)], deadline, [&] {
      check_nccl(ncclCommGetAsyncError(c->comm[static_cast<std::size_t>(i)], &state), "ncclCommGetAsyncError");
      return state != ncclInProgress;
    });
    if (!ready) {
      abort_all(*c);
      std::vector<int> all(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
      throw timeout_error("mirror::ops::NcclAllReduce: creating the communicators took longer than " +
                              std::to_string(timeout.count()) + " ms; they were aborted",
                          all);
    }
  }
  for (int i = 0; i < n; ++i) {
    check_cuda(cudaSetDevice(devices[static_cast<std::size_t>(i)]), "cudaSetDevice");
    check_cuda(cudaEventCreateWithFlags(&c->done[static_cast<std::size_t>(i)], cudaEventDisableTiming),
               "cudaEventCreate");
  }
  check_cuda(cudaSetDevice(previous), "cudaSetDevice");
  return c.release();
}

void destroy_comms(comms* c) noexcept {
  if (c == nullptr) return;
  for (std::size_t i = 0; i < c->comm.size(); ++i) {
    if (cudaSetDevice(c->devices[i]) != cudaSuccess) continue;
    if (c->done[i] != nullptr) {
      (void)cudaEventSynchronize(c->done[i]);
      (void)cudaEventDestroy(c->done[i]);
    }
    if (c->comm[i] != nullptr && !c->aborted.load()) {
      // Non-blocking: finalize may report ncclInProgress; destroy then completes it.
      (void)ncclCommFinalize(c->comm[i]);
      ncclResult_t state = ncclInProgress;
      for (int polls = 0; polls < 100000 && state == ncclInProgress; ++polls) {
        if (ncclCommGetAsyncError(c->comm[i], &state) != ncclSuccess) break;
        if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      (void)ncclCommDestroy(c->comm[i]);
    }
  }
  (void)cudaGetLastError();
  delete c;
}

void all_reduce(comms& c, int rank, void* stream, ReduceOp op, cuda::element_type type,
                std::span<void* const> buffers, std::span<const std::size_t> counts,
                std::chrono::milliseconds timeout) {
  if (c.aborted.load()) {
    throw backend_error("mirror::ops::NcclAllReduce: the communicators were aborted after an earlier timeout or "
                        "error; construct a new Strategy",
                        static_cast<long>(ncclInvalidUsage));
  }
  const std::size_t me = static_cast<std::size_t>(rank);
  ncclComm_t comm = c.comm[me];
  auto s = static_cast<cudaStream_t>(stream);
  const std::uint64_t sequence = c.entered[me].fetch_add(1) + 1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto expire = [&](const char* stage) {
    std::vector<int> missing;
    for (std::size_t r = 0; r < c.comm.size(); ++r) {
      if (c.entered[r].load() < sequence) missing.push_back(static_cast<int>(r));
    }
    abort_all(c);
    std::string names;
    for (int r : missing) names += (names.empty() ? "" : ", ") + std::to_string(r);
    throw timeout_error("mirror::ops::NcclAllReduce: replica " + std::to_string(rank) + " waited " +
                            std::to_string(timeout.count()) + " ms " + stage + "; replicas {" + names +
                            "} had not enqueued it" +
                            (missing.empty() ? " (all had: the GPUs or links did not complete it)" : "") +
                            "; the communicators were aborted",
                        missing);
  };
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (counts[i] == 0) continue;
    check_nccl(ncclAllReduce(buffers[i], buffers[i], counts[i], nccl_type(type), nccl_op(op, type), comm, s),
               "ncclAllReduce");
  }
  ncclResult_t end = ncclGroupEnd();
  if (end != ncclSuccess && end != ncclInProgress) fail_nccl(end, "ncclGroupEnd");
  // Non-blocking communicators may still be enqueuing: wait for that first.
  if (!wait_until(comm, deadline, [&] {
        check_nccl(ncclCommGetAsyncError(comm, &end), "ncclCommGetAsyncError");
        return end != ncclInProgress;
      })) {
    expire("for NCCL to enqueue the all-reduce");
  }
  if (op == ReduceOp::mean && !is_float(type)) {
    const int n = static_cast<int>(c.comm.size());
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      const int e = cuda::impl::launch_divide(stream, type, buffers[i], counts[i], static_cast<std::size_t>(n));
      if (e != 0) check_cuda(static_cast<cudaError_t>(e), "the divide kernel launch");
    }
  }
  // The watchdog: the collective completes only when every rank's part has run, so waiting for
  // it here turns a lost peer into a timeout instead of a stream that never drains.
  check_cuda(cudaEventRecord(c.done[me], s), "cudaEventRecord");
  bool event_error = false;
  cudaError_t query = cudaSuccess;
  if (!wait_until(comm, deadline, [&] {
        query = cudaEventQuery(c.done[me]);
        if (query == cudaErrorNotReady) return false;
        event_error = query != cudaSuccess;
        return true;
      })) {
    expire("for the all-reduce to complete");
  }
  if (event_error) check_cuda(query, "cudaEventQuery");
}

}  // namespace mirror::nccl::impl
