// SPDX-License-Identifier: Apache-2.0
// Communication hidden behind computation (docs/performance.md#overlap): a training step with
// ResNet-50's gradient profile (its 161 parameter tensors, 25.6 M floats, 102 MB), whose backward
// pass produces the tensors in reverse order, each after a fixed compute time.
//
//   mpirun -np 2 build/bench/overlap_bench [--replicas R] [--rounds N] [--factor F] [--caps MiB,...] [--sharded-cap MiB]
//                                          [--no-validate] [--quick]
// --quick (the smoke test): every tensor 1/64 of its size, and the overhead part short.
//   build/bench/overlap_bench --threads [--replicas R] ...        (devices::Threads, one process)
//   build/bench/overlap_bench --threads --alternatives [--rounds N] [--cap MiB] (one process)
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
//   scatter    one blocking reduce-scatter of the flat gradient (update_sharded's collective)
//   sharded    backward with the sharded buckets (mirror::sharded) of --sharded-cap MiB (16)
// exposed = (step - compute) / comm: the share of the all-reduce's time the step still pays (for
// the sharded buckets: of the reduce-scatter's).
// Then the non-blocking form's own cost with nothing to overlap: all_reduce_async + wait against
// all_reduce, at 4 B and 64 MiB, alternated in one run.
// Rank 0 prints a markdown table of medians and ranges over the rounds.
//
// --alternatives: what overlap could mean on devices::Threads, whose replicas' own threads
// reduce. Against mirror's choice (a bucket's all-reduce completes inside its start call), a
// helper thread that reduces each bucket while the replicas compute (the design mirror did not
// take: a bucket is ready once every replica has marked its tensors; the helper, parked on an
// atomic until then, sums the replicas' slices in 4096-float blocks and writes the sum back into
// every replica's buffer). Both with the timed-wait compute above and with real compute (a fixed
// count of dependent multiply-adds per tensor, calibrated alone to the same time), which needs
// the cores the helper would use.
#include <mirror/mirror.hpp>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include "median.hpp"

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

using bench::median;

template <class S>
struct bench {
  S& s;
  int replicas;
  int rank;
  std::vector<std::size_t> sizes;
  std::vector<std::vector<float>> flat;  // per local replica
  std::vector<Grads> grads;
  std::vector<double> share;             // seconds of compute per tensor (backward order)
  bool busy = false;                     // compute is arithmetic (work), not a timed wait
  double work_per_second = 0;            // multiply-adds per second on one core, alone

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

  // `seconds` of compute: a timed wait, or that much arithmetic as measured alone.
  void compute(double seconds) const {
    if (!busy) {
      std::this_thread::sleep_until(clock_type::now() + std::chrono::duration<double>(seconds));
      return;
    }
    work(static_cast<long>(seconds * work_per_second));
  }
  static float work(long n) {
    volatile float sink = 0;
    float x = 1.0f;
    for (long i = 0; i < n; ++i) x = x * 0.999999f + 1e-7f;
    sink = x;
    return sink;
  }
  void calibrate() {
    const long n = 20'000'000;
    const auto t0 = clock_type::now();
    work(n);
    work_per_second = static_cast<double>(n) / std::chrono::duration<double>(clock_type::now() - t0).count();
  }

