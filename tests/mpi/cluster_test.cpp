// SPDX-License-Identifier: Apache-2.0
// devices::Cluster<Threads> under mpirun (2 or 3 processes): the contract with N = W*R,
// checked against serial loops over the global replicas and against TF's multi-worker numbers
// (a case that reproduces a TF test names it). Every rank runs every case: the cases are
// collective.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdlib.h>  // mkdtemp
#include <limits>
#include <cmath>
#include <numeric>
#include <random>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>
#include <sched.h>

#include "mpi/mpi_world.hpp"  // world_size, world_rank; the tests compare with plain MPI calls
#include "support/reference.hpp"

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
using Strategy = mirror::Strategy<Cluster>;
using mirror::ReduceOp;

// The cases share one strategy (each construction is a collective over MPI_COMM_WORLD and
// starts a thread pool), rebuilt when a case asks for another local replica count. One at a
// time on purpose: Open MPI advances a non-blocking collective inside whichever thread calls
// MPI, so a second strategy's idle communication thread (polling its control communicator) can
// copy this one's data into its buffer. Open MPI orders that copy before the owner's MPI_Test
// with its own atomics, which ThreadSanitizer cannot see: it reports a race on the result in
// the sanitizer build (docs/install.md, Sanitizers).
std::unique_ptr<Strategy>& shared_strategy() {
  static std::unique_ptr<Strategy> s;
  return s;
}
void drop_shared_strategy() { shared_strategy().reset(); }
Strategy& strategy_with(int replicas) {
  auto& s = shared_strategy();
  if (!s || s->num_replicas_in_sync() != world_size() * replicas) {
    s.reset();  // before the next is built: never two
    // A 30 s timeout: a bug fails a case in 30 s instead of hanging.
    s = std::make_unique<Strategy>(Cluster{.local = {.replicas = replicas}, .timeout = std::chrono::seconds(30)});
  }
  return *s;
}

// Serial reference in the hierarchical order: each worker folds its replicas 0..R-1, then the
// workers' partials fold in worker order; mean divides once by W*R.
template <class T>
std::vector<T> hierarchical_reference(ReduceOp op, int W, int R, const std::vector<std::vector<T>>& inputs) {
  auto fold = [op](T a, T b) { return mirror::test::fold(op, a, b); };
  const std::size_t n = inputs[0].size();
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    T total{};
    for (int w = 0; w < W; ++w) {
      T part = inputs[static_cast<std::size_t>(w * R)][i];
      for (int r = 1; r < R; ++r) part = fold(part, inputs[static_cast<std::size_t>(w * R + r)][i]);
      total = w == 0 ? part : fold(total, part);
    }
    if (op == ReduceOp::mean) total = static_cast<T>(total / static_cast<T>(W * R));
    out[i] = total;
  }
  return out;
}

// Whether an all-reduce of `bytes` among the W workers of this launch folds in worker order by
// default: up to MIRROR_MPI_DIRECT_AGREEMENT workers (8 unless set), where it travels in the
// agreement check's messages or, up to 2 MiB, in two rounds of messages of its own
// (docs/multi-worker.md#bits).
bool worker_order_by_default(std::size_t bytes) {
  const char* set = std::getenv("MIRROR_MPI_DIRECT_AGREEMENT");
  const int direct = set != nullptr ? std::atoi(set) : 8;
  return world_size() <= direct && bytes <= (std::size_t{2} << 20);
}

}  // namespace

TEST_CASE("cluster: each worker's pool counts its share of the host's cores", "[mpi]") {
  // Workers on one host share its cores; a pool that counted them all would spin through the
  // time slices of its neighbours. Reference: when every worker on the host has the same mask
  // (tests launch with --bind-to none), the share is the mask's count over the host's workers.
  MPI_Comm host = MPI_COMM_NULL;
  REQUIRE(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host) == MPI_SUCCESS);
  int on_host = 1;
  MPI_Comm_size(host, &on_host);
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  std::vector<cpu_set_t> masks(static_cast<std::size_t>(on_host));
  MPI_Allgather(&mine, sizeof mine, MPI_BYTE, masks.data(), sizeof mine, MPI_BYTE, host);
  MPI_Comm_free(&host);
  const bool same = std::all_of(masks.begin(), masks.end(), [&](const cpu_set_t& m) { return CPU_EQUAL(&m, &mine); });
  drop_shared_strategy();
  mirror::mpi::group g{{.comm = {}, .local_replicas = 1, .timeout = std::chrono::seconds(30), .validate_shapes = true}};
  const unsigned cores = g.host_cores();
  CAPTURE(on_host, CPU_COUNT(&mine), cores);
  if (same) {
    CHECK(cores == std::max(1u, static_cast<unsigned>(CPU_COUNT(&mine) / on_host)));
  } else {
    CHECK(cores >= 1u);
    CHECK(cores <= static_cast<unsigned>(CPU_COUNT(&mine)));
  }
}

TEST_CASE("cluster: a non-positive timeout is an invalid_argument on every worker, and a later strategy works",
          "[mpi]") {
  // Thrown by the group's constructor after it allocated its state, which its owner (a complete
  // member by then) frees. The MPI runs keep LeakSanitizer off (Open MPI's own allocations);
  // with it on for this case alone, a detail::owned that did not delete shows a leak allocated
  // at group::group, and the real one none.
  for (const auto timeout : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5)}) {
    CAPTURE(timeout.count());
    try {
      Strategy bad{Cluster{.local = {.replicas = 1}, .timeout = timeout}};
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK(what.find("mirror::devices::Cluster{.timeout = " + std::to_string(timeout.count()) + " ms}") !=
            std::string::npos);
      CHECK(what.find("must be positive") != std::string::npos);
    }
  }
  Strategy& s = strategy_with(1);
  const auto total = s.reduce(mirror::ReduceOp::sum, s.run([](auto&) { return 1; }));
  CHECK(total == world_size());
}

TEST_CASE("cluster: ids, counts and roles", "[mpi]") {
  const int W = world_size(), w = world_rank();
  for (const int R : {1, 2}) {
    Strategy& s = strategy_with(R);
    CHECK(s.num_workers() == W);
    CHECK(s.worker_index() == w);
    CHECK(s.is_chief() == (w == 0));
    CHECK(s.num_replicas_in_sync() == W * R);
    CHECK(s.num_local_replicas() == R);
    const auto [ids, counts] = s.run([](auto& ctx) {
      return std::pair(ctx.replica_id_in_sync_group(), ctx.num_replicas_in_sync());
    });
    REQUIRE(ids.size() == static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      CHECK(ids[static_cast<std::size_t>(r)] == w * R + r);  // TF: id_in_cluster * R + local
      CHECK(counts[static_cast<std::size_t>(r)] == W * R);
    }
  }
}

