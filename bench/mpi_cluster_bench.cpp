// SPDX-License-Identifier: Apache-2.0
// Cross-worker collectives (devices::Cluster<Threads>, ops::Hierarchical over MPI) against the
// raw MPI collective of the same bytes on the same processes (issue 6's target for all_reduce:
// <= 5 % overhead at >= 64 KiB). Launch under mpirun, one process per worker:
//   mpirun -np 2 --bind-to none build/bench/mpi_cluster_bench [--replicas R] [--repetitions N]
//          [--min-time SECONDS] [--no-validate] [--deterministic] [--verb VERB] [--two-leaves] BYTES...
// --deterministic: ops::MpiAllReduce{.deterministic = true} (worker order: all-to-all, fold,
// all-gather) instead of one MPI_Iallreduce.
// --verb: all_reduce (default; against MPI_Allreduce in place), reduce_scatter (each replica's
// BYTES reduced, its cut kept, in place on a span; against MPI_Reduce_scatter_block of the same
// BYTES per process), all_gather (BYTES gathered in all, BYTES / (W*R) from each replica, the
// span form; against MPI_Allgather), or all_reduce_async and reduce_scatter_async (the started
// form, then wait(); against the same MPI calls). all_reduce moves BYTES / 4 floats (at least
// one); the other verbs round BYTES down to a multiple of 4*W*R (at least that), so every
// replica has a share. --two-leaves (the all-reduces and reduce-scatters): the BYTES as a nest of
// two spans of about half each, against the MPI call on the same BYTES in one buffer.
// Rank 0 prints Google Benchmark-shaped JSON (impl:cluster / impl:mpi, real_time in ns per
// call), repetitions of the two alternating, so bench/report.py can read it.
#include <mirror/mirror.hpp>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
using clock_type = std::chrono::steady_clock;

// Seconds for `iters` calls of `body`, as rank 0 measured it (every rank gets rank 0's figure,
// so all ranks agree on the next iteration count).
template <class Body>
double timed(long iters, Body&& body) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = clock_type::now();
  body(iters);
  double dt = std::chrono::duration<double>(clock_type::now() - t0).count();
  MPI_Bcast(&dt, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return dt;
}

