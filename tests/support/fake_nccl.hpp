// SPDX-License-Identifier: Apache-2.0
#pragma once
// A scripted stand-in for the CUDA runtime and NCCL functions that backends/cuda/cuda_runtime.cpp
// and backends/nccl/nccl_comms.cpp call (tests/support/fake_nccl.cpp), so that their device,
// error, watchdog and locking paths run in CPU-only CI: a test links libmirror_cuda's or
// libmirror_nccl's object with the fake instead of libcudart and libnccl. "GPUs" are numbers,
// their memory is host memory that the fake tracks, a "stream" belongs to the device current
// when it was made (tests may make their own: fake_nccl::stream), and ranks are threads. The
// fake checks CUDA's and NCCL's rules as it goes and records what breaks them. What it models of
// NCCL and CUDA, each with a test in tests/backends/nccl/fake_rules_test.cpp: device bookkeeping
// (a communicator's buffers and stream on its own device; two ranks of one communicator on one
// device refused at init), an init that completes only once every rank joined, asynchronous
// work ordered only by streams and events (a missing wait is a violation), ncclAvg as NCCL
// computes it, NCCL's min and max with NaNs, half and bfloat16, the 2D copies' pitch limit,
// partial and one-way peer access, non-blocking finalize, and groups over several communicators.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

struct CUstream_st {
  int rank;
  int device = 0;
};

namespace fake_nccl {

using stream = CUstream_st;

/// What the fake does; reset() before each test.
struct script {
  int init_async = 0;           // the state a communicator settles in after init (0: ncclSuccess)
  int init_polls = 2;           // polls of ncclCommGetAsyncError that answer ncclInProgress first
  int group_end = 7;            // what ncclGroupEnd of an all-reduce returns (7: ncclInProgress)
  int enqueue_async = 0;        // the state a communicator settles in once every rank enqueued
  int fail_all_reduce_call = 0; // the n-th ncclAllReduce call (1-based) fails; 0: none
  int hang_rank = -1;           // this rank's collectives never complete (its events stay not ready)
  int devices = 8;              // cudaGetDeviceCount
  bool can_access_peer = true;  // cudaDeviceCanAccessPeer's answer for every pair
  int enable_peer_error = 0;    // what cudaDeviceEnablePeerAccess fails with (0: it succeeds)
  bool finalize_hangs = false;  // ncclCommFinalize never completes (the state stays ncclInProgress)
  std::size_t max_pitch = 2147483647;  // cudaDevAttrMaxPitch; 2D copies and sets refuse a larger pitch
  int ranks_elsewhere = 0;      // ranks of each communicator in other processes (a multi-process test,
                                // each process with its own fake): joined at init, never launching here
  int fail_init_rank = -1;      // this rank's init fails (ncclSystemError); the others wait for it
  std::vector<std::pair<int, int>> no_peer_access{};  // (device, peer) pairs that cannot access: one-way if
                                                    // only one direction is listed
  int finalize_polls = 2;       // polls of ncclCommGetAsyncError that answer ncclInProgress after
                                // ncclCommFinalize (which itself returns ncclInProgress when > 0)
  int version = 22809;          // ncclGetVersion; from 23000 on, NCCL_MULTI_RANK_GPU_ENABLE=1 lifts
                                // the duplicate-GPU check, as NCCL 2.30 does
};
void reset(const script& s = {});

/// What happened since reset().
struct record {
  int all_reduce_calls = 0;   // ncclAllReduce
  int reduce_scatter_calls = 0;  // ncclReduceScatter
  int all_gather_calls = 0;   // ncclAllGather
  int broadcast_calls = 0;    // ncclBroadcast
  int groups_launched = 0;    // ncclGroupEnd that launched collectives
  int aborts = 0;             // ncclCommAbort
  int destroys = 0;           // ncclCommDestroy
  int not_ready_queries = 0;  // cudaEventQuery answered cudaErrorNotReady
  int launches = 0;           // launch_combine, launch_divide and launch_fold_into_all that ran
  int folds = 0;              // launch_fold_into_all that ran
  int peer_copies = 0;        // cudaMemcpyPeerAsync
  std::vector<std::string> violations;  // NCCL's or CUDA's rules broken (must stay empty)
};
record snapshot();

/// One piece of work enqueued on a fake stream: a copy ("cudaMemcpyAsync", ...), a "kernel", an
/// NCCL call ("ncclAllReduce", ...) or a test's own marker.
struct enqueued {
  const void* stream;  // its cudaStream_t
  std::string what;
};
/// Every piece of work since reset(), in the order it was enqueued (streams run everything at
/// once here; this log is what keeps their order for happens_before).
std::vector<enqueued> stream_log();
/// Logs a test's own piece of work on `stream` (a kernel of fn, say); returns its index.
std::size_t enqueue_marker(const void* stream, const std::string& what);
/// Whether log entry `a` must complete before entry `b` starts on a GPU: `a` comes first on the
/// same stream, or a chain of cudaEventRecord / cudaStreamWaitEvent orders them.
bool happens_before(std::size_t a, std::size_t b);

/// This thread's open ncclGroupStart count, and its CUDA last error (cudaPeekAtLastError).
int group_depth();
int last_error();
/// This thread's current device (cudaGetDevice / cudaSetDevice).
int current_device();

}  // namespace fake_nccl