TEMPLATE_TEST_CASE("cluster conformance: all_reduce equals a serial loop over the global replicas", "[mpi]", float,
                   double, std::int32_t, std::int64_t) {
  using T = TestType;
  const int W = world_size(), w = world_rank();
  for (const int R : {1, 2}) {
    Strategy& s = strategy_with(R);
    const int N = W * R;
    for (const std::size_t n : {std::size_t{1}, std::size_t{3}, static_cast<std::size_t>(17 * N + 1), std::size_t{1009}}) {
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(R, n, mirror::to_string(op));
        std::vector<std::vector<T>> inputs(static_cast<std::size_t>(N));
        for (int g = 0; g < N; ++g) inputs[static_cast<std::size_t>(g)] = mirror::test::input_vector<T>(op, g, n);
        const std::vector<T> flat = mirror::test::serial_reference<T>(op, N, n);
        const std::vector<T> staged = hierarchical_reference<T>(op, W, R, inputs);
        // Small integers: every order gives the same exact values, so both references agree.
        REQUIRE(mirror::test::same_bits(flat.data(), staged.data(), n));
        std::atomic<int> wrong{0};
        s.run([&](auto& ctx) {
          const auto out = ctx.all_reduce(op, inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
          if (!mirror::test::same_bits(out->data(), flat.data(), n)) ++wrong;
        });
        CHECK(wrong == 0);
      }
    }
    (void)w;
  }
}

// The agreement check's message carries up to 112 bytes of a reduction's elements
// (backends/mpi/group/agreement_slot.hpp), and up to 4016 bytes where it is direct messages (a
// wide check, up to 8 workers: group/impl.hpp); beyond that, up to 4016 bytes of each worker's
// cut (a check of cuts, then an all-gather of the folded cuts): the counts around every edge take
// each path. Inputs
// are chosen so that every order gives the same bits (the order is the next cases'), and narrow
// or unsigned integers wrap around: Open MPI 4.1's own sums of 1- and 2-byte integers saturate on
// AVX-512 hosts, which mirror must not inherit (this case fails there with MPI_SUM).
TEMPLATE_TEST_CASE("cluster: small reductions in the agreement check's message equal the serial loop, every kind and op",
                   "[mpi]", float, double, std::int8_t, std::uint8_t, std::int16_t, std::uint16_t, std::int32_t,
                   std::uint32_t, std::int64_t, std::uint64_t) {
  using T = TestType;
  constexpr std::size_t slot = 112 / sizeof(T), wide = 4016 / sizeof(T);
  const int W = world_size();
  // Wrapping products and sums where the reference wraps without undefined behaviour: types
  // narrower than int (promoted, then converted back) and unsigned ones.
  constexpr bool wraps = std::is_integral_v<T> && (sizeof(T) < sizeof(int) || std::is_unsigned_v<T>);
  for (const bool validate : {true, false}) {
    drop_shared_strategy();
    for (const int R : {1, 2}) {
      const int N = W * R;
      Strategy s{Cluster{.local = {.replicas = R}, .timeout = std::chrono::seconds(30), .validate_shapes = validate}};
      const std::size_t cuts = static_cast<std::size_t>(W) * wide;  // the largest all-reduce in cuts
      for (const std::size_t n : {std::size_t{1}, slot - 1, slot, slot + 1, wide - 1, wide, wide + 1, cuts, cuts + 1}) {
        for (const auto op : mirror::test::all_ops) {
          CAPTURE(validate, R, n, mirror::to_string(op));
          std::vector<std::vector<T>> inputs(static_cast<std::size_t>(N), std::vector<T>(n));
          for (int g = 0; g < N; ++g) {
            for (std::size_t i = 0; i < n; ++i) {
              inputs[static_cast<std::size_t>(g)][i] =
                  wraps ? static_cast<T>(9700 * g + 131 * static_cast<int>(i) + 60)
                        : mirror::test::input_vector<T>(op, g, n)[i];
            }
          }
          const std::vector<T> want = hierarchical_reference<T>(op, W, R, inputs);
          std::atomic<int> wrong{0};
          s.run([&](auto& ctx) {
            const auto g = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
            const auto out = ctx.all_reduce(op, inputs[g]);
            if (!mirror::test::same_bits(out->data(), want.data(), n)) ++wrong;
            std::vector<T> mine = inputs[g];  // the span form, in place
            ctx.all_reduce(op, std::span<T>(mine));
            if (!mirror::test::same_bits(mine.data(), want.data(), n)) ++wrong;
          });
          CHECK(wrong == 0);
        }
      }
    }
  }
}

TEST_CASE("cluster: local replica counts that differ across workers are an invalid_argument naming each worker's",
          "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  drop_shared_strategy();
  try {
    Strategy s{Cluster{.local = {.replicas = w == 0 ? 1 : 2}, .timeout = std::chrono::seconds(30)}};
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    std::string workers = "worker 0 has 1";
    for (int p = 1; p < W; ++p) workers += ", worker " + std::to_string(p) + " has 2";
    CHECK_THAT(std::string(e.what()), Catch::Contains("different numbers of local replicas (" + workers + ")"));
  }
  Strategy& s = strategy_with(1);  // the communicators were freed: a later strategy works
  CHECK(s.reduce(ReduceOp::sum, s.run([](auto&) { return 1; })) == W);
}

TEST_CASE("cluster: MIRROR_MPI_DIRECT_AGREEMENT out of range, or unequal across workers, is an invalid_argument",
          "[mpi][mismatch]") {
  const int w = world_rank();
  drop_shared_strategy();
  const char* before = std::getenv("MIRROR_MPI_DIRECT_AGREEMENT");
  const std::string kept = before != nullptr ? before : "";
  const auto restore = [&] {
    if (before != nullptr) {
      setenv("MIRROR_MPI_DIRECT_AGREEMENT", kept.c_str(), 1);
    } else {
      unsetenv("MIRROR_MPI_DIRECT_AGREEMENT");
    }
  };
  for (const char* bad : {"0", "65", "8x", "-3"}) {
    CAPTURE(bad);
    setenv("MIRROR_MPI_DIRECT_AGREEMENT", bad, 1);
    try {
      Strategy s{Cluster{.local = {.replicas = 1}, .timeout = std::chrono::seconds(30)}};
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains(std::string("MIRROR_MPI_DIRECT_AGREEMENT=") + bad) &&
                                            Catch::Contains("1 to 64"));
    }
  }
  setenv("MIRROR_MPI_DIRECT_AGREEMENT", w == 0 ? "2" : "5", 1);
  try {
    Strategy s{Cluster{.local = {.replicas = 1}, .timeout = std::chrono::seconds(30)}};
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("MIRROR_MPI_DIRECT_AGREEMENT differs between the workers") &&
                                          Catch::Contains(std::string("from 2 to 5; here ") + (w == 0 ? "2" : "5")));
  }
  restore();
  // Equal on every worker: accepted, and the strategy works.
  Strategy& s = strategy_with(1);
  CHECK(s.reduce(ReduceOp::sum, s.run([](auto&) { return 1; })) == world_size());
}

