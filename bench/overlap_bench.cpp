// SPDX-License-Identifier: Apache-2.0
// Communication hidden behind computation (docs/performance.md#overlap): a training step with
// ResNet-50's gradient profile (its 161 parameter tensors, 25.6 M floats, 102 MB), whose backward
// pass produces the tensors in reverse order, each after a fixed compute time.
//
//   mpirun -np 2 build/bench/overlap_bench [--replicas R] [--rounds N] [--factor F] [--caps MiB,...]
//                                          [--no-validate] [--quick]
// --quick (the smoke test): every tensor 1/64 of its size, and the overhead part short.
//   build/bench/overlap_bench --threads [--replicas R] ...        (devices::Threads, one process)
//
// "Compute" is a timed wait: it occupies no core, so that a 2-core machine measures the overlap
// mechanism rather than the contention between computing and communicating threads. Its total is
// F (default 1.5) times the blocking all-reduce's own time, measured first; each tensor takes its
// share by bytes, and starts when the previous tensor's ready() has returned. "compute" includes
// the sleeps' wake-up latency (tens of us each), as every other step does. Per round, alternated:
//   compute    the backward pass alone
//   comm       one blocking all-reduce of the whole flat gradient (the best blocking form)
//   blocking   backward, then that all-reduce (what a trainer without overlap does)
//   cap X      backward with ctx.gradient_buckets(sum, grads, X MiB): ready(i) as each tensor is done
// exposed = (step - compute) / comm: the share of the all-reduce's time the step still pays.
// Then the non-blocking form's own cost with nothing to overlap: all_reduce_async + wait against
// all_reduce, at 4 B and 64 MiB, alternated in one run.
// Rank 0 prints a markdown table of medians and ranges over the rounds.
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
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::size_t layers = 161;
using Grads = std::array<std::span<float>, layers>;

