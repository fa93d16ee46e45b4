// SPDX-License-Identifier: Apache-2.0
// devices::Cluster<devices::Cuda> under mpirun, one process per GPU (run_mpi_gpu.sh): NCCL
// communicators spanning every GPU of every worker, bootstrapped over MPI, plus the host-side
// cross-worker paths (Strategy::reduce of host values, variables' initial broadcast). Without a
// GPU every process prints a SKIP line and exits 77 before MPI starts (skip_without_gpu.cpp).
// Values are small integers, so sums, products, minima and maxima are exact in every element
// type and compared bit for bit with a serial reference computed here in double; a floating mean
// (ncclAvg pre-multiplies by 1/N) is compared within the type's rounding.
// The GPU kit also runs it with 2 and 3 processes on one GPU (distinct NCCL_HOSTIDs, run.sh),
// and runs the hidden case [.kill] alone: a worker that dies mid-run.
#include <catch2/catch.hpp>
#include <mirror/mirror.hpp>
#include "support/half_float.hpp"
#if MIRROR_TEST_FAKE_NCCL
#include "support/fake_nccl.hpp"
#endif

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if MIRROR_HAS_NCCL && MIRROR_HAS_MPI
namespace {

using mirror::ReduceOp;
using Cluster = mirror::devices::Cluster<mirror::devices::Cuda>;
static_assert(std::is_same_v<mirror::default_ops_t<Cluster>, mirror::ops::NcclAllReduce>);

// This process's GPU: its rank on the host (Open MPI, MPICH, Slurm) modulo the GPUs it sees, so
// workers on one host never share a GPU (NCCL refuses that).
int my_gpu() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v) % mirror::cuda::device_count();
  }
  return 0;
}

Cluster cluster(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return Cluster{.local = {.gpus = {my_gpu()}, .timeout = timeout}, .timeout = timeout};
}

// Element i of global replica g: small integers, so every sum is exact in float.
float value(int g, std::size_t i) { return float((g + 1) * static_cast<int>(i % 7 + 1)); }

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

template <class E>
E to_element(double v) {
  if constexpr (std::is_same_v<E, mirror::cuda::half> || std::is_same_v<E, mirror::cuda::bfloat16>) {
    return mirror::test::from_float<E>(float(v));
  } else {
    return static_cast<E>(v);
  }
}
template <class E>
double from_element(E e) {
  if constexpr (std::is_same_v<E, mirror::cuda::half> || std::is_same_v<E, mirror::cuda::bfloat16>) {
    return mirror::test::to_float(e);
  } else {
    return static_cast<double>(e);
  }
}
// Relative tolerance of a floating mean (ncclAvg: a sum of inputs pre-multiplied by 1/N, each
// rounded to E); 0: exact.
template <class E>
double mean_tolerance() {
  if constexpr (std::is_integral_v<E>) {
    return 0;
  } else if constexpr (std::is_same_v<E, float>) {
    return 1e-6;
  } else if constexpr (std::is_same_v<E, double>) {
    return 1e-14;
  } else if constexpr (std::is_same_v<E, mirror::cuda::half>) {
    return 4e-3;
  } else {
    return 3e-2;  // bfloat16: 8 bits of mantissa
  }
}

// Element i of global replica g for op: 1..3 (1..2 for prod, so that N up to 8 stays exact in
// half).
double input(ReduceOp op, int g, std::size_t i) {
  return op == ReduceOp::prod ? double((static_cast<std::size_t>(g) + i) % 2 + 1)
                              : double((static_cast<std::size_t>(g) * 5 + i) % 3 + 1);
}

// The serial reference over N global replicas, in replica order; mean of integers divides as
// C++ does.
template <class E>
double reference(ReduceOp op, int N, std::size_t i) {
  double acc = input(op, 0, i);
  for (int g = 1; g < N; ++g) {
    const double v = input(op, g, i);
    switch (op) {
      case ReduceOp::sum: case ReduceOp::mean: acc += v; break;
      case ReduceOp::prod: acc *= v; break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::max: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::mean) {
    if constexpr (std::is_integral_v<E>) return double(static_cast<E>(acc) / static_cast<E>(N));
    return acc / N;
  }
  return acc;
}

const char* name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::mean: return "mean";
  }
  return "?";
}

template <class E>
std::vector<E> inputs_of(ReduceOp op, int g, std::size_t n) {
  std::vector<E> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = to_element<E>(input(op, g, i));
  return v;
}