TEST_CASE("cluster: random floats: the same bits on every worker and run after run", "[mpi]") {
  // Up to 8 workers (MIRROR_MPI_DIRECT_AGREEMENT) and 2 MiB mirror folds in worker order itself,
  // so the result is bitwise the hierarchical serial loop. Beyond, the order is Open MPI's:
  // worker order for W <= 3 below 64 KiB (measured: np = 4 differs from a rank-order serial sum
  // in a third of the elements); from 64 KiB libnbc's ring, whose per-segment order is not
  // worker order for W = 3; W = 2 is one addition either way. Where it is not worker order the
  // result is within rounding of the loop — and in every case the same bits on every worker and
  // in every run.
  const int W = world_size();
  const int R = 2, N = W * R;
  Strategy& s = strategy_with(R);
  for (const std::size_t n : {std::size_t{4099}, std::size_t{100003}}) {
    std::vector<std::vector<float>> inputs(static_cast<std::size_t>(N), std::vector<float>(n));
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (auto& v : inputs) for (auto& x : v) x = dist(gen);  // same seed on every worker: same inputs
    for (const auto op : {ReduceOp::sum, ReduceOp::mean}) {
      CAPTURE(mirror::to_string(op), W, n);
      const auto want = hierarchical_reference<float>(op, W, R, inputs);
      std::vector<float> first_run;
      for (int rep = 0; rep < 2; ++rep) {
        std::vector<std::vector<float>> got(static_cast<std::size_t>(R));
        s.run([&](auto& ctx) {
          std::vector<float> mine = inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
          ctx.all_reduce(op, std::span<float>(mine));  // in place
          got[static_cast<std::size_t>(ctx.replica_id_in_sync_group() % R)] = std::move(mine);
        });
        CHECK(mirror::test::same_bits(got[0].data(), got[1].data(), n));
        if (rep == 0) first_run = got[0];
        CHECK(mirror::test::same_bits(got[0].data(), first_run.data(), n));
        if (worker_order_by_default(n * sizeof(float)) || W <= (n < 16384 ? 3 : 2)) {
          CHECK(mirror::test::same_bits(got[0].data(), want.data(), n));
        } else {
          double worst = 0;
          for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::abs(got[0][i] - want[i])));
          CHECK(worst <= 4.0 * N * std::numeric_limits<float>::epsilon() * N);
        }
        // Every worker holds the same bits: compare a checksum's min and max over workers.
        std::uint64_t h = 1469598103934665603ull;
        for (const float x : got[0]) {
          std::uint32_t b;
          std::memcpy(&b, &x, sizeof b);
          h = (h ^ b) * 1099511628211ull;
        }
        std::uint64_t lo = 0, hi = 0;
        MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        CHECK(lo == hi);
      }
    }
  }
}

TEST_CASE("cluster: MpiAllReduce{.deterministic} folds in worker order: the serial loop's bits at every size and W",
          "[mpi]") {
  // The default order is worker order only up to 8 workers and 2 MiB (the case above); beyond,
  // Open MPI's. With .deterministic the result is bitwise the hierarchical serial loop for any
  // W, size and MPI setting (this binary also runs over TCP, with 3 workers, and with the
  // agreement check as MPI_Iallreduce: MIRROR_MPI_DIRECT_AGREEMENT=2, where the default order
  // fails this case with 3 workers at 100003 floats).
  using Ops = mirror::ops::Hierarchical<mirror::ops::ChunkOwnerAllReduce, mirror::ops::MpiAllReduce>;
  using Ordered = mirror::Strategy<Cluster, Ops>;
  const int W = world_size();
  drop_shared_strategy();
  for (const int R : {1, 2}) {
    const int N = W * R;
    Ordered s{Cluster{.local = {.replicas = R}, .timeout = std::chrono::seconds(30)}, Ops{.cross = {.deterministic = true}}};
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1003},
                                std::size_t{4099}, std::size_t{100003}}) {
      std::vector<std::vector<float>> inputs(static_cast<std::size_t>(N), std::vector<float>(n));
      std::mt19937 gen(11);
      std::uniform_real_distribution<float> dist(-1.f, 1.f);
      for (auto& v : inputs) {
        for (auto& x : v) x = dist(gen) * std::exp2(float(int(gen() % 16)));  // magnitudes apart: order shows
      }
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(R, n, mirror::to_string(op));
        const auto want = hierarchical_reference<float>(op, W, R, inputs);
        std::atomic<int> wrong{0};
        s.run([&](auto& ctx) {
          std::vector<float> mine = inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
          ctx.all_reduce(op, std::span<float>(mine));  // one leaf: reduced in place
          if (!mirror::test::same_bits(mine.data(), want.data(), n)) ++wrong;
        });
        CHECK(wrong == 0);
      }
      // Several leaves go through the staging buffer; a double leaf as well.
      std::vector<std::vector<double>> doubles(static_cast<std::size_t>(N), std::vector<double>(n));
      for (auto& v : doubles) {
        for (auto& x : v) x = double(dist(gen)) * std::exp2(double(int(gen() % 40)));
      }
      const auto want_f = hierarchical_reference<float>(ReduceOp::sum, W, R, inputs);
      const auto want_d = hierarchical_reference<double>(ReduceOp::sum, W, R, doubles);
      std::atomic<int> wrong{0};
      s.run([&](auto& ctx) {
        const auto g = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
        const auto out = ctx.all_reduce(ReduceOp::sum, std::make_tuple(inputs[g], doubles[g]));
        if (!mirror::test::same_bits(std::get<0>(*out).data(), want_f.data(), n)) ++wrong;
        if (!mirror::test::same_bits(std::get<1>(*out).data(), want_d.data(), n)) ++wrong;
      });
      CHECK(wrong == 0);
      // Strategy::reduce of host values follows the same order.
      const auto per = s.run([&](auto& ctx) { return inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]; });
      const std::vector<float> reduced = s.reduce(ReduceOp::sum, per);
      CHECK(mirror::test::same_bits(reduced.data(), want_f.data(), n));
    }
  }
}

