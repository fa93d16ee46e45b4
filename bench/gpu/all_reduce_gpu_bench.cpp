// SPDX-License-Identifier: Apache-2.0
// all_reduce, reduce_scatter and all_gather bandwidth per GPU policy, 4 KiB .. 1 GiB of float per
// replica, against the device-to-device cudaMemcpy bandwidth of GPU 0 (the bound a copy-based
// collective works within). One line per (collective, policy, replicas, bytes), bytes being each
// replica's input S:
//   algbw  = S / time                          (nccl-tests' definition)
//   busbw  = algbw * 2 (R - 1) / R             (all_reduce; (R - 1) / R for the other two, and
//                                               for all_gather of the whole output R S)
//   copy   = cudaMemcpy D2D bytes / time on one GPU, same S (copy_us: its time)
//   bound  = the fewest bytes the collective must move on one GPU, at the copy's rate (a copy of
//            S moves 2 S): all_reduce 2 R S (each buffer read and written once), reduce_scatter
//            (R + 1) S (each input read once, each cut written once), all_gather R (R + 1) S (each
//            input read once, R S written into every replica's output); "bound" is its time over
//            the collective's, in %
// On one GPU, NcclAllReduce runs as a single-rank communicator (R=1: busbw is 0 by definition;
// compare its time with the copy of the same bytes). all_gather's per-replica input is at most
// max-bytes / R, so each output stays within max-bytes. Without a GPU it says so and exits 77
// (meson: SKIP).
//
//   all_reduce_gpu_bench [--max-bytes N] [--replicas R] [--budget-seconds S]
//                        [--collectives all_reduce,reduce_scatter,all_gather]
//     (default 1 GiB, R in {2, 4}, all three; with a budget, no new line starts after S seconds)
#include <cuda_runtime_api.h>
#include <algorithm>
#include <span>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <mirror/mirror.hpp>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

int iterations_for(std::size_t bytes) {
  const std::size_t budget = std::size_t{4} << 30;  // about 4 GiB moved per measurement
  return static_cast<int>(std::max<std::size_t>(5, std::min<std::size_t>(200, budget / bytes)));
}