// Every op on an in-place device leaf of E (one replica per worker).
template <class E>
void all_reduce_every_op(mirror::Strategy<Cluster>& s, const char* type) {
  const int N = s.num_replicas_in_sync();
  const int g = s.worker_index();  // one replica per worker: its global id
  constexpr std::size_t n = 4099;   // not a multiple of a packing or a warp
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::mean}) {
    CAPTURE(type, name_of(op), N);
    mirror::cuda::device_buffer<E> b(s.runtime().device_of(0), n);
    b.upload(inputs_of<E>(op, g, n));
    s.run([&](auto& ctx) { ctx.all_reduce(op, b.span()); });
    s.runtime().synchronize(0);
    std::vector<E> got(n);
    b.download(got);
    const double tol = op == ReduceOp::mean && !power_of_two(N) ? mean_tolerance<E>() : 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double want = reference<E>(op, N, i);
      const double have = from_element(got[i]);
      if (tol == 0) {  // exact: the reference rounded to E once
        CAPTURE(i, want, have);
        REQUIRE(have == from_element(to_element<E>(want)));
      } else {
        CAPTURE(i, want, have);
        REQUIRE(std::abs(have - want) <= tol * std::abs(want));
      }
    }
  }
}

// First element and length of replica r's cut of n over N (the batch-split rule: the first n mod
// N replicas one element more), written out here rather than taken from mirror.
std::pair<std::size_t, std::size_t> cut(std::size_t n, int N, int r) {
  const std::size_t base = n / static_cast<std::size_t>(N), extra = n % static_cast<std::size_t>(N);
  const auto ur = static_cast<std::size_t>(r);
  return {ur * base + std::min(ur, extra), base + (ur < extra ? 1 : 0)};
}

}  // namespace

TEST_CASE("cluster<cuda>: one NCCL communicator per GPU spans every worker", "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  const int W = s.num_workers();
  REQUIRE(s.num_local_replicas() == 1);
  REQUIRE(s.num_replicas_in_sync() == W);
  const int N = s.num_replicas_in_sync();
  const int first = s.worker_index() * s.num_local_replicas();

  constexpr std::size_t n = (std::size_t{1} << 16) + 5;
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
    std::vector<mirror::cuda::device_buffer<float>> buffers;
    std::vector<mirror::cuda::device_buffer<float>> seconds;  // a second leaf: NcclAllReduce packs them
    for (int r = 0; r < s.num_local_replicas(); ++r) {
      std::vector<float> host(n), other(n / 3);
      for (std::size_t i = 0; i < n; ++i) host[i] = value(first + r, i);
      for (std::size_t i = 0; i < other.size(); ++i) other[i] = value(first + r, i + 3);
      buffers.emplace_back(s.runtime().device_of(r), n);
      buffers.back().upload(host);
      seconds.emplace_back(s.runtime().device_of(r), other.size());
      seconds.back().upload(other);
    }
    s.run([&](auto& ctx) {
      const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group() - first);
      ctx.all_reduce(op, std::tuple{buffers[r].span(), seconds[r].span()});
    });
    // The serial reference: global replicas in order.
    std::vector<float> want(n), want2(n / 3);
    for (int g = 0; g < N; ++g) {
      for (std::size_t i = 0; i < n; ++i) want[i] += value(g, i);
      for (std::size_t i = 0; i < want2.size(); ++i) want2[i] += value(g, i + 3);
    }
    for (int r = 0; r < s.num_local_replicas(); ++r) {
      std::vector<float> got(n), got2(n / 3);
      buffers[static_cast<std::size_t>(r)].download(got);
      seconds[static_cast<std::size_t>(r)].download(got2);
      if (op == ReduceOp::sum) {
        REQUIRE(got == want);
        REQUIRE(got2 == want2);
      } else {
        // ncclAvg pre-multiplies by 1/N: exact (bit for bit) when N is a power of two.
        for (std::size_t i = 0; i < n; ++i) {
          const float m = want[i] / float(N);
          if (power_of_two(N)) {
            REQUIRE(got[i] == m);
          } else {
            REQUIRE(got[i] == Approx(m).epsilon(1e-6));
          }
        }
      }
    }
  }

  // Integer mean: sum, then divided as C++ divides, by W*G (not by the local count).
  const auto means = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::mean, 2 * ctx.replica_id_in_sync_group() + 1); });
  REQUIRE(means.primary() == (N * N) / N);  // sum of the first N odd numbers is N*N
  const auto sums = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, ctx.replica_id_in_sync_group() + 1); });
  REQUIRE(sums.primary() == N * (N + 1) / 2);
}