TEST_CASE("cluster: all-reduce and reduce-scatter of several leaves have the bits of the same elements in one span",
          "[mpi]") {
  // The cross step reduces several leaves where they lie, a whole MPI call's elements in one leaf,
  // and copies only the calls that span leaves (worker_group::all_reduce_leaves); MPI must see
  // the calls of the packed vector. Layouts: a few floats (they ride in the agreement check), a
  // piece that spans three leaves (one call; with 3 workers, by messages), the same within one
  // leaf, and 5.3 MB in three calls of which the first and last lie in one leaf and the middle
  // one spans four, an empty leaf among them. A
  // reduce-scatter of the same leaves reads them where they lie and writes each cut in place
  // (worker_group::reduce_scatter_leaves): each cut has the all-reduce's bits, the rest of each
  // span is left as it was.
  using Ops = mirror::ops::Hierarchical<mirror::ops::ChunkOwnerAllReduce, mirror::ops::MpiAllReduce>;
  using Ordered = mirror::Strategy<Cluster, Ops>;
  const int W = world_size();
  drop_shared_strategy();
  const std::vector<std::array<std::size_t, 4>> layouts = {{3, 0, 5, 1}, {70001, 5, 130003, 0}, {0, 90001, 0, 0}, {600001, 0, 5, 720011}};
  for (const bool deterministic : {false, true}) {
    for (const int R : {1, 2}) {
      const int N = W * R;
      Ordered s{Cluster{.local = {.replicas = R}, .timeout = std::chrono::seconds(30)},
                Ops{.cross = {.deterministic = deterministic}}};
      for (const auto& sizes : layouts) {
        const std::size_t n = sizes[0] + sizes[1] + sizes[2] + sizes[3];
        std::vector<std::vector<float>> inputs(static_cast<std::size_t>(N), std::vector<float>(n));
        std::mt19937 gen(5);
        std::uniform_real_distribution<float> dist(-1.f, 1.f);
        for (auto& v : inputs) {
          for (auto& x : v) x = dist(gen) * std::exp2(float(int(gen() % 16)));  // magnitudes apart: order shows
        }
        for (const auto op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
          CAPTURE(deterministic, R, n, mirror::to_string(op));
          // Worker order is the serial loop's; Open MPI's is that too for max, and for two workers.
          const bool serial =
              deterministic || op == ReduceOp::max || W == 2 || worker_order_by_default(n * sizeof(float));
          const auto want = hierarchical_reference<float>(op, W, R, inputs);
          std::atomic<int> wrong{0};
          s.run([&](auto& ctx) {
            const auto g = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
            std::vector<float> whole = inputs[g], blocking = inputs[g], started = inputs[g];
            const auto leaves_of = [&](std::vector<float>& v) {
              std::array<std::span<float>, 4> leaves;
              for (std::size_t k = 0, at = 0; k < 4; at += sizes[k], ++k) leaves[k] = std::span<float>(v).subspan(at, sizes[k]);
              return leaves;
            };
            std::vector<float> scattered = inputs[g], scattered_started = inputs[g];
            ctx.all_reduce(op, std::span<float>(whole));
            ctx.all_reduce(op, leaves_of(blocking));
            ctx.all_reduce_async(op, leaves_of(started)).wait();
            ctx.reduce_scatter(op, leaves_of(scattered));
            ctx.reduce_scatter_async(op, leaves_of(scattered_started)).wait();
            if (!mirror::test::same_bits(blocking.data(), whole.data(), n)) ++wrong;
            if (!mirror::test::same_bits(started.data(), whole.data(), n)) ++wrong;
            if (serial && !mirror::test::same_bits(whole.data(), want.data(), n)) ++wrong;
            for (std::size_t k = 0, at = 0; k < 4; at += sizes[k], ++k) {
              const auto [first, count] = mirror::backend::cut_of(sizes[k], N, static_cast<int>(g));
              for (const std::vector<float>* v : {&scattered, &scattered_started}) {
                // The cut: the all-reduce's bits; before and after it, the input.
                if (!mirror::test::same_bits(v->data() + at + first, whole.data() + at + first, count)) ++wrong;
                if (!mirror::test::same_bits(v->data() + at, inputs[g].data() + at, first)) ++wrong;
                const std::size_t end = first + count;
                if (!mirror::test::same_bits(v->data() + at + end, inputs[g].data() + at + end, sizes[k] - end)) ++wrong;
              }
            }
          });
          CHECK(wrong == 0);
        }
      }
    }
  }
}

TEST_CASE("cluster: workers that disagree on MpiAllReduce{.deterministic} get a shape_error, and go on", "[mpi][mismatch]") {
  using Ops = mirror::ops::Hierarchical<mirror::ops::ChunkOwnerAllReduce, mirror::ops::MpiAllReduce>;
  const int w = world_rank();
  drop_shared_strategy();
  mirror::Strategy<Cluster, Ops> s{Cluster{.local = {.replicas = 1}, .timeout = std::chrono::seconds(30)},
                                   Ops{.cross = {.deterministic = w == 0}}};
  try {
    s.run([](auto& ctx) { ctx.all_reduce(ReduceOp::sum, std::vector<float>(10, 1.f)); });
    FAIL("no shape_error");
  } catch (const mirror::shape_error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("worker 0 (replicas 0..0) reduces 10 float32 elements with sum in "
                                                      "worker order (MpiAllReduce{.deterministic = true})"));
    CHECK_THAT(std::string(e.what()), Catch::Contains("worker 1 (replicas 1..1) reduces 10 float32 elements with sum, at collective"));
  }
  // Integers are exact in any order, so the setting does not apply to them: they still agree.
  const auto v = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 2); });
  CHECK(v.primary() == 2 * s.num_replicas_in_sync());
}

