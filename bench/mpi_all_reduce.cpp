// SPDX-License-Identifier: Apache-2.0
// The MPI baseline: MPI_Allreduce(MPI_IN_PLACE, sum) of the same bytes as all_reduce_bench, one
// process per replica (mpirun -np R, launched by bench/report.sh). Rank 0 prints Google
// Benchmark-shaped JSON (name with the same axes, impl:mpi; real_time in ns per call), one
// entry per repetition, so bench/report.py reads it like the other programs' output.
//   mpi_all_reduce [--repetitions N] [--min-time SECONDS] BYTES...
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int repetitions = 5;
  double min_time = 0.2;
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repetitions") && i + 1 < argc) {
      repetitions = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--min-time") && i + 1 < argc) {
      min_time = std::atof(argv[++i]);
    } else {
      sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    }
  }
  if (sizes.empty()) sizes = {4, 64 << 20};
  if (rank == 0) {
    int len = 0;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<std::size_t>(len));
    v = v.substr(0, v.find_first_of("\n,"));
    std::printf("{\n  \"context\": {\"verb\": \"all_reduce\", \"device\": \"MPI, %d processes\", \"mpi\": \"%s\"},\n"
                "  \"benchmarks\": [\n", size, v.c_str());
  }
  bool first = true;
  for (std::size_t bytes : sizes) {
    const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
    std::vector<float> buf(n);
    for (std::size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(rank + static_cast<int>(i % 7));
    auto call = [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
    // Calibrate on rank 0 (every rank uses its count): enough calls to last min_time.
    long iters = 1;
    for (;;) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      for (long k = 0; k < iters; ++k) call();
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      MPI_Bcast(&dt, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      if (dt >= min_time / 4 || iters > (1L << 26)) {
        iters = std::max(1L, static_cast<long>(static_cast<double>(iters) * min_time / std::max(dt, 1e-9)));
        break;
      }
      iters *= 8;
    }
    for (int rep = 0; rep < repetitions; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      for (long k = 0; k < iters; ++k) call();
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                        static_cast<double>(iters);
      if (rank == 0) {
        const double bps = static_cast<double>(n * sizeof(float)) / (ns * 1e-9);
        std::printf("%s    {\"name\": \"all_reduce/impl:mpi/type:float/replicas:%d/bytes:%zu\", \"run_type\": \"iteration\", "
                    "\"repetition_index\": %d, \"iterations\": %ld, \"real_time\": %.3f, \"time_unit\": \"ns\", "
                    "\"bytes_per_second\": %.6e, \"busbw\": %.6e, \"databw\": %.6e, \"replicas\": %d, \"bytes\": %zu}",
                    first ? "" : ",\n", size, n * sizeof(float), rep, iters, ns, bps, bps * 2.0 * (size - 1) / size,
                    bps * size, size, n * sizeof(float));
        first = false;
      }
    }
  }
  if (rank == 0) std::printf("\n  ]\n}\n");
  MPI_Finalize();
  return 0;
}