  // The helper-thread alternative (--alternatives): buckets of whole tensors from the last
  // backwards, as GradientBuckets cuts them, each a contiguous range of the flat buffers.
  struct helper_plan {
    std::vector<std::size_t> bucket_of;                  // per tensor
    std::vector<std::pair<std::size_t, std::size_t>> range;  // per bucket, [first, end) of flat
    std::vector<std::size_t> tensors;                    // per bucket
  };
  helper_plan plan(std::size_t cap_bytes) const {
    helper_plan p;
    p.bucket_of.assign(layers, 0);
    std::vector<std::size_t> offset(layers + 1, 0);
    for (std::size_t k = 0; k < layers; ++k) offset[k + 1] = offset[k] + sizes[k];
    std::size_t k = layers;
    while (k > 0) {
      const std::size_t end = offset[k];
      std::size_t bytes = 0, count = 0;
      do {
        --k;
        bytes += sizes[k] * 4;
        p.bucket_of[k] = p.range.size();
        ++count;
      } while (k > 0 && bytes < cap_bytes);
      p.range.emplace_back(offset[k], end);
      p.tensors.push_back(count);
    }
    return p;
  }
  double helper_step(const helper_plan& p) {
    std::vector<std::atomic<std::size_t>> marked(p.range.size());
    for (auto& m : marked) m.store(0);
    const auto t0 = clock_type::now();
    std::thread helper([&] {
      for (std::size_t b = 0; b < p.range.size(); ++b) {
        const std::size_t want = p.tensors[b] * static_cast<std::size_t>(replicas);
        for (std::size_t seen = marked[b].load(); seen != want; seen = marked[b].load()) marked[b].wait(seen);
        for (std::size_t lo = p.range[b].first; lo < p.range[b].second; lo += 4096) {
          const std::size_t hi = std::min(lo + 4096, p.range[b].second);
          float* const first = flat[0].data();
          for (int q = 1; q < replicas; ++q) {
            const float* const other = flat[static_cast<std::size_t>(q)].data();
            for (std::size_t i = lo; i < hi; ++i) first[i] += other[i];
          }
          for (int q = 1; q < replicas; ++q) {
            std::memcpy(flat[static_cast<std::size_t>(q)].data() + lo, first + lo, (hi - lo) * sizeof(float));
          }
        }
      }
    });
    s.run([&](auto&) {
      for (std::size_t j = 0; j < layers; ++j) {
        compute(share[j]);
        std::atomic<std::size_t>& m = marked[p.bucket_of[layers - 1 - j]];
        m.fetch_add(1);
        m.notify_one();
      }
    });
    helper.join();
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  }