TEST_CASE("cluster: the staging scratch of a cross step lives as long as the strategy", "[mpi]") {
  // Open MPI may write into an abandoned collective's buffer after a failure, so a cluster's
  // scratch (where a reduce-scatter of several leaves stages its cross step) is never trimmed
  // between calls, unlike a single process's (tests/backends/threads/threads_device_test.cpp).
  // (An all-reduce of several leaves stages in the MPI group's own buffers instead.)
  if (world_size() == 1) {
    SUCCEED("one worker: nothing crosses workers, nothing is staged");
    return;
  }
  Strategy& s = strategy_with(2);
  const auto cut = s.run([](auto& ctx) {
    return ctx.reduce_scatter(ReduceOp::sum,
                              std::make_tuple(std::vector<float>(1 << 16, 1.f), std::vector<float>(1 << 16, 2.f)));
  });
  CHECK(std::get<1>(cut)[0][0] == 2.f * float(s.num_replicas_in_sync()));  // replica 0's cut of leaf 1
  const std::size_t held = s.runtime().scratch_bytes();
  CHECK(held >= (std::size_t{2} << 16) * sizeof(float));
  for (int k = 0; k < 40; ++k) s.run([](auto& ctx) { ctx.all_reduce(ReduceOp::sum, 1); });
  CHECK(s.runtime().scratch_bytes() == held);
}

TEST_CASE("cluster: a nest of several element types is reduced leaf by leaf", "[mpi]") {
  const int W = world_size();
  Strategy& s = strategy_with(2);
  const int N = 2 * W;
  const auto out = s.run([](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    std::tuple<std::vector<float>, int, std::array<double, 2>> v{{float(id), 1.f}, id, {0.5 * id, 2.0}};
    return ctx.all_reduce(ReduceOp::sum, v);
  });
  for (const auto& v : mirror::Strategy<Cluster>::local_results(out)) {
    CHECK(std::get<0>(v) == std::vector<float>{float(N * (N - 1) / 2), float(N)});
    CHECK(std::get<1>(v) == N * (N - 1) / 2);
    CHECK(std::get<2>(v)[0] == 0.5 * (N * (N - 1) / 2));
    CHECK(std::get<2>(v)[1] == 2.0 * N);
  }
}

TEST_CASE("cluster: TF's CollectiveOpsTest numbers (2 processes x 2 replicas; generalised to W)", "[mpi]") {
  const int W = world_size();
  Strategy& s = strategy_with(2);
  const int N = 2 * W;
  // testReduceDense: replica i holds i + 1 -> SUM 10.0, MEAN 2.5 for W = 2.
  const auto v = s.run([](auto& ctx) { return float(ctx.replica_id_in_sync_group() + 1); });
  CHECK(s.reduce(ReduceOp::sum, v) == float(N * (N + 1) / 2));
  CHECK(s.reduce(ReduceOp::mean, v) == float(N + 1) / 2.f);
  if (W == 2) {
    CHECK(s.reduce(ReduceOp::sum, v) == 10.f);
    CHECK(s.reduce(ReduceOp::mean, v) == 2.5f);
  }
  // testBatchReduceDense: [[1,2],[3,4],[5,6],[7,8]] -> [16,20] / [4,5].
  const auto pairs = s.run([](auto& ctx) {
    const int i = ctx.replica_id_in_sync_group();
    return std::vector<double>{2.0 * i + 1, 2.0 * i + 2};
  });
  const auto sums = s.reduce(ReduceOp::sum, pairs);
  const auto means = s.reduce(ReduceOp::mean, pairs);
  CHECK(sums == std::vector<double>{double(N * N), double(N * N + N)});
  CHECK(means == std::vector<double>{double(N), double(N + 1)});
  if (W == 2) {
    CHECK(sums == std::vector<double>{16, 20});
    CHECK(means == std::vector<double>{4, 5});
  }
  // testAllReduceDense: 1.0 -> group size (sum) / 1.0 (mean); tuple (1, 2) -> (G, 2G) / (1, 2).
  const auto all = s.run([](auto& ctx) {
    return std::tuple(ctx.all_reduce(ReduceOp::sum, 1.0), ctx.all_reduce(ReduceOp::mean, 1.0),
                      ctx.all_reduce(ReduceOp::sum, std::pair(1.0, 2.0)), ctx.all_reduce(ReduceOp::mean, std::pair(1.0, 2.0)));
  });
  CHECK(std::get<0>(all).primary() == double(N));
  CHECK(std::get<1>(all).primary() == 1.0);
  CHECK(std::get<2>(all).primary() == std::pair(double(N), 2.0 * N));
  CHECK(std::get<3>(all).primary() == std::pair(1.0, 2.0));
}

TEMPLATE_TEST_CASE("cluster: min and max across workers: a NaN on any replica gives NaN, -0 is below +0", "[mpi][min_max]",
                   float, double) {
  // The same rule as in one process (mirror/reduce_op.hpp), whichever worker holds the NaN or the
  // zero of either sign: checked against std::fmin, std::fmax, std::isnan and std::signbit, for
  // ctx.all_reduce (the hierarchical cross step, both bit orders) and Strategy::reduce.
  using E = TestType;
  const int W = world_size(), w = world_rank(), R = 2, N = W * R;
  for (const bool deterministic : {false, true}) {
    using Ops = mirror::default_ops_t<Cluster>;
    drop_shared_strategy();
    Strategy s(Cluster{.local = {.replicas = R}, .timeout = std::chrono::seconds(30)},
               Ops{.cross = {.deterministic = deterministic}});
    const E nan = std::numeric_limits<E>::quiet_NaN();
    // Element k: a NaN on global replica k % N (k < N), zeros of both signs spread over the
    // replicas (k in [N, 2N)), or ordinary values.
    const std::size_t n = 3 * static_cast<std::size_t>(N);
    auto input = [&](int g) {
      std::vector<E> v(n);
      for (std::size_t k = 0; k < n; ++k) {
        if (k < static_cast<std::size_t>(N)) {
          v[k] = static_cast<int>(k) == g ? nan : E(g) - E(1.5);
        } else if (k < 2 * static_cast<std::size_t>(N)) {
          v[k] = (static_cast<int>(k) + g) % 3 == 0 ? E(-0.0) : E(0.0);
        } else {
          v[k] = E((g * 7 + static_cast<int>(k)) % 5) - E(2);
        }
      }
      return v;
    };
    for (const auto op : {ReduceOp::min, ReduceOp::max}) {
      CAPTURE(deterministic, mirror::to_string(op));
      const auto out = s.run([&](auto& ctx) { return ctx.all_reduce(op, input(ctx.replica_id_in_sync_group())); });
      std::vector<std::vector<E>> mine;
      for (int r = 0; r < R; ++r) mine.push_back(input(w * R + r));
      const std::vector<E> host = s.reduce(op, mirror::PerReplica<std::vector<E>>(mine));
      for (std::size_t k = 0; k < n; ++k) {
        bool any_nan = false, negative_zero = false, positive_zero = false;
        E want = op == ReduceOp::min ? std::numeric_limits<E>::infinity() : -std::numeric_limits<E>::infinity();
        for (int g = 0; g < N; ++g) {
          const E x = input(g)[k];
          any_nan = any_nan || std::isnan(x);
          if (x == 0) (std::signbit(x) ? negative_zero : positive_zero) = true;
          want = op == ReduceOp::min ? std::fmin(want, x) : std::fmax(want, x);
        }
        if (want == 0) want = (op == ReduceOp::min ? negative_zero : !positive_zero) ? E(-0.0) : E(0.0);
        auto same = [&](E got) { return any_nan ? std::isnan(got) : (got == want && std::signbit(got) == std::signbit(want)); };
        CAPTURE(k);
        for (const auto& copy : out) REQUIRE(same(copy[k]));
        REQUIRE(same(host[k]));
      }
    }
  }
  drop_shared_strategy();
}