TEST_CASE("cluster<cuda>: Strategy::reduce of host values spans every worker", "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  const int N = s.num_replicas_in_sync();
  const auto per_replica = s.run([](auto& ctx) {
    return std::vector<float>{float(ctx.replica_id_in_sync_group() + 1), 2.0f};
  });
  const std::vector<float> total = s.reduce(ReduceOp::sum, per_replica);
  REQUIRE(total == std::vector<float>{float(N * (N + 1) / 2), float(2 * N)});
  const std::vector<float> mean = s.reduce(ReduceOp::mean, per_replica);
  REQUIRE(mean == std::vector<float>{float(N * (N + 1) / 2) / float(N), 2.0f});
}

TEST_CASE("cluster<cuda>: variables start as the chief's initial value on every worker", "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  // Every worker passes its own init (an unseeded initialiser); the chief's wins.
  auto v = s.make_variable(std::vector<float>{float(s.worker_index()), 7.0f}, mirror::VariableAggregation::sum);
  for (const auto& copy : mirror::Strategy<Cluster>::local_results(v)) REQUIRE(copy == std::vector<float>{0.0f, 7.0f});
  const auto b = s.broadcast(std::vector<int>{s.worker_index() + 10});
  REQUIRE(b.primary() == std::vector<int>{10});
}
#endif

#if MIRROR_HAS_NCCL && MIRROR_HAS_MPI
TEST_CASE("cluster<cuda>: all_reduce of every op and element type on device leaves matches a serial reference",
          "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  REQUIRE(s.num_local_replicas() == 1);
  all_reduce_every_op<float>(s, "float");
  all_reduce_every_op<double>(s, "double");
  all_reduce_every_op<std::int32_t>(s, "int32");
  all_reduce_every_op<std::int64_t>(s, "int64");
  all_reduce_every_op<mirror::cuda::half>(s, "half");
  all_reduce_every_op<mirror::cuda::bfloat16>(s, "bfloat16");
}

TEST_CASE("cluster<cuda>: reduce_scatter of a device leaf, length a multiple of N and ragged, in place",
          "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  const int N = s.num_replicas_in_sync(), g = s.worker_index();
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::mean}) {
    // 1000 N: NCCL reduce-scatters the leaf itself; +1 and +N-1: through the padded scratch
    for (const std::size_t n : {std::size_t(1000) * N, std::size_t(1000) * N + 1, std::size_t(1000) * N + N - 1}) {
      CAPTURE(name_of(op), n, N);
      const std::vector<float> mine = inputs_of<float>(op, g, n);
      mirror::cuda::device_buffer<float> b(s.runtime().device_of(0), n);
      b.upload(mine);
      s.run([&](auto& ctx) {
        const auto d = b.span();
        (void)ctx.reduce_scatter(op, std::span<float>(d.data, d.size));
      });
      s.runtime().synchronize(0);
      std::vector<float> got(n);
      b.download(got);
      const auto [first, count] = cut(n, N, g);
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i, first, count);
        if (i < first || i >= first + count) {
          REQUIRE(got[i] == mine[i]);  // outside the cut: untouched
        } else if (op == ReduceOp::mean && !power_of_two(N)) {
          REQUIRE(got[i] == Approx(reference<float>(op, N, i)).epsilon(1e-6));
        } else {
          REQUIRE(got[i] == float(reference<float>(op, N, i)));
        }
      }
    }
  }
}

TEST_CASE("cluster<cuda>: all_gather of device spans with a different length on every worker",
          "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  const int N = s.num_replicas_in_sync(), g = s.worker_index();
  auto length = [](int w) { return std::size_t(1000) + std::size_t(17) * static_cast<std::size_t>(w); };
  auto element = [](int w, std::size_t i) { return float(w * 100000) + float(i); };
  std::vector<float> want;
  for (int w = 0; w < N; ++w) {
    for (std::size_t i = 0; i < length(w); ++i) want.push_back(element(w, i));
  }
  std::vector<float> mine(length(g));
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = element(g, i);
  mirror::cuda::device_buffer<float> in(s.runtime().device_of(0), mine.size()), out(s.runtime().device_of(0), want.size());
  in.upload(mine);
  s.run([&](auto& ctx) {
    const auto i = in.span();
    const auto o = out.span();
    ctx.all_gather(std::span<const float>(i.data, i.size), std::span<float>(o.data, o.size), mirror::axis0);
  });
  s.runtime().synchronize(0);
  std::vector<float> got(want.size());
  out.download(got);
  REQUIRE(got == want);
}

