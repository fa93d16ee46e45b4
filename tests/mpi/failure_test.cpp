// SPDX-License-Identifier: Apache-2.0
// devices::Cluster failure semantics under mpirun (docs/multi-worker.md#failures): every failure
// ends in the named error on every worker within its bound, never a hang, and after an exception in
// fn the strategy goes on. Each case builds its own strategy: after a timeout a strategy cannot
// continue (Open MPI 4.1 cannot cancel a posted collective).

#include <catch2/catch.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>

#include "mpi/mpi_world.hpp"  // world_size, world_rank; the tests compare with plain MPI calls

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
using Strategy = mirror::Strategy<Cluster>;
using mirror::ReduceOp;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

}  // namespace

TEST_CASE("failure: unequal local replica counts are an invalid_argument on every worker, naming them", "[mpi]") {
  const int w = world_rank();
  try {
    Strategy s(Cluster{.local = {.replicas = w == 0 ? 1 : 2}, .timeout = std::chrono::seconds(30)});
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("worker 0 has 1"));
    CHECK_THAT(what, Catch::Contains("worker 1 has 2"));
  }
}

TEST_CASE("failure: an exception in fn on one worker reaches the others' pending collectives at once", "[mpi]") {
  // A timeout far beyond the launch's own limit (run_mpi.sh): were the notice lost, the others
  // would wait for it and the launch would fail, instead of this case passing late.
  const int W = world_size();
  const int R = 2;
  Strategy s(Cluster{.local = {.replicas = R}, .timeout = std::chrono::hours(1)});
  const int thrower = (W - 1) * R + 1;  // the last worker's second replica
  try {
    s.run([&](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == thrower) throw std::runtime_error("boom on the last worker");
      ctx.all_reduce(ReduceOp::sum, std::vector<float>(100, 1.f));
    });
    FAIL("no error");
  } catch (const mirror::replica_error& e) {
    CHECK(e.replica() == thrower);
    CHECK_THAT(std::string(e.what()), Catch::Contains("boom on the last worker"));
  }
  // Every worker recovered: the next run works, with the right sum.
  const auto again = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, ctx.replica_id_in_sync_group()); });
  for (const int v : again) CHECK(v == W * R * (W * R - 1) / 2);
}

namespace {
// `rounds` failing runs, each followed by a clean run and a reduce (the recovery test below).
void alternate(Strategy& s, int rounds) {
  const int W = world_size(), w = world_rank();
  const int R = s.num_local_replicas(), N = W * R;
  for (int round = 0; round < rounds; ++round) {
    const int thrower = (round * 3 + 1) % N;
    const int where = round % 10;  // throws after `where` collectives
    CAPTURE(round, thrower, where);
    const std::string text = "round " + std::to_string(round) + " failed";
    bool threw = false;
    try {
      s.run([&](auto& ctx) {
        const int g = ctx.replica_id_in_sync_group();
        auto step = [&](int k) {
          if (where == k && g == thrower) throw std::runtime_error(text);
        };
        step(0);
        ctx.all_reduce(ReduceOp::sum, std::vector<float>(40000, 1.0f));  // 160 KB
        step(1);
        ctx.all_reduce(ReduceOp::sum, 1.0f);
        step(2);
        ctx.broadcast(std::vector<int>(100, g), N - 1);
        step(3);
        ctx.all_reduce(ReduceOp::max, std::vector<double>(3, double(g)));
        step(4);
        ctx.all_reduce(ReduceOp::sum, std::vector<float>(700, 1.0f));  // 2800 B: the check's wide message
        step(5);
        // 6000 B: in cuts (a check carrying each worker's cut, then an all-gather of the folds)
        ctx.all_reduce(ReduceOp::sum, std::vector<float>(1500, 1.0f));
        step(6);
        ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(1500, float(g)));  // in cuts: one round
        step(7);
        // 5 MB: three MPI_Iallreduce's in turn (pieces), of which a recovery completes the first;
        // in two leaves, so the first and last are posted on a leaf and the middle one on a copy
        ctx.all_reduce(ReduceOp::sum, std::make_tuple(std::vector<float>(600'000, 1.0f), std::vector<float>(650'000, 1.0f)));
        step(8);
        ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(1'250'000, float(g)));  // the same pieces
        step(9);
      });
    } catch (const mirror::replica_error& e) {
      threw = true;
      REQUIRE(e.replica() == thrower);
      REQUIRE_THAT(std::string(e.what()), Catch::Contains(text));
    }
    // Every worker still has a collective to make after the throw, except after the last one:
    // then only the thrower's own worker notices.
    REQUIRE(threw == (where < 9 || w == thrower / R));
    // Lengths that take each path in turn: 8 KB and more (in cuts at 3 workers, two rounds at 2
    // from round 5), the check's wide message, in cuts.
    const std::size_t length = (round % 3 == 0 ? 1000 : round % 3 == 1 ? 200 : 700) + static_cast<std::size_t>(round);
    const auto out = s.run([&](auto& ctx) {
      const int g = ctx.replica_id_in_sync_group();
      return std::pair{ctx.all_reduce(ReduceOp::sum, std::vector<double>(length, g + round)), ctx.all_reduce(ReduceOp::max, g)};
    });
    const double sum = double(N) * (N - 1) / 2 + double(N) * round;
    for (const auto& v : out.first) {
      REQUIRE(v.size() == length);
      for (const double x : v) REQUIRE(x == sum);
    }
    for (const int m : out.second) REQUIRE(m == N - 1);
    std::vector<int> mine;
    for (int r = 0; r < R; ++r) mine.push_back(w * R + r + round);
    REQUIRE(s.reduce(ReduceOp::sum, mirror::PerReplica<int>(mine)) == N * (N - 1) / 2 + N * round);
  }
}
}  // namespace

