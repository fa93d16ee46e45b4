// SPDX-License-Identifier: Apache-2.0
// all_reduce bandwidth per GPU policy, 4 KiB .. 1 GiB of float per replica, against the
// device-to-device cudaMemcpy bandwidth of GPU 0 (the bound a copy-based reduction works
// within). One line per (policy, replicas, bytes):
//   algbw  = bytes / time                      (nccl-tests' definition)
//   busbw  = algbw * 2 (R - 1) / R             (bytes each link must move; comparable across R)
//   bound  = cudaMemcpy D2D bytes / time on one GPU, same size
// On one GPU, NcclAllReduce runs as a single-rank communicator (R=1: busbw is 0 by definition;
// compare its time with the copy of the same bytes). Without a GPU it says so and exits 77
// (meson: SKIP).
//
//   all_reduce_gpu_bench [--max-bytes N] [--replicas R] [--budget-seconds S]
//     (default 1 GiB, R in {2, 4}; with a budget, no new line starts after S seconds)
#include <cuda_runtime_api.h>
#include <algorithm>
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

template <class Ops>
void measure(const char* name, mirror::devices::Cuda device, Ops ops, std::size_t max_bytes) {
  if (over_budget()) return;
  mirror::Strategy<mirror::devices::Cuda, Ops> s{device, ops};
  const int R = s.num_replicas_in_sync();
  for (std::size_t bytes = 4096; bytes <= max_bytes && !over_budget(); bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<mirror::cuda::device_buffer<float>> buffers;
    for (int r = 0; r < R; ++r) {
      buffers.emplace_back(s.runtime().device_of(r), n);
      buffers.back().upload(std::vector<float>(n, 1.0f));
    }
    auto step = [&] {
      s.run([&](auto& ctx) {
        ctx.all_reduce(mirror::ReduceOp::sum, buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
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
    const double busbw = algbw * 2.0 * (R - 1) / R;
    const double bound = copy_bound(bytes);
    // (copy_us: the cudaMemcpyAsync of the same bytes, the yardstick of a single rank.)
    std::printf("%-22s R=%-2d gpus=%-2zu %12zu B  %10.1f us  algbw %8.2f GB/s  busbw %8.2f GB/s  copy %8.2f GB/s  "
                "copy_us %10.1f  busbw/copy %5.1f %%\n",
                name, R, s.runtime().gpus().size(), bytes, seconds * 1e6, algbw, busbw, bound,
                double(bytes) / bound / 1e3, 100.0 * busbw / bound);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_bytes = std::size_t{1} << 30;
  std::vector<int> replica_counts{2, 4};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--max-bytes") max_bytes = std::stoull(argv[i + 1]);
    if (flag == "--replicas") replica_counts = {std::stoi(argv[i + 1])};
    if (flag == "--budget-seconds") budget_seconds = std::stod(argv[i + 1]);
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
  std::printf("; float sum, in-place device_span leaves\n");
  for (const int R : replica_counts) {
    const mirror::devices::Cuda logical{.gpus = {0}, .replicas_per_gpu = R};
    measure("ReductionToOneDevice", logical, mirror::ops::ReductionToOneDevice{}, max_bytes);
    measure("HierarchicalCopy", logical, mirror::ops::HierarchicalCopy{.num_packs = 1}, max_bytes);
  }
#if MIRROR_HAS_NCCL
  // One replica per GPU; on one GPU a single-rank communicator (its cost against the copy).
  measure("NcclAllReduce", mirror::devices::Cuda{}, mirror::ops::NcclAllReduce{}, max_bytes);
  if (gpus >= 2) measure("ReductionToOneDevice", mirror::devices::Cuda{}, mirror::ops::ReductionToOneDevice{}, max_bytes);
#endif
  return 0;
}
