// SPDX-License-Identifier: Apache-2.0
// Cluster<Cuda>'s all_reduce against raw NCCL, under mpirun, on the same processes and GPUs:
// mirror's Strategy<Cluster<Cuda>> all-reduces an in-place float device leaf
// (mirror::cuda::device_buffer's span; ops::NcclAllReduce, with the default agreement check over
// MPI) and a raw NCCL communicator (ncclCommInitRank over an ncclUniqueId sent with MPI_Bcast)
// runs ncclAllReduce in place on the same bytes. The two alternate, block by block, several
// repetitions per size; a block's time is the slowest rank's. Rank 0 prints, per size, each
// one's median and range of the time per all-reduce and mirror/raw = raw time / mirror time
// (mirror's share of raw NCCL's bandwidth: 1 is as fast), then
//   ratio_from_1MiB=R   the smallest median ratio from 1 MiB up (the target: R >= 0.95)
// Without a GPU it prints a SKIP line and exits 77 before MPI starts.
//
//   mpirun -np W cluster_all_reduce_gpu_bench [--budget-seconds S] [--reps K] [--max-bytes N]
//     (defaults: no budget, K = 7, sizes 4 B, 64 KiB, 1 MiB, 16 MiB, 64 MiB; with a budget no
//     new size starts after S seconds)
#include <cuda_runtime_api.h>
#include <nccl.h>
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <mirror/mirror.hpp>
#include "../median.hpp"

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Cuda>;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void die(const char* what, const char* why) {
  std::fprintf(stderr, "cluster_all_reduce_gpu_bench: %s: %s\n", what, why);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(what, cudaGetErrorString(e));
}
void check(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) die(what, ncclGetErrorString(e));
}

// This process's GPU: its rank on the host modulo the GPUs it sees (the kit runs several ranks
// on one GPU, each its own NCCL host).
int my_gpu(int gpus) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v) % gpus;
  }
  return 0;
}

// All-reduces per timed block: about 256 MiB per block, 3 to 200.
int iterations_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{256} << 20) / bytes, 3, 200));
}

// Seconds per all-reduce of one block of `iters` steps, the slowest rank's (all start together).
template <class Step, class Drain>
double timed(int iters, Step step, Drain drain) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = clock_type::now();
  for (int i = 0; i < iters; ++i) step();
  drain();
  double mine = std::chrono::duration<double>(clock_type::now() - t0).count() / iters, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

using bench::median;