template <class Body>
long calibrate(double min_time, Body&& body) {
  long iters = 1;
  for (;;) {
    const double dt = timed(iters, body);
    if (dt >= min_time / 4 || iters > (1L << 24)) {
      return std::max(1L, static_cast<long>(static_cast<double>(iters) * min_time / std::max(dt, 1e-9)));
    }
    iters *= 8;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int replicas = 1, repetitions = 5;
  double min_time = 0.2;
  bool validate = true, deterministic = false, two_leaves = false;
  std::string verb = "all_reduce";
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--replicas") && i + 1 < argc) {
      replicas = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--repetitions") && i + 1 < argc) {
      repetitions = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--min-time") && i + 1 < argc) {
      min_time = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--no-validate")) {
      validate = false;
    } else if (!std::strcmp(argv[i], "--deterministic")) {
      deterministic = true;
    } else if (!std::strcmp(argv[i], "--two-leaves")) {
      two_leaves = true;
    } else if (!std::strcmp(argv[i], "--verb") && i + 1 < argc) {
      verb = argv[++i];
      if (verb != "all_reduce" && verb != "reduce_scatter" && verb != "all_gather" && verb != "all_reduce_async" &&
          verb != "reduce_scatter_async") {
        if (rank == 0) {
          std::fprintf(stderr, "mpi_cluster_bench: --verb all_reduce|reduce_scatter|all_gather|all_reduce_async|"
                               "reduce_scatter_async\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } else {
      sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    }
  }
  if (sizes.empty()) sizes = {4, 64 << 10, 64 << 20};
  if (two_leaves && verb == "all_gather") {
    if (rank == 0) std::fprintf(stderr, "mpi_cluster_bench: --two-leaves is for the all-reduces and reduce-scatters\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  {
    Cluster device;
    device.local.replicas = replicas;
    device.validate_shapes = validate;
    mirror::default_ops_t<Cluster> ops;
    ops.cross.deterministic = deterministic;
    mirror::Strategy<Cluster> s(device, ops);
    if (rank == 0) {
      std::printf("{\n  \"context\": {\"verb\": \"cluster_%s\", \"device\": \"Cluster<Threads>, %d workers x %d "
                  "replicas\", \"validate_shapes\": %s, \"deterministic\": %s, \"two_leaves\": %s, \"git\": \"%s\"},\n  "
                  "\"benchmarks\": [\n",
                  verb.c_str(), size, replicas, validate ? "true" : "false", deterministic ? "true" : "false",
                  two_leaves ? "true" : "false", MIRROR_GIT_DESCRIBE);
    }
    bool first = true;
    for (const std::size_t bytes : sizes) {
      const std::size_t N = static_cast<std::size_t>(size * replicas);
      const bool all_reduce = verb == "all_reduce" || verb == "all_reduce_async";
      const bool scatters = verb == "reduce_scatter" || verb == "reduce_scatter_async";
      const std::size_t multiple = all_reduce ? (two_leaves ? 2 : 1) : N;
      const std::size_t n = std::max<std::size_t>(multiple, bytes / sizeof(float) / multiple * multiple);
      const std::size_t part = n / N;  // all_gather: each replica's share; reduce_scatter: its cut
      std::vector<std::vector<float>> bufs(static_cast<std::size_t>(replicas), std::vector<float>(n, 1.f));
      std::vector<std::vector<float>> parts(static_cast<std::size_t>(replicas), std::vector<float>(part, 1.f));
      std::vector<float> raw(n, 1.f), raw_out(n, 0.f);
      // The collective inside one run, `iters` times: run's dispatch is not what is measured.
      auto cluster = [&](long iters) {
        s.run([&](auto& ctx) {
          std::span<float> mine(bufs[static_cast<std::size_t>(ctx.replica_id_in_sync_group() % replicas)]);
          for (long k = 0; k < iters; ++k) {
            const std::size_t half = mine.size() / 2 / multiple * multiple;  // a share per replica
            const std::array<std::span<float>, 2> halves{mine.first(half), mine.subspan(half)};
            if (scatters && two_leaves) {
              if (verb == "reduce_scatter_async") {
                ctx.reduce_scatter_async(mirror::ReduceOp::sum, halves).wait();
              } else {
                ctx.reduce_scatter(mirror::ReduceOp::sum, halves);
              }
            } else if (verb == "reduce_scatter_async") {
              ctx.reduce_scatter_async(mirror::ReduceOp::sum, mine).wait();
            } else if (verb == "reduce_scatter") {
              ctx.reduce_scatter(mirror::ReduceOp::sum, mine);
            } else if (verb == "all_gather") {
              ctx.all_gather(std::span<const float>(parts[static_cast<std::size_t>(ctx.replica_id_in_sync_group() % replicas)]),
                             mine, mirror::axis0);
            } else if (two_leaves) {
              if (verb == "all_reduce_async") {
                ctx.all_reduce_async(mirror::ReduceOp::sum, halves).wait();
              } else {
                ctx.all_reduce(mirror::ReduceOp::sum, halves);
              }
            } else if (verb == "all_reduce_async") {
              ctx.all_reduce_async(mirror::ReduceOp::sum, mine).wait();
            } else {
              ctx.all_reduce(mirror::ReduceOp::sum, mine);
            }
          }
        });
      };
      // The raw collective over the W processes, as one process per worker would call it.
      const int per_process = static_cast<int>(n / static_cast<std::size_t>(size));
      auto mpi = [&](long iters) {
        for (long k = 0; k < iters; ++k) {
          if (scatters) {
            MPI_Reduce_scatter_block(raw.data(), raw_out.data(), per_process, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          } else if (verb == "all_gather") {
            MPI_Allgather(raw.data(), per_process, MPI_FLOAT, raw_out.data(), per_process, MPI_FLOAT, MPI_COMM_WORLD);
          } else {
            MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          }
        }
      };
      const long iters_cluster = calibrate(min_time, cluster);
      const long iters_mpi = calibrate(min_time, mpi);
      for (int rep = 0; rep < repetitions; ++rep) {
        for (const bool is_mpi : {false, true}) {
          const long iters = is_mpi ? iters_mpi : iters_cluster;
          const double ns = (is_mpi ? timed(iters, mpi) : timed(iters, cluster)) * 1e9 / static_cast<double>(iters);
          if (rank == 0) {
            std::printf("%s    {\"name\": \"cluster_%s/impl:%s/type:float/workers:%d/replicas:%d/bytes:%zu\", "
                        "\"run_type\": \"iteration\", \"repetition_index\": %d, \"iterations\": %ld, "
                        "\"real_time\": %.3f, \"time_unit\": \"ns\", \"workers\": %d, \"replicas\": %d, \"bytes\": %zu}",
                        first ? "" : ",\n", verb.c_str(), is_mpi ? "mpi" : "cluster", size, replicas, n * sizeof(float), rep, iters,
                        ns, size, replicas, n * sizeof(float));
            first = false;
          }
        }
      }
    }
    if (rank == 0) std::printf("\n  ]\n}\n");
  }
  MPI_Finalize();
  return 0;
}