TEST_CASE("cluster: reduce of a Mirrored value counts W*R copies (TF's host path counts W)", "[mpi]") {
  const int W = world_size();
  // testReduceHostTensor, 2 workers x 1: reduce(SUM, 1.0) -> 2.0 (W): equal to TF with R = 1.
  Strategy& one = strategy_with(1);
  CHECK(one.reduce(ReduceOp::sum, one.broadcast(1.0f)) == float(W));
  // With R = 2, TF would still say W; mirror counts every replica
  // (docs/multi-worker.md#where-mirror-differs-from-tensorflow).
  Strategy& two = strategy_with(2);
  CHECK(two.reduce(ReduceOp::sum, two.broadcast(1.0f)) == float(2 * W));
}

TEST_CASE("cluster: integer mean divides once by W*R (the design's [0,1 | 1,2] example)", "[mpi]") {
  const int W = world_size();
  Strategy& s = strategy_with(2);
  // Replica values {0, 1, 1, 2, 2, 3, ...}: worker w holds w, w + 1.
  const auto means = s.run([](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    return ctx.all_reduce(ReduceOp::mean, id / 2 + id % 2);
  });
  int sum = 0;
  for (int w = 0; w < W; ++w) sum += w + (w + 1);
  CHECK(means.primary() == sum / (2 * W));  // W = 2: 4 / 4 = 1; staged division would give 0
  const auto per = s.run([](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    return id / 2 + id % 2;
  });
  CHECK(s.reduce(ReduceOp::mean, per) == sum / (2 * W));
}

TEST_CASE("cluster: reduce with axis0 weighs ragged batches by their true counts", "[mpi]") {
  const int W = world_size();
  Strategy& s = strategy_with(2);
  const int N = 2 * W;
  // Replica id holds id + 1 copies of id (replica 0: one 0).
  // run lifts a returned pair element by element: two PerReplica values.
  const auto [doubles, ints] = s.run([](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    return std::pair(std::vector<double>(static_cast<std::size_t>(id + 1), double(id)),
                     std::vector<std::int64_t>(static_cast<std::size_t>(id + 1), id));
  });
  double sum = 0, count = 0;
  for (int id = 0; id < N; ++id) {
    sum += double(id) * (id + 1);
    count += id + 1;
  }
  CHECK(s.reduce(ReduceOp::mean, doubles, mirror::axis0) == sum / count);
  CHECK(s.reduce(ReduceOp::mean, ints, mirror::axis0) == static_cast<std::int64_t>(sum) / static_cast<std::int64_t>(count));
  CHECK(s.reduce(ReduceOp::max, doubles, mirror::axis0) == double(N - 1));
  CHECK(s.reduce(ReduceOp::min, ints, mirror::axis0) == 0);
  CHECK(s.reduce(ReduceOp::sum, doubles, mirror::axis0) == sum);
}

TEST_CASE("cluster: broadcast and merge_call across workers", "[mpi]") {
  const int W = world_size(), w = world_rank();
  Strategy& s = strategy_with(2);
  const int N = 2 * W;
  // ctx.broadcast from the last global replica: a vector whose size depends on the replica.
  const auto got = s.run([](auto& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    std::vector<int> mine(static_cast<std::size_t>(id + 1), id);
    return ctx.broadcast(mine, ctx.num_replicas_in_sync() - 1);
  });
  for (const auto& v : mirror::Strategy<Cluster>::local_results(got)) {
    CHECK(v == std::vector<int>(static_cast<std::size_t>(N), N - 1));
  }
  // Strategy::broadcast takes the chief's value.
  const auto m = s.broadcast(std::vector<float>(static_cast<std::size_t>(w + 1), float(w + 10)));
  for (const auto& v : mirror::Strategy<Cluster>::local_results(m)) CHECK(v == std::vector<float>{10.f});
  // merge_call: fn runs once per worker with its local values; reduce inside goes across workers.
  const auto merged = s.run([](auto& ctx) {
    return ctx.merge_call([](auto& strategy, const mirror::PerReplica<int>& ids) {
      return strategy.reduce(ReduceOp::sum, ids);
    }, ctx.replica_id_in_sync_group());
  });
  for (const int x : mirror::Strategy<Cluster>::local_results(merged)) CHECK(x == N * (N - 1) / 2);
}

