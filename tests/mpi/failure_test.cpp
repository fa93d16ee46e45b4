// SPDX-License-Identifier: Apache-2.0
// devices::Cluster failure semantics under mpirun (multi_worker.md 5.6): every failure ends in
// the named error on every worker within its bound, never a hang. Each case builds its own
// strategy: after a timeout or a remote failure a strategy cannot continue (Open MPI 4.1
// cannot cancel a posted collective), and the case checks that too.

#include <catch2/catch.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
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
  const int W = world_size(), w = world_rank();
  const int R = 2;
  Strategy s(Cluster{.local = {.replicas = R}, .timeout = std::chrono::seconds(60)});
  const int thrower = (W - 1) * R + 1;  // the last worker's second replica
  const auto start = clock_type::now();
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
  CHECK(seconds_since(start) < 10.0);  // not the 60 s timeout
  // The cluster cannot go on (no cancellation in MPI 4.1): later collectives fail at once.
  const auto again = clock_type::now();
  CHECK_THROWS_AS(s.run([](auto& ctx) { ctx.all_reduce(ReduceOp::sum, 1); }), mirror::error);
  CHECK(seconds_since(again) < 10.0);
  (void)w;
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
      CHECK_THAT(std::string(e.what()), Catch::Contains("replicas {" + std::to_string(late) + "} did not arrive"));
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