TEST_CASE("cluster<cuda>: broadcast in fn from the last worker reaches every worker", "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  const int N = s.num_replicas_in_sync();
  const auto got = s.run([&](auto& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    return *ctx.broadcast(std::vector<int>{g, 10 * g, 7}, N - 1);
  });
  for (const auto& v : got) REQUIRE(v == std::vector<int>{N - 1, 10 * (N - 1), 7});
}

TEST_CASE("cluster<cuda>: after an exception in fn on one worker every worker's run throws and the next run works",
          "[mpi][gpu][cluster_cuda]") {
  mirror::Strategy<Cluster> s{cluster()};
  const int N = s.num_replicas_in_sync(), g = s.worker_index();
  const int thrower = N - 1;
  constexpr std::size_t n = 1 << 14;
  mirror::cuda::device_buffer<float> b(s.runtime().device_of(0), n);
  b.upload(std::vector<float>(n, float(g + 1)));
  try {
    s.run([&](auto& ctx) {
      ctx.all_reduce(ReduceOp::sum, b.span());  // one collective done, then the throw
      if (ctx.replica_id_in_sync_group() == thrower) throw std::runtime_error("boom on the last worker");
      ctx.all_reduce(ReduceOp::sum, b.span());
    });
    FAIL("no error");
  } catch (const mirror::replica_error& e) {
    CHECK(e.replica() == thrower);
    CHECK_THAT(std::string(e.what()), Catch::Contains("boom on the last worker"));
  }
  b.upload(std::vector<float>(n, float(g + 1)));
  s.run([&](auto& ctx) { ctx.all_reduce(ReduceOp::sum, b.span()); });
  s.runtime().synchronize(0);
  std::vector<float> got(n);
  b.download(got);
  REQUIRE(got == std::vector<float>(n, float(N * (N + 1) / 2)));
}

// Hidden (run only when named, by the GPU kit): the last worker dies (std::_Exit) in fn; the
// others must get an error naming it within the Cluster timeout. Nothing can complete with a
// dead worker afterwards (the strategy's teardown, MPI_Finalize): the strategy is left alive,
// and each survivor ends its own process 15 s after the failing run began, when its report is
// written. Whether the survivors get that far is Open MPI's choice: mpirun may end the whole job
// when a process dies (run.sh starts this case with --enable-recovery and says which happened).
TEST_CASE("cluster<cuda>: a worker that dies in fn is named by the others within the timeout",
          "[mpi][gpu][cluster_cuda][.kill]") {
  const auto timeout = std::chrono::seconds(5);
  auto& s = *new mirror::Strategy<Cluster>{cluster(timeout)};  // never destroyed (above)
  const int N = s.num_replicas_in_sync(), g = s.worker_index();
  REQUIRE(N >= 2);
  const int dead = N - 1;
  const auto warm = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
  REQUIRE(warm.primary() == N);
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(15));
    std::fflush(nullptr);
    std::_Exit(0);
  }).detach();
  constexpr std::size_t n = 1 << 16;
  mirror::cuda::device_buffer<float> b(s.runtime().device_of(0), n);
  const auto start = std::chrono::steady_clock::now();
  try {
    s.run([&](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == dead) {
        std::fflush(nullptr);
        std::_Exit(3);
      }
      ctx.all_reduce(ReduceOp::sum, b.span());
    });
    FAIL("no error on a survivor");
  } catch (const mirror::error& e) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CAPTURE(e.what(), t, g);
    CHECK_THAT(std::string(e.what()), Catch::Contains("{" + std::to_string(dead) + "}"));
    CHECK(t < 5.0 + 3.0);
  }
}
#if MIRROR_TEST_FAKE_NCCL
// Linked against the scripted CUDA runtime and NCCL (mpi_cluster_cuda_on_fake_1x): the cases above
// broke none of the rules it checks (Catch2 runs the cases in the order they are declared).
TEST_CASE("cluster<cuda> (fake GPUs): the cases above kept CUDA's and NCCL's rules", "[mpi][gpu][cluster_cuda]") {
  const auto seen = fake_nccl::snapshot();
  for (const auto& v : seen.violations) FAIL_CHECK(v);
  CHECK(seen.violations.empty());
  CHECK(seen.all_reduce_calls > 0);
}
#endif
#endif