TEST_CASE("cluster: variables start as the chief's value and aggregate over W*R", "[mpi]") {
  const int W = world_size(), w = world_rank();
  Strategy& s = strategy_with(2);
  const int N = 2 * W;
  // Unseeded initialisers differ per worker: every copy takes the chief's.
  auto v = s.make_variable(std::vector<float>{float(100 * w + 1), float(w)}, mirror::VariableAggregation::mean);
  for (const auto& c : mirror::Strategy<Cluster>::local_results(v)) CHECK(c == std::vector<float>{1.f, 0.f});
  // mean aggregation: every copy moves by the mean of the replicas' updates, (N - 1) / 2.
  s.run([](auto& ctx, auto& var) {
    const float id = float(ctx.replica_id_in_sync_group());
    var.assign_add(std::vector<float>{id, 2 * id});
  }, v);
  for (const auto& c : mirror::Strategy<Cluster>::local_results(v)) {
    CHECK(c == std::vector<float>{1.f + float(N - 1) / 2, float(N - 1)});
  }
  // only_first_replica: global replica 0's value everywhere.
  auto first = s.make_variable(0, mirror::VariableAggregation::only_first_replica);
  s.run([](auto& ctx, auto& var) { var.assign(ctx.replica_id_in_sync_group() + 5); }, first);
  for (const int c : mirror::Strategy<Cluster>::local_results(first)) CHECK(c == 5);
  // SyncOnRead sum: the read sums every worker's copies; assign(v) stores v / N per copy.
  auto metric = s.make_sync_on_read_variable(0.0, mirror::VariableAggregation::sum);
  s.run([](auto& ctx, auto& var) { var.assign(double(ctx.replica_id_in_sync_group() + 1)); }, metric);
  CHECK(metric.value() == double(N * (N + 1) / 2));
  metric.assign(8.0 * N);
  for (const double c : mirror::Strategy<Cluster>::local_results(metric)) CHECK(c == 8.0);
  CHECK(metric.value() == 8.0 * N);
  auto avg = s.make_sync_on_read_variable(0.0, mirror::VariableAggregation::mean);
  s.run([](auto& ctx, auto& var) { var.assign(double(ctx.replica_id_in_sync_group())); }, avg);
  CHECK(avg.value() == double(N - 1) / 2);
  auto head = s.make_sync_on_read_variable(0, mirror::VariableAggregation::only_first_replica);
  s.run([](auto& ctx, auto& var) { var.assign(ctx.replica_id_in_sync_group() + 3); }, head);
  CHECK(head.value() == 3);
}

TEST_CASE("cluster: distribute_dataset gives each worker its contiguous part of every global batch", "[mpi]") {
  const int W = world_size(), w = world_rank();
  {
    // TF's testSimpleInputFromDatasetLastPartialBatch, 2 x 1: range(14).batch(8) -> step 2
    // chief [8, 9, 10], worker [11, 12, 13].
    Strategy& s = strategy_with(1);
    std::vector<std::vector<int>> batches{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13}};
    std::vector<std::vector<int>> seen;
    for (const auto& step : s.distribute_dataset(batches)) {
      seen.emplace_back(step[0].begin(), step[0].end());
    }
    REQUIRE(seen.size() == 2);
    if (W == 2) {
      CHECK(seen[0] == (w == 0 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{4, 5, 6, 7}));
      CHECK(seen[1] == (w == 0 ? std::vector<int>{8, 9, 10} : std::vector<int>{11, 12, 13}));
    }
    // Reassembled in global replica order, every worker's parts are the batch, once.
    std::vector<int> mine;
    for (const auto& p : seen) mine.insert(mine.end(), p.begin(), p.end());
    const int count = static_cast<int>(mine.size());
    int total = 0;
    MPI_Allreduce(&count, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(total == 14);
  }
  {
    // G = 5 on W x 2: the single-process rule with N = 2W; W = 2 gives 2,1 | 1,1.
    Strategy& s = strategy_with(2);
    const int N = 2 * W;
    std::vector<std::vector<float>> batches{{0, 1, 2, 3, 4}};
    for (const auto& step : s.distribute_dataset(batches)) {
      for (int r = 0; r < 2; ++r) {
        const auto [first, count] = mirror::backend::cut_of(5, N, w * 2 + r);
        REQUIRE(step[static_cast<std::size_t>(r)].size() == count);
        if (count > 0) CHECK(step[static_cast<std::size_t>(r)][0] == float(first));
      }
      if (W == 2) CHECK(step[0].size() == (w == 0 ? 2u : 1u));
    }
  }
}

TEST_CASE("cluster: a dataset size that differs across workers is a shape_error on every worker", "[mpi][mismatch]") {
  const int w = world_rank();
  Strategy& s = strategy_with(1);
  std::vector<std::vector<int>> batches(static_cast<std::size_t>(3 + (w == 1 ? 1 : 0)), std::vector<int>{1, 2});
  auto ds = s.distribute_dataset(batches);
  CHECK_THROWS_AS(ds.begin(), mirror::shape_error);
  // Nothing is left half-done: the next collective works.
  const auto v = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
  CHECK(v.primary() == s.num_replicas_in_sync());
}

TEST_CASE("cluster: distribute_datasets_from_function with InputContext and shard (TF's numbers)", "[mpi]") {
  const int W = world_size(), w = world_rank();
  Strategy& s = strategy_with(1);
  // testDatasetFromFunction (2 x 1, G = 10): range(100).batch(5).shard(2, id) -> first-step sums
  // chief 10, worker 35.
  std::vector<std::vector<int>> batches;
  for (int b = 0; b < 20; ++b) {
    batches.emplace_back();
    for (int i = 0; i < 5; ++i) batches.back().push_back(5 * b + i);
  }
  mirror::InputContext seen{};
  auto ds = s.distribute_datasets_from_function([&](const mirror::InputContext& ctx) {
    seen = ctx;
    return mirror::shard(batches, ctx);
  });
  CHECK(seen == mirror::InputContext{W, w, W});
  CHECK(seen.get_per_replica_batch_size(5 * W) == 5);
  auto it = ds.begin();
  const auto& first = (*it)[0];
  const int sum = std::accumulate(first.begin(), first.end(), 0);
  CHECK(sum == 25 * w + 10);  // chief 10, worker 1: 35
  // testSimpleInputFromFnLastPartialBatch: range(14).batch(4).shard(2, id) -> step 2 chief
  // [8..11], worker [12, 13].
  std::vector<std::vector<int>> b14{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13}};
  std::vector<std::vector<int>> steps;
  for (const auto& step : s.distribute_datasets_from_function([&](const auto& ctx) { return mirror::shard(b14, ctx); })) {
    steps.push_back(step[0]);
  }
  if (W == 2) {
    REQUIRE(steps.size() == 2);
    CHECK(steps[1] == (w == 0 ? std::vector<int>{8, 9, 10, 11} : std::vector<int>{12, 13}));
  }
}

TEST_CASE("cluster: ragged worker data ends every worker at the same step (has-data rule)", "[mpi]") {
  const int W = world_size(), w = world_rank();
  Strategy& s = strategy_with(2);
  // Worker w has w + 1 batches per replica: the last worker's data decides the step count, and
  // the others' replicas get empty batches meanwhile — and keep all-reducing with it.
  std::vector<std::vector<float>> mine(static_cast<std::size_t>(2 * (w + 1)), std::vector<float>{1.f, 1.f});
  int steps = 0;
  std::vector<float> totals;
  for (const auto& step : s.distribute_datasets_from_function([&](const auto&) { return std::views::all(mine); })) {
    const auto t = s.run([](auto& ctx, const std::vector<float>& b) {
      return ctx.all_reduce(ReduceOp::sum, float(b.size()));
    }, step);
    totals.push_back(t.primary());
    ++steps;
  }
  CHECK(steps == W);
  // Step k: workers w >= k still have data, 2 replicas x 2 elements each.
  for (int k = 0; k < static_cast<int>(totals.size()); ++k) CHECK(totals[static_cast<std::size_t>(k)] == float(4 * (W - k)));
}