TEST_CASE("failure: failing and clean runs alternate 100 times; every clean run is right on every worker",
          "[mpi][recovery]") {
  // docs/multi-worker.md#failures (an exception in fn on worker w): after every failing run the
  // next run works on every worker. Each round a different global replica throws, at a different
  // point of fn: before any collective (the others' posts of the first one are left unmatched),
  // between collectives (a large all_reduce on the ring algorithm, a scalar one, a broadcast, a
  // max, one in the check's wide message, an all-reduce and a reduce-scatter in cuts, an
  // all-reduce of two leaves and a reduce-scatter of 5 MB in pieces), or after
  // the last one (only its own worker notices). The clean run after it and a reduce
  // outside run check the sums; a worker that paired a new collective with a stale one would get
  // another worker's old data, a shape_error, or hang (the launch's limit ends that: the timeout is
  // far beyond it, so no recovery can pass by waiting for it).
  Strategy s(Cluster{.local = {.replicas = 2}, .timeout = std::chrono::hours(1)});
  alternate(s, 100);
}

TEST_CASE("failure: the recovery also completes worker-order reductions and runs without shape checks",
          "[mpi][recovery]") {
  // MpiAllReduce{.deterministic}: each cross step is an all-to-all and an all-gather, so a
  // recovery may have to post either; without the shape check a collective is one post.
  using Ops = mirror::default_ops_t<Cluster>;
  Strategy s(Cluster{.local = {.replicas = 2}, .timeout = std::chrono::hours(1), .validate_shapes = false},
             Ops{.cross = {.deterministic = true}});
  alternate(s, 30);
}

TEST_CASE("failure: the recovery completes a collective posted without a check: pieces of a large all-reduce",
          "[mpi][recovery]") {
  // Without the shape check the 5 MB all-reduce and reduce-scatter post their first piece
  // straight away, so a recovery must match that piece itself (with the check, the check's
  // post is the one left unmatched).
  Strategy s(Cluster{.local = {.replicas = 2}, .timeout = std::chrono::hours(1), .validate_shapes = false});
  alternate(s, 30);
}

TEST_CASE("failure: a strategy destroyed right after a failed run lets every worker go", "[mpi][recovery]") {
  // The failing worker may still be recovering when the program destroys its strategy (and a
  // worker whose run went well may be destroying its own already): destruction finishes the
  // recovery and waits for every worker to leave, so nobody waits for a worker that is gone. A
  // timeout far beyond the launch's limit: a wait for it would fail the launch.
  const int W = world_size(), R = 2;
  for (int round = 0; round < 10; ++round) {
    CAPTURE(round);
    Strategy s(Cluster{.local = {.replicas = R}, .timeout = std::chrono::hours(1)});
    const int thrower = (round * 3 + 1) % (W * R);
    try {
      s.run([&](auto& ctx) {
        if (ctx.replica_id_in_sync_group() == thrower) throw std::runtime_error("last run");
        if (round % 2 == 0) ctx.all_reduce(ReduceOp::sum, std::vector<float>(1000, 1.0f));  // odd: none to fail
      });
    } catch (const mirror::replica_error& e) {
      CHECK(e.replica() == thrower);
    }
  }
}