// ResNet-50's parameter tensors (torchvision's resnet50: conv weights, batch-norm weight and bias,
// the classifier), in forward order.
std::vector<std::size_t> resnet50() {
  std::vector<std::size_t> p;
  auto conv = [&](std::size_t out, std::size_t in, std::size_t k) { p.push_back(out * in * k * k); };
  auto bn = [&](std::size_t c) {
    p.push_back(c);
    p.push_back(c);
  };
  conv(64, 3, 7);
  bn(64);
  std::size_t in = 64;
  for (const auto& [planes, blocks] : {std::pair<std::size_t, int>{64, 3}, {128, 4}, {256, 6}, {512, 3}}) {
    for (int b = 0; b < blocks; ++b) {
      conv(planes, in, 1);
      bn(planes);
      conv(planes, planes, 3);
      bn(planes);
      conv(planes * 4, planes, 1);
      bn(planes * 4);
      if (b == 0) {
        conv(planes * 4, in, 1);
        bn(planes * 4);
      }
      in = planes * 4;
    }
  }
  p.push_back(1000 * 2048);
  p.push_back(1000);
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

template <class S>
struct bench {
  S& s;
  int replicas;
  int rank;
  std::vector<std::size_t> sizes;
  std::vector<std::vector<float>> flat;  // per local replica
  std::vector<Grads> grads;
  std::vector<double> share;             // seconds of compute per tensor (backward order)

  bench(S& strategy, int r, int rk, std::size_t shrink) : s(strategy), replicas(r), rank(rk), sizes(resnet50()) {
    for (std::size_t& n : sizes) n = std::max<std::size_t>(1, n / shrink);
    std::size_t total = 0;
    for (const std::size_t n : sizes) total += n;
    flat.assign(static_cast<std::size_t>(r), std::vector<float>(total, 1.0f));
    grads.resize(static_cast<std::size_t>(r));
    for (int q = 0; q < r; ++q) {
      std::size_t at = 0;
      for (std::size_t k = 0; k < layers; ++k) {
        grads[static_cast<std::size_t>(q)][k] = std::span<float>(flat[static_cast<std::size_t>(q)].data() + at, sizes[k]);
        at += sizes[k];
      }
    }
  }
  std::size_t total() const { return flat[0].size(); }

  void set_compute(double seconds) {
    share.assign(layers, 0);
    for (std::size_t j = 0; j < layers; ++j) {  // backward: the last tensor first
      share[j] = seconds * static_cast<double>(sizes[layers - 1 - j]) / static_cast<double>(total());
    }
  }

  // One training step's time on rank 0 (s.run is collective: every worker's steps align).
  // mode: 0 compute only, 1 all-reduce only, 2 compute then blocking all-reduce, 3 bucketed.
  double step(int mode, std::size_t cap_bytes) {
    const auto t0 = clock_type::now();
    s.run([&](auto& ctx) {
      const std::size_t me = static_cast<std::size_t>(ctx.replica_id_in_sync_group() % replicas);
      // Each tensor's compute starts when the previous ready() has returned: what a start does on
      // the replica's thread (devices::Threads reduces there) lengthens the step, as it would
      // with real compute.
      auto backward = [&](auto&& done) {
        for (std::size_t j = 0; j < layers; ++j) {
          std::this_thread::sleep_until(clock_type::now() + std::chrono::duration<double>(share[j]));
          done(layers - 1 - j);
        }
      };
      if (mode == 0) backward([](std::size_t) {});
      if (mode == 1) ctx.all_reduce(mirror::ReduceOp::sum, std::span<float>(flat[me]));
      if (mode == 2) {
        backward([](std::size_t) {});
        ctx.all_reduce(mirror::ReduceOp::sum, std::span<float>(flat[me]));
      }
      if (mode == 3) {
        auto buckets = ctx.gradient_buckets(mirror::ReduceOp::sum, grads[me], cap_bytes);
        backward([&](std::size_t i) { buckets.ready(i); });
        buckets.finish();
      }
    });
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  }

  // Seconds per call of `iters` started-and-waited (or blocking) all-reduces of n floats.
  double calls(bool async, std::size_t n, long iters) {
    const auto t0 = clock_type::now();
    s.run([&](auto& ctx) {
      std::span<float> x(flat[static_cast<std::size_t>(ctx.replica_id_in_sync_group() % replicas)].data(), n);
      for (long k = 0; k < iters; ++k) {
        if (async) {
          ctx.all_reduce_async(mirror::ReduceOp::sum, x).wait();
        } else {
          ctx.all_reduce(mirror::ReduceOp::sum, x);
        }
      }
    });
    return std::chrono::duration<double>(clock_type::now() - t0).count() / static_cast<double>(iters);
  }
};

template <class S>
int measure(S& s, int replicas, int rank, int rounds, double factor, const std::vector<double>& caps_mib,
            const char* device, bool quick) {
  bench<S> b(s, replicas, rank, quick ? 64 : 1);
  std::vector<double> comm0;
  for (int i = 0; i < 3; ++i) comm0.push_back(b.step(1, 0));
  double comm_time = median(comm0);
  MPI_Bcast(&comm_time, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);  // every worker computes alike
  b.set_compute(factor * comm_time);
  const std::size_t nc = caps_mib.size();
  std::vector<std::vector<double>> t(3 + nc);
  for (int r = 0; r < rounds; ++r) {
    for (int mode = 0; mode < 3; ++mode) t[static_cast<std::size_t>(mode)].push_back(b.step(mode, 0));
    for (std::size_t c = 0; c < nc; ++c) {
      t[3 + c].push_back(b.step(3, static_cast<std::size_t>(caps_mib[c] * 1048576.0)));
    }
  }
  // Per round: exposed = (step - compute) / comm of that round; medians and ranges over rounds.
  auto exposed = [&](std::size_t row) {
    std::vector<double> e;
    for (int r = 0; r < rounds; ++r) {
      const std::size_t i = static_cast<std::size_t>(r);
      e.push_back((t[row][i] - t[0][i]) / t[1][i]);
    }
    return e;
  };
  if (rank == 0) {
    std::printf("\n%s; ResNet-50 gradients, %zu tensors, %.1f MB; compute = %.2fx the all-reduce (a timed wait); "
                "%d rounds\n\n",
                device, layers, static_cast<double>(b.total()) * 4 / 1e6, factor, rounds);
    std::printf("| step | time (ms), median [range] | exposed communication, median [range] |\n|---|---:|---:|\n");
    auto row = [&](const char* name, std::size_t i, bool with_exposed) {
      const auto& v = t[i];
      std::printf("| %s | %.1f [%.1f-%.1f] |", name, 1e3 * median(v), 1e3 * *std::min_element(v.begin(), v.end()),
                  1e3 * *std::max_element(v.begin(), v.end()));
      if (with_exposed) {
        const auto e = exposed(i);
        std::printf(" %.0f %% [%.0f-%.0f] |\n", 100 * median(e), 100 * *std::min_element(e.begin(), e.end()),
                    100 * *std::max_element(e.begin(), e.end()));
      } else {
        std::printf(" |\n");
      }
    };
    row("compute only", 0, false);
    row("all-reduce only", 1, false);
    row("blocking: compute, then all-reduce", 2, true);
    for (std::size_t c = 0; c < nc; ++c) {
      const std::string name = "buckets of " + std::to_string(static_cast<int>(caps_mib[c])) + " MiB";
      row(name.c_str(), 3 + c, true);
    }
  }
  // The non-blocking form with nothing to overlap, alternated with the blocking form.
  for (const std::size_t bytes : {std::size_t{4}, quick ? std::size_t{1} << 20 : std::size_t{64} << 20}) {
    const std::size_t n = std::min(bytes / 4, b.total());
    const long iters = bytes <= 4 ? (quick ? 500 : 20000) : 5;
    std::vector<double> ratio, blocking;
    for (int r = 0; r < rounds; ++r) {
      const double a = b.calls(false, n, iters), c = b.calls(true, n, iters);
      blocking.push_back(a);
      ratio.push_back(c / a);
    }
    if (rank == 0) {
      std::printf("\nall_reduce_async + wait against all_reduce, %zu B: blocking %.2f us, ratio %.3f [%.3f-%.3f]\n",
                  bytes, 1e6 * median(blocking), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                  *std::max_element(ratio.begin(), ratio.end()));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int replicas = 1, rounds = 5;
  double factor = 1.5;
  bool threads = false, validate = true, quick = false;
  std::vector<double> caps{1, 4, 16, 25, 64};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--replicas") && i + 1 < argc) {
      replicas = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--factor") && i + 1 < argc) {
      factor = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--no-validate")) {
      validate = false;  // Cluster{.validate_shapes = false}: no cross-worker agreement checks
    } else if (!std::strcmp(argv[i], "--threads")) {
      threads = true;
    } else if (!std::strcmp(argv[i], "--caps") && i + 1 < argc) {
      caps.clear();
      for (char* p = argv[++i]; *p != '\0';) {
        caps.push_back(std::strtod(p, &p));
        if (*p == ',') ++p;
      }
    } else {
      if (rank == 0) std::fprintf(stderr, "overlap_bench: unknown argument '%s' (see the file comment)\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  int rc = 0;
  if (threads) {
    mirror::Strategy<mirror::devices::Threads> s(mirror::devices::Threads{.replicas = replicas});
    const std::string device = "devices::Threads, " + std::to_string(replicas) + " replicas";
    rc = measure(s, replicas, rank, rounds, factor, caps, device.c_str(), quick);
  } else {
    using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
    mirror::Strategy<Cluster> s(Cluster{.local = {.replicas = replicas}, .validate_shapes = validate});
    const std::string device = "devices::Cluster<Threads>, " + std::to_string(size) + " workers x " +
                               std::to_string(replicas) + " replicas";
    rc = measure(s, replicas, rank, rounds, factor, caps, device.c_str(), quick);
  }
  MPI_Finalize();
  return rc;
}