TEST_CASE("cluster: mismatched shapes across workers are a shape_error on every worker, and the strategy goes on", "[mpi][mismatch]") {
  const int w = world_rank();
  Strategy& s = strategy_with(2);
  try {
    s.run([&](auto& ctx) {
      std::vector<float> v(static_cast<std::size_t>(10 + (w == 1 ? 1 : 0)), 1.f);
      ctx.all_reduce(ReduceOp::sum, v);
    });
    FAIL("no shape_error");
  } catch (const mirror::shape_error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("worker 1 (replicas 2..3) reduces 11 float32"));
    CHECK_THAT(what, Catch::Contains("worker 0 (replicas 0..1) reduces 10 float32"));
  }
  const auto v = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, std::vector<float>(10, 1.f)); });
  CHECK(v.primary() == std::vector<float>(10, float(s.num_replicas_in_sync())));
}

TEST_CASE("cluster: a wide agreement check against a slot, a check of cuts, a two-round all-reduce or another wide "
          "one is a shape_error on every worker",
          "[mpi][mismatch]") {
  // 1000 floats (4000 bytes) ride in the check as one message of their own size; 10 in the fixed
  // slot; 1500 (6000 bytes) in cuts, each worker's cut in its own message; 5000 take the check
  // and MPI_Iallreduce. Each pairing must still find the keys unequal on every worker, and leave
  // the next exchange's messages unmixed.
  const int w = world_rank();
  Strategy& s = strategy_with(2);
  const std::size_t cases[][2] = {{1000, 10},   {10, 1000},   {1000, 5000}, {5000, 1000}, {1000, 999},
                                  {1500, 1000}, {1000, 1500}, {1500, 10},   {1500, 5000}, {5000, 1500},
                                  {1500, 1501}};  // worker 0's, the others'
  for (const auto& c : cases) {
    const std::size_t mine = c[w == 0 ? 0 : 1];
    CAPTURE(c[0], c[1]);
    try {
      s.run([&](auto& ctx) { ctx.all_reduce(ReduceOp::sum, std::vector<float>(mine, 1.f)); });
      FAIL("no shape_error");
    } catch (const mirror::shape_error& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("worker 0 (replicas 0..1) reduces " + std::to_string(c[0]) + " float32"));
      CHECK_THAT(what, Catch::Contains("worker 1 (replicas 2..3) reduces " + std::to_string(c[1]) + " float32"));
    }
    const auto v = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, std::vector<float>(1000, 1.f)); });
    CHECK(v.primary() == std::vector<float>(1000, float(s.num_replicas_in_sync())));
  }
}

TEST_CASE("cluster: save writes once on the chief, restore broadcasts the chief's file", "[mpi]") {
  const int W = world_size(), w = world_rank();
  Strategy& s = strategy_with(2);
  const int N = 2 * W;
  // A per-job folder on the chief; the other workers pass a path that does not exist at all:
  // only the chief touches the file (no shared file system needed).
  std::string dir;
  if (w == 0) {
    char tmpl[] = "/tmp/mirror_ckpt_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  } else {
    dir = "/nonexistent/mirror_ckpt_elsewhere";
  }
  const std::filesystem::path path = std::filesystem::path(dir) / "model.ckpt";
  auto weights = s.make_variable(std::vector<float>{1.f, 2.f, 3.f}, mirror::VariableAggregation::mean);
  auto seen = s.make_sync_on_read_variable(std::int64_t{0}, mirror::VariableAggregation::sum);
  s.run([](auto& ctx, auto& wts, auto& count) {
    wts.assign_add(std::vector<float>{1.f, 1.f, float(ctx.replica_id_in_sync_group())});
    count.assign(std::int64_t{10});
  }, weights, seen);
  const std::vector<float> saved{2.f, 3.f, 3.f + float(N - 1) / 2};
  REQUIRE(weights.value() == saved);
  REQUIRE(seen.value() == 10 * N);
  mirror::save(s, path, weights, seen);
  if (w == 0) {
    CHECK(std::filesystem::exists(path));
    CHECK(!std::filesystem::exists(path.string() + ".tmp"));
  }
  // Change everything, then restore: every worker gets the chief's checkpoint.
  weights.assign(std::vector<float>{0.f, 0.f, 0.f});
  seen.assign(std::int64_t{0});
  mirror::restore(s, path, weights, seen);
  for (const auto& c : mirror::Strategy<Cluster>::local_results(weights)) CHECK(c == saved);
  CHECK(seen.value() == 10 * N);
  // The chief cannot write: the same backend_error on every worker.
  CHECK_THROWS_AS(mirror::save(s, std::filesystem::path("/nonexistent/dir/x.ckpt"), weights), mirror::backend_error);
  // A checkpoint of other shapes: shape_error on every worker, nothing changed.
  auto other = s.make_variable(std::vector<float>{0.f, 0.f}, mirror::VariableAggregation::mean);
  CHECK_THROWS_AS(mirror::restore(s, path, other, seen), mirror::shape_error);
  CHECK(other.value() == std::vector<float>{0.f, 0.f});
  if (w == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("cluster: an unsized range of global batches agrees on has-data every step", "[mpi]") {
  const int W = world_size(), w = world_rank();
  Strategy& s = strategy_with(1);
  // A filter view is not sized, so no size check up front: worker w's range ends after w + 1
  // batches (a bug in a real program), and every worker still stops together, at step W,
  // the exhausted ones giving their replicas empty batches meanwhile.
  std::vector<std::vector<int>> batches(static_cast<std::size_t>(W), std::vector<int>(static_cast<std::size_t>(W), 1));
  int index = 0;
  auto mine = batches | std::views::filter([&, w](const std::vector<int>&) { return index++ <= w; });
  static_assert(!std::ranges::sized_range<decltype(mine)>);
  int steps = 0, empty = 0;
  for (const auto& step : s.distribute_dataset(mine)) {
    ++steps;
    if (step[0].empty()) ++empty;
  }
  CHECK(steps == W);
  CHECK(empty == W - 1 - w);
}