TEST_CASE("failure: a late worker is named by every waiting worker after the timeout", "[mpi]") {
  // The late worker reaches the collective only once every other worker has thrown its
  // timeout_error and said so (a message on MPI_COMM_WORLD): late by construction, not by a
  // sleep longer than the timeout.
  const int W = world_size(), w = world_rank();
  const auto timeout = std::chrono::milliseconds(1000);
  Strategy s(Cluster{.local = {.replicas = 1}, .timeout = timeout});
  const auto warm = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
  REQUIRE(warm.primary() == W);
  const int late = W - 1;
  constexpr int tag_gave_up = 4711;
  const auto start = clock_type::now();
  try {
    s.run([&](auto& ctx) {
      if (w == late) {
        for (int other = 0; other < W - 1; ++other) {
          int dummy = 0;
          MPI_Recv(&dummy, 1, MPI_INT, other, tag_gave_up, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
      }
      ctx.all_reduce(ReduceOp::sum, 1);
    });
    FAIL("no timeout_error");
  } catch (const mirror::timeout_error& e) {
    const double t = seconds_since(start);
    CAPTURE(e.what(), t);
    CHECK(e.missing() == std::vector<int>{late});  // R = 1: global replica = worker
    if (w != late) {
      CHECK(t >= 0.9);  // not before the timeout
      CHECK_THAT(std::string(e.what()), Catch::Contains("replicas {" + std::to_string(late) + "} did not reach this collective"));
      // Named as fn wrote it, not by the cross-worker exchanges counted so far.
      CHECK_THAT(std::string(e.what()), Catch::Contains("collective #1 (all_reduce(sum)) of fn"));
      int dummy = 0;
      MPI_Send(&dummy, 1, MPI_INT, late, tag_gave_up, MPI_COMM_WORLD);
    } else {
      CHECK_THAT(std::string(e.what()), Catch::Contains("gave up waiting for this worker"));
    }
  }
}

TEST_CASE("failure: a worker that never builds its strategy: the others throw timeout_error, not hang", "[mpi]") {
  // On a communicator of its own: the others' duplication of it stays posted (MPI cannot cancel
  // it) and would match the next strategy's on a shared one. Never freed for the same reason.
  MPI_Comm own = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &own);
  const int W = world_size(), w = world_rank();
  if (w != W - 1) {
    const auto start = clock_type::now();
    try {
      Cluster c{.local = {.replicas = 2}, .timeout = std::chrono::milliseconds(1000)};
      c.comm = own;
      Strategy s(c);
      FAIL("no timeout_error");
    } catch (const mirror::timeout_error& e) {
      const double t = seconds_since(start);
      CAPTURE(e.what(), t);
      CHECK_THAT(std::string(e.what()), Catch::Contains("not every worker of the communicator built its strategy"));
      CHECK_THAT(std::string(e.what()), Catch::Contains("worker " + std::to_string(w) + " of " + std::to_string(W)));
      CHECK(t >= 0.9);
      CHECK(t < 10.0);  // the 1 s timeout, not a hang
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("failure: an MPI error code is a backend_error with MPI's code and text", "[mpi]") {
  // Errors on no valid communicator go to MPI_COMM_WORLD's handler: return them instead of
  // aborting the job, as mirror does on its own communicators.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  Cluster c{.local = {.replicas = 1}, .timeout = std::chrono::seconds(30)};
  c.comm = MPI_COMM_NULL;
  try {
    Strategy s(c);
    FAIL("no backend_error");
  } catch (const mirror::backend_error& e) {
    const std::string what = e.what();
    CHECK(e.code() != 0);
    CHECK_THAT(what, Catch::Contains("MPI_Comm_idup"));
    CHECK_THAT(what, Catch::Contains("MPI_ERR_COMM"));  // MPI_Error_string's text
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}