  // One training step's time on rank 0 (s.run is collective: every worker's steps align).
  // mode: 0 compute only, 1 all-reduce only, 2 compute then blocking all-reduce, 3 bucketed,
  // 4 reduce-scatter only, 5 sharded buckets.
  double step(int mode, std::size_t cap_bytes) {
    const auto t0 = clock_type::now();
    s.run([&](auto& ctx) {
      const std::size_t me = static_cast<std::size_t>(ctx.replica_id_in_sync_group() % replicas);
      // Each tensor's compute starts when the previous ready() has returned: what a start does on
      // the replica's thread (devices::Threads reduces there) lengthens the step, as it would
      // with real compute.
      auto backward = [&](auto&& done) {
        for (std::size_t j = 0; j < layers; ++j) {
          compute(share[j]);
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
      if (mode == 4) ctx.reduce_scatter(mirror::ReduceOp::sum, std::span<float>(flat[me]));
      if (mode == 5) {
        auto buckets = ctx.gradient_buckets(mirror::ReduceOp::sum, grads[me], cap_bytes, mirror::sharded);
        backward([&](std::size_t i) { buckets.ready(i); });
        (void)buckets.finish();
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
            double sharded_mib, const char* device, bool quick) {
  bench<S> b(s, replicas, rank, quick ? 64 : 1);
  std::vector<double> comm0;
  for (int i = 0; i < 3; ++i) comm0.push_back(b.step(1, 0));
  double comm_time = median(comm0);
  MPI_Bcast(&comm_time, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);  // every worker computes alike
  b.set_compute(factor * comm_time);
  const std::size_t nc = caps_mib.size();
  std::vector<std::vector<double>> t(5 + nc);
  const std::size_t scatter = 3 + nc, sharded = 4 + nc;  // rows
  for (int r = 0; r < rounds; ++r) {
    for (int mode = 0; mode < 3; ++mode) t[static_cast<std::size_t>(mode)].push_back(b.step(mode, 0));
    for (std::size_t c = 0; c < nc; ++c) {
      t[3 + c].push_back(b.step(3, static_cast<std::size_t>(caps_mib[c] * 1048576.0)));
    }
    t[scatter].push_back(b.step(4, 0));
    t[sharded].push_back(b.step(5, static_cast<std::size_t>(sharded_mib * 1048576.0)));
  }
  // Per round: exposed = (step - compute) / comm of that round; medians and ranges over rounds.
  auto exposed = [&](std::size_t row) {
    const std::size_t base = row == sharded ? scatter : 1;
    std::vector<double> e;
    for (int r = 0; r < rounds; ++r) {
      const std::size_t i = static_cast<std::size_t>(r);
      e.push_back((t[row][i] - t[0][i]) / t[base][i]);
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
    row("reduce-scatter only", scatter, false);
    const std::string name = "sharded buckets of " + std::to_string(static_cast<int>(sharded_mib)) +
                             " MiB (of the reduce-scatter)";
    row(name.c_str(), sharded, true);
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

// --alternatives: mirror's Threads buckets against the helper-thread design, with timed-wait and
// with real compute, alternated per round.
template <class S>
int alternatives(S& s, int replicas, int rounds, double factor, double cap_mib) {
  bench<S> b(s, replicas, 0, 1);
  b.calibrate();
  std::vector<double> comm0;
  for (int i = 0; i < 3; ++i) comm0.push_back(b.step(1, 0));
  b.set_compute(factor * median(comm0));
  const auto cap = static_cast<std::size_t>(cap_mib * 1048576.0);
  const auto p = b.plan(cap);
  std::printf("\ndevices::Threads, %d replicas; ResNet-50 gradients, %.1f MB; compute = %.2fx the all-reduce; "
              "buckets of %g MiB (%zu); %d rounds; exposed = (step - compute) / all-reduce\n\n",
              replicas, static_cast<double>(b.total()) * 4 / 1e6, factor, cap_mib, p.range.size(), rounds);
  std::printf("| compute | step | time (ms), median [range] | exposed communication, median [range] |\n"
              "|---|---|---:|---:|\n");
  for (const bool busy : {false, true}) {
    b.busy = busy;
    std::vector<std::vector<double>> t(5);
    for (int r = 0; r < rounds; ++r) {
      t[0].push_back(b.step(0, 0));
      t[1].push_back(b.step(1, 0));
      t[2].push_back(b.step(2, 0));
      t[3].push_back(b.step(3, cap));
      t[4].push_back(b.helper_step(p));
    }
    const char* names[] = {"compute only", "all-reduce only", "blocking: compute, then all-reduce",
                           "mirror's buckets (reduced in the start call)", "helper thread reduces each bucket"};
    for (std::size_t row = 0; row < 5; ++row) {
      const auto& v = t[row];
      std::printf("| %s | %s | %.1f [%.1f-%.1f] |", busy ? "arithmetic" : "timed wait", names[row], 1e3 * median(v),
                  1e3 * *std::min_element(v.begin(), v.end()), 1e3 * *std::max_element(v.begin(), v.end()));
      if (row >= 2) {
        std::vector<double> e;
        for (std::size_t i = 0; i < v.size(); ++i) e.push_back((v[i] - t[0][i]) / t[1][i]);
        std::printf(" %.0f %% [%.0f-%.0f] |\n", 100 * median(e), 100 * *std::min_element(e.begin(), e.end()),
                    100 * *std::max_element(e.begin(), e.end()));
      } else {
        std::printf(" |\n");
      }
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
  bool threads = false, validate = true, quick = false, alternative = false;
  double cap_mib = 25, sharded_mib = 16;
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
    } else if (!std::strcmp(argv[i], "--alternatives")) {
      alternative = true;
    } else if (!std::strcmp(argv[i], "--cap") && i + 1 < argc) {
      cap_mib = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--sharded-cap") && i + 1 < argc) {
      sharded_mib = std::atof(argv[++i]);
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
    rc = alternative ? alternatives(s, replicas, rounds, factor, cap_mib)
                     : measure(s, replicas, rank, rounds, factor, caps, sharded_mib, device.c_str(), quick);
  } else {
    using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
    mirror::Strategy<Cluster> s(Cluster{.local = {.replicas = replicas}, .validate_shapes = validate});
    const std::string device = "devices::Cluster<Threads>, " + std::to_string(size) + " workers x " +
                               std::to_string(replicas) + " replicas";
    rc = measure(s, replicas, rank, rounds, factor, caps, sharded_mib, device.c_str(), quick);
  }
  MPI_Finalize();
  return rc;
}