std::string size_name(std::size_t b) {
  if (b >= (std::size_t{1} << 20)) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  double budget = 0;
  int reps = 7;
  std::size_t max_bytes = std::size_t{64} << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--budget-seconds") budget = std::stod(argv[i + 1]);
    if (flag == "--reps") reps = std::max(1, std::stoi(argv[i + 1]));
    if (flag == "--max-bytes") max_bytes = std::stoull(argv[i + 1]);
  }
  const int gpus = mirror::cuda::device_count();
  if (gpus == 0) {
    std::printf("SKIP: no CUDA device; cluster_all_reduce_gpu_bench measures Cluster<Cuda> against NCCL and needs "
                "an NVIDIA GPU\n");
    return 77;
  }
  const auto started = clock_type::now();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // mirror's communication thread
  int rank = 0, W = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const int gpu = my_gpu(gpus);
  {
    mirror::Strategy<Cluster> s{Cluster{.local = {.gpus = {gpu}, .timeout = std::chrono::seconds(60)},
                                        .timeout = std::chrono::seconds(60)}};
    if (s.num_replicas_in_sync() != W) die("Strategy", "expected one replica per process");

    ncclUniqueId id{};
    if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    check(cudaSetDevice(gpu), "cudaSetDevice");
    ncclComm_t comm = nullptr;
    check(ncclCommInitRank(&comm, W, id, rank), "ncclCommInitRank");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

    if (rank == 0) {
      cudaDeviceProp prop{};
      check(cudaGetDeviceProperties(&prop, gpu), "cudaGetDeviceProperties");
      int nccl = 0;
      (void)ncclGetVersion(&nccl);
      const char* host_id = std::getenv("NCCL_HOSTID");
      std::printf("# %d ranks; rank 0 on GPU %d of %d: %s; NCCL %d; NCCL_HOSTID %s; float sum in place; %d reps per "
                  "size, mirror and raw alternating; times per all-reduce, the slowest rank's\n",
                  W, gpu, gpus, prop.name, nccl, host_id ? "set per process" : "unset", reps);
      std::printf("%10s  %-34s  %-34s  %s\n", "bytes", "mirror us: median [min, max]", "raw NCCL us: median [min, max]",
                  "mirror/raw");
      std::fflush(stdout);
    }
    double worst_from_1mib = 1e9;
    for (const std::size_t bytes : {std::size_t{4}, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20,
                                    std::size_t{64} << 20}) {
      if (bytes > max_bytes) break;
      int stop = budget > 0 && std::chrono::duration<double>(clock_type::now() - started).count() >= budget;
      MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0's clock decides for all
      if (stop) {
        if (rank == 0) std::printf("# time budget of %.0f s spent: the remaining sizes were not measured\n", budget);
        break;
      }
      const std::size_t n = bytes / sizeof(float);
      mirror::cuda::device_buffer<float> leaf(gpu, n);
      leaf.upload(std::vector<float>(n, 1.0f));
      float* raw = nullptr;
      check(cudaMalloc(reinterpret_cast<void**>(&raw), bytes), "cudaMalloc");
      check(cudaMemset(raw, 0, bytes), "cudaMemset");
      auto mirror_step = [&] { s.run([&](auto& ctx) { ctx.all_reduce(mirror::ReduceOp::sum, leaf.span()); }); };
      auto mirror_drain = [&] { s.runtime().synchronize(0); };
      auto raw_step = [&] { check(ncclAllReduce(raw, raw, n, ncclFloat, ncclSum, comm, stream), "ncclAllReduce"); };
      auto raw_drain = [&] { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); };
      timed(1, mirror_step, mirror_drain);  // warm-up: buffers, NCCL's connections
      timed(1, raw_step, raw_drain);
      const int iters = iterations_for(bytes);
      std::vector<double> m, r, ratio;
      for (int k = 0; k < reps; ++k) {
        m.push_back(timed(iters, mirror_step, mirror_drain));
        r.push_back(timed(iters, raw_step, raw_drain));
        ratio.push_back(r.back() / m.back());
      }
      check(cudaFree(raw), "cudaFree");
      const double q = median(ratio);
      if (bytes >= (std::size_t{1} << 20)) worst_from_1mib = std::min(worst_from_1mib, q);
      if (rank == 0) {
        char a[64], b[64];
        std::snprintf(a, sizeof a, "%10.1f [%.1f, %.1f]", median(m) * 1e6, *std::min_element(m.begin(), m.end()) * 1e6,
                      *std::max_element(m.begin(), m.end()) * 1e6);
        std::snprintf(b, sizeof b, "%10.1f [%.1f, %.1f]", median(r) * 1e6, *std::min_element(r.begin(), r.end()) * 1e6,
                      *std::max_element(r.begin(), r.end()) * 1e6);
        std::printf("%10s  %-34s  %-34s  %.3f (%d x %d)\n", size_name(bytes).c_str(), a, b, q, reps, iters);
        std::fflush(stdout);
      }
    }
    if (rank == 0) {
      if (worst_from_1mib < 1e9) {
        std::printf("ratio_from_1MiB=%.3f\n", worst_from_1mib);
      } else {
        std::printf("ratio_from_1MiB=none (no size from 1 MiB was measured)\n");
      }
    }
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
    check(ncclCommDestroy(comm), "ncclCommDestroy");
  }
  MPI_Finalize();
  return 0;
}