// GB/s of a device-to-device cudaMemcpy of `bytes` on GPU 0.
double copy_bound(std::size_t bytes) {
  check(cudaSetDevice(0), "cudaSetDevice");
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc");
  check(cudaMalloc(&b, bytes), "cudaMalloc");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  const int iters = iterations_for(bytes);
  check(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
  check(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  check(cudaFree(a), "cudaFree");
  check(cudaFree(b), "cudaFree");
  return double(bytes) * iters / (ms * 1e-3) / 1e9;
}

// A wall-clock budget for the whole program: a device check must end in a fixed time.
std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
double budget_seconds = 0;  // 0: none
bool over_budget() {
  if (budget_seconds <= 0) return false;
  const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (spent < budget_seconds) return false;
  static bool said = false;
  if (!said) std::printf("# time budget of %.0f s spent: the remaining lines were not measured\n", budget_seconds);
  said = true;
  return true;
}

enum class collective { all_reduce, reduce_scatter, all_gather };
const char* name_of(collective c) {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_gather: return "all_gather";
  }
  return "?";
}

template <class Ops>
void measure(collective what, const char* name, mirror::devices::Cuda device, Ops ops, std::size_t max_bytes) {
  if (over_budget()) return;
  mirror::Strategy<mirror::devices::Cuda, Ops> s{device, ops};
  const int R = s.num_replicas_in_sync();
  const std::size_t most = what == collective::all_gather ? max_bytes / static_cast<std::size_t>(R) : max_bytes;
  for (std::size_t bytes = 4096; bytes <= most && !over_budget(); bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<mirror::cuda::device_buffer<float>> buffers, outputs;
    for (int r = 0; r < R; ++r) {
      buffers.emplace_back(s.runtime().device_of(r), n);
      buffers.back().upload(std::vector<float>(n, 1.0f));
      if (what == collective::all_gather) outputs.emplace_back(s.runtime().device_of(r), n * static_cast<std::size_t>(R));
    }
    auto step = [&] {
      s.run([&](auto& ctx) {
        const auto me = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
        const auto in = buffers[me].span();
        switch (what) {
          case collective::all_reduce: ctx.all_reduce(mirror::ReduceOp::sum, in); break;
          case collective::reduce_scatter:  // in place: the cut stays in the replica's buffer
            (void)ctx.reduce_scatter(mirror::ReduceOp::sum, std::span<float>(in.data, in.size));
            break;
          case collective::all_gather: {
            const auto out = outputs[me].span();
            ctx.all_gather(std::span<const float>(in.data, in.size), std::span<float>(out.data, out.size),
                           mirror::axis0);
            break;
          }
        }
      });
    };
    auto drain = [&] {
      for (int r = 0; r < R; ++r) s.runtime().synchronize(r);
    };
    step();
    drain();
    const int iters = iterations_for(bytes);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) step();
    drain();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    const double algbw = double(bytes) / seconds / 1e9;
    const double Rd = R;
    const double busbw = what == collective::all_reduce   ? algbw * 2.0 * (Rd - 1) / Rd
                         : what == collective::all_gather ? algbw * (Rd - 1)
                                                          : algbw * (Rd - 1) / Rd;
    const double bound = copy_bound(bytes);
    const double copy_seconds = double(bytes) / bound / 1e9;
    const double bound_bytes = what == collective::all_reduce       ? 2.0 * Rd * double(bytes)
                               : what == collective::reduce_scatter ? (Rd + 1) * double(bytes)
                                                                    : Rd * (Rd + 1) * double(bytes);
    const double bound_seconds = bound_bytes / (2.0 * double(bytes)) * copy_seconds;
    // (copy_us: the cudaMemcpyAsync of the same bytes, the yardstick of a single rank.)
    std::printf("%-14s %-22s R=%-2d gpus=%-2zu %12zu B  %10.1f us  algbw %8.2f GB/s  busbw %8.2f GB/s  copy %8.2f GB/s  "
                "copy_us %10.1f  busbw/copy %5.1f %%  bound %5.1f %%\n",
                name_of(what), name, R, s.runtime().gpus().size(), bytes, seconds * 1e6, algbw, busbw, bound,
                copy_seconds * 1e6, 100.0 * busbw / bound, 100.0 * bound_seconds / seconds);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_bytes = std::size_t{1} << 30;
  std::vector<int> replica_counts{2, 4};
  std::vector<collective> collectives{collective::all_reduce, collective::reduce_scatter, collective::all_gather};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--max-bytes") max_bytes = std::stoull(argv[i + 1]);
    if (flag == "--replicas") replica_counts = {std::stoi(argv[i + 1])};
    if (flag == "--budget-seconds") budget_seconds = std::stod(argv[i + 1]);
    if (flag == "--collectives") {
      collectives.clear();
      const std::string list = argv[i + 1];
      for (const collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather}) {
        if (list.find(name_of(c)) != std::string::npos) collectives.push_back(c);
      }
    }
  }
  const int gpus = mirror::cuda::device_count();
  if (gpus == 0) {
    std::printf("SKIP: no CUDA device; all_reduce_gpu_bench measures GPU all-reduce and needs an NVIDIA GPU\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  std::printf("# %d GPU(s); GPU 0: %s (sm_%d%d); driver API %d, runtime %d", gpus, prop.name, prop.major, prop.minor,
              driver, runtime);
#if MIRROR_HAS_NCCL
  std::printf(", NCCL %d", mirror::nccl::impl::version());
#endif
  std::printf("; float sum; all_reduce and reduce_scatter in place in device buffers, all_gather between them\n");
  // all_reduce first (its lines are the ones docs/cuda.md quotes), then the other two, so that a
  // tight budget still measures all_reduce whole.
  for (const collective what : collectives) {
    for (const int R : replica_counts) {
      const mirror::devices::Cuda logical{.gpus = {0}, .replicas_per_gpu = R};
      measure(what, "ReductionToOneDevice", logical, mirror::ops::ReductionToOneDevice{}, max_bytes);
      measure(what, "HierarchicalCopy", logical, mirror::ops::HierarchicalCopy{.num_packs = 1}, max_bytes);
    }
#if MIRROR_HAS_NCCL
    // One replica per GPU; on one GPU a single-rank communicator (its cost against the copy).
    measure(what, "NcclAllReduce", mirror::devices::Cuda{}, mirror::ops::NcclAllReduce{}, max_bytes);
    if (gpus >= 2) {
      measure(what, "ReductionToOneDevice", mirror::devices::Cuda{}, mirror::ops::ReductionToOneDevice{}, max_bytes);
    }
#endif
  }
  return 0;
}
