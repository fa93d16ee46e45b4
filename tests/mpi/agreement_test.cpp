// SPDX-License-Identifier: Apache-2.0
// devices::Cluster under mpirun (2 or 3 processes, 1-3 replicas each): every cross-worker
// collective carries which call of the program it is, so two different calls never pair, however
// alike their payloads; and an error raised inside one worker reaches the others as the same kind
// of error (docs/multi-worker.md, "When workers disagree"). Each case checks every worker's error
// and that the next run is right.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <stdlib.h>  // mkdtemp
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>

#include "mpi/mpi_world.hpp"  // world_size, world_rank

namespace {

using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
using Strategy = mirror::Strategy<Cluster>;
using mirror::ReduceOp;

// One strategy at a time (tests/mpi/cluster_test.cpp says why), rebuilt per replica count.
std::unique_ptr<Strategy>& shared_strategy() {
  static std::unique_ptr<Strategy> s;
  return s;
}
Strategy& strategy_with(int replicas) {
  auto& s = shared_strategy();
  if (!s || s->num_local_replicas() != replicas) {
    s.reset();
    s = std::make_unique<Strategy>(Cluster{.local = {.replicas = replicas}, .timeout = std::chrono::seconds(30)});
  }
  return *s;
}

// The next run is right on every worker: a sum of the global ids, and a broadcast.
void check_goes_on(Strategy& s) {
  const int N = s.num_replicas_in_sync();
  const auto out = s.run([&](auto& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    return std::pair{ctx.all_reduce(ReduceOp::sum, g), ctx.broadcast(std::vector<int>{g, 7}, N - 1)};
  });
  for (const int v : out.first) REQUIRE(v == N * (N - 1) / 2);
  for (const auto& v : out.second) REQUIRE(v == std::vector<int>{N - 1, 7});
  REQUIRE(s.reduce(ReduceOp::sum, s.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); })) == N * (N - 1) / 2);
}

// A checkpoint every worker can restore (only the chief reads it).
struct checkpoint_dir {
  std::string dir;
  checkpoint_dir() {
    if (world_rank() == 0) {
      char tmpl[] = "/tmp/mirror_agreement_XXXXXX";
      REQUIRE(mkdtemp(tmpl) != nullptr);
      dir = tmpl;
    } else {
      dir = "/nonexistent/mirror_agreement";
    }
  }
  ~checkpoint_dir() {
    if (world_rank() == 0) std::filesystem::remove_all(dir);
  }
  std::string path(const char* name) const { return (std::filesystem::path(dir) / name).string(); }
};

// FILE:LINE, as the errors name a call of this file (docs/errors.md#call-sites): the file as the
// compiler was given it, which __FILE__ is too.
std::string site(unsigned line) { return std::string(__FILE__) + ":" + std::to_string(line); }

// Whether `text` is the same on every worker (compared by hash: one MIN and one MAX all-reduce).
bool same_on_every_worker(const std::string& text) {
  std::uint64_t h = std::hash<std::string>{}(text), lo = h, hi = h;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

// The calls a program makes outside fn (cross-replica context), each collective across workers.
struct cross_call {
  const char* name;   // as the error names it
  std::function<void(Strategy&)> call;
};

// The collectives fn makes.
struct in_fn_call {
  const char* name;  // as the error names it: "collective #1 (...)"
  std::function<void(Strategy&)> run;
};

}  // namespace

TEST_CASE("agreement: a call outside run against a collective in fn is a shape_error on every worker, naming both",
          "[mpi][mismatch]") {
  // The newcomer's case first: worker 0 reduces outside run (a TF habit, logging on the chief)
  // while worker 1 all-reduces in fn. Before, the two paired: 3 where 6 and 4 were due.
  const int W = world_size(), w = world_rank();
  checkpoint_dir dir;
  for (int R = 1; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    const int N = W * R;
    auto weights = s.make_variable(std::vector<float>{1.f, 2.f}, mirror::VariableAggregation::mean);
    auto seen = s.make_sync_on_read_variable(std::int64_t{1}, mirror::VariableAggregation::sum);
    mirror::save(s, dir.path("ok.ckpt"), weights);
    const auto ids = s.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); });
    const auto rows = s.run([](auto& ctx) { return std::vector<float>(2, float(ctx.replica_id_in_sync_group())); });
    std::vector<std::vector<int>> batches(4, std::vector<int>(static_cast<std::size_t>(N), 1));
    const std::vector<cross_call> outside = {
        {"mirror::Strategy::reduce", [&](Strategy& st) { (void)st.reduce(ReduceOp::sum, ids); }},
        {"mirror::Strategy::reduce(axis0)", [&](Strategy& st) { (void)st.reduce(ReduceOp::mean, rows, mirror::axis0); }},
        {"mirror::Strategy::gather", [&](Strategy& st) { (void)st.gather(rows, mirror::axis0); }},
        {"mirror::Strategy::broadcast", [&](Strategy& st) { (void)st.broadcast(std::vector<int>{1, 2}); }},
        {"mirror::Strategy::make_variable", [&](Strategy& st) { (void)st.make_variable(std::vector<float>(3, 1.f)); }},
        {"mirror::SyncOnReadVariable::value", [&](Strategy&) { (void)seen.value(); }},
        {"mirror::save", [&](Strategy& st) { mirror::save(st, dir.path("never.ckpt"), weights); }},
        {"mirror::restore", [&](Strategy& st) { mirror::restore(st, dir.path("ok.ckpt"), weights); }},
        {"mirror::Strategy::distribute_dataset", [&](Strategy& st) {
           for (const auto& step : st.distribute_dataset(batches)) (void)step;
         }},
        {"mirror::DatasetsFromFunction (has-data step)", [&](Strategy& st) {
           auto per_replica = [R](const mirror::InputContext&) {
             return std::vector<std::vector<int>>(static_cast<std::size_t>(2 * R), std::vector<int>{1});
           };
           for (const auto& step : st.distribute_datasets_from_function(per_replica)) (void)step;
         }},
    };
    const std::vector<in_fn_call> inside = {
        {"all_reduce(sum)", [](Strategy& st) { st.run([](auto& ctx) { ctx.all_reduce(ReduceOp::sum, 1); }); }},
        {"all_reduce(mean)",
         [](Strategy& st) { st.run([](auto& ctx) { ctx.all_reduce(ReduceOp::mean, std::vector<float>(4, 1.f)); }); }},
        {"broadcast(from = 0)",
         [](Strategy& st) { st.run([](auto& ctx) { ctx.broadcast(std::vector<int>{1, 2}, 0); }); }},
        {"all_gather", [](Strategy& st) { st.run([](auto& ctx) { ctx.all_gather(1, mirror::axis0); }); }},
        {"reduce_scatter(sum)", [N](Strategy& st) {
           st.run([N](auto& ctx) { ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(static_cast<std::size_t>(N), 1.f)); });
         }},
        {"merge_call", [](Strategy& st) {
           st.run([](auto& ctx) {
             ctx.merge_call([](auto& strategy, mirror::PerReplica<int> v) { return strategy.reduce(ReduceOp::sum, v); },
                            ctx.replica_id_in_sync_group());
           });
         }},
    };
    for (const int odd : {0, W - 1}) {  // the chief alone outside run, then the last worker
      for (const auto& x : outside) {
        for (const auto& y : inside) {
          CAPTURE(R, odd, x.name, y.name);
          std::string what;
          try {
            if (w == odd) {
              x.call(s);
            } else {
              y.run(s);
            }
            FAIL("no error");
          } catch (const mirror::shape_error& e) {
            what = e.what();
          }
          CAPTURE(what);
          // The odd worker's call was an extra one: its run after it is refused, since that
          // run's match (the others' run, which met the call) has failed.
          if (w == odd) {
            try {
              y.run(s);
              FAIL("the run after the extra call was not refused");
            } catch (const mirror::shape_error& e) {
              CHECK(std::string(e.what()) == what);
            }
          }
          // Both calls are named, on every worker.
          CHECK_THAT(what, Catch::Contains(std::string("in ") + x.name + " called outside fn"));
          CHECK_THAT(what, Catch::Contains(std::string("at collective #1 (") + y.name + ") of fn"));
          CHECK_THAT(what, Catch::Contains("worker " + std::to_string(odd) + " (replicas " + std::to_string(odd * R) +
                                           ".." + std::to_string(odd * R + R - 1) + ")"));
          check_goes_on(s);
        }
      }
    }
    // Nothing changed: the refused save wrote no file, the refused restore and the variables
    // kept their values.
    if (w == 0) CHECK(!std::filesystem::exists(dir.path("never.ckpt")));
    CHECK(weights.value() == std::vector<float>{1.f, 2.f});
    CHECK(seen.value() == N);
  }
}

TEST_CASE("agreement: the newcomer's program: a reduce on the chief and an all_reduce in fn", "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  for (int R = 1; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    const int N = W * R;
    const auto ids = s.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); });
    for (const bool chief_outside : {true, false}) {
      CAPTURE(R, chief_outside);
      const bool outside = chief_outside ? w == 0 : w != 0;
      if (outside) {
        CHECK_THROWS_AS(s.reduce(ReduceOp::sum, ids), mirror::shape_error);
        // The reduce was an extra call: the run it stood in for is refused (its match failed).
        CHECK_THROWS_AS(s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); }), mirror::shape_error);
      } else {
        CHECK_THROWS_AS(s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); }), mirror::shape_error);
      }
      // Then both calls together are right.
      CHECK(s.reduce(ReduceOp::sum, ids) == N * (N - 1) / 2);
      const auto n = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
      CHECK(n.primary() == N);
    }
  }
}

TEST_CASE("agreement: mean against sum is a shape_error on every worker, in fn and outside run", "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  for (int R = 1; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    CAPTURE(R);
    // Every replica of worker 0 passes mean, every other replica sum: no worker's replicas
    // disagree among themselves, so only the cross-worker check can see it.
    try {
      s.run([&](auto& ctx) { ctx.all_reduce(w == 0 ? ReduceOp::mean : ReduceOp::sum, std::vector<float>(8, 1.f)); });
      FAIL("no error");
    } catch (const mirror::shape_error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      // The op the user wrote, not the sum the cross step computes.
      CHECK_THAT(what, Catch::Contains("worker 0 (replicas 0.." + std::to_string(R - 1) + ") reduces 8 float32 elements with mean"));
      CHECK_THAT(what, Catch::Contains("worker 1 (replicas " + std::to_string(R) + ".." + std::to_string(2 * R - 1) +
                                       ") reduces 8 float32 elements with sum"));
    }
    check_goes_on(s);
    const auto values = s.run([](auto& ctx) { return 2 * ctx.replica_id_in_sync_group(); });
    CHECK_THROWS_AS(s.reduce(w == W - 1 ? ReduceOp::mean : ReduceOp::sum, values), mirror::shape_error);
    check_goes_on(s);
  }
}

TEST_CASE("agreement: a mismatch across workers names each worker's call site", "[mpi][mismatch][call_sites]") {
  const int w = world_rank();
  for (int R = 1; R <= 2; ++R) {
    Strategy& s = strategy_with(R);
    CAPTURE(R);
    std::string what;
    constexpr unsigned sum_line = __LINE__ + 5, max_line = sum_line + 2;
    try {
      s.run([&](auto& ctx) {
        // (sum_line and max_line count from the constexpr above: keep these lines.)
        if (w == 0) {
          ctx.all_reduce(ReduceOp::sum, 1);
        } else {
          ctx.all_reduce(ReduceOp::max, 1);
        }
      });
      FAIL("no error");
    } catch (const mirror::shape_error& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK_THAT(what, Catch::Contains("at collective #1 (all_reduce(sum)) of fn at " + site(sum_line)));
    CHECK_THAT(what, Catch::Contains("at collective #1 (all_reduce(max)) of fn at " + site(max_line)));
    CHECK(same_on_every_worker(what));
    check_goes_on(s);
    // A cross-replica call outside run against a collective in fn: the call site of each.
    const auto ids = s.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); });
    constexpr unsigned reduce_line = __LINE__ + 4, in_fn_line = reduce_line + 2;
    try {
      // (reduce_line and in_fn_line count from the constexpr above: keep these lines.)
      if (w == 0) {
        (void)s.reduce(ReduceOp::sum, ids);
      } else {
        s.run([](auto& ctx) { ctx.all_reduce(ReduceOp::sum, 1); });
      }
      FAIL("no error");
    } catch (const mirror::shape_error& e) {
      what = e.what();
    }
    CHECK_THAT(what, Catch::Contains("in mirror::Strategy::reduce called outside fn at " + site(reduce_line)));
    CHECK_THAT(what, Catch::Contains("at collective #1 (all_reduce(sum)) of fn at " + site(in_fn_line)));
    CHECK(same_on_every_worker(what));
    // The reduce was an extra call: worker 0's run after it is refused (its match has failed).
    if (w == 0) CHECK_THROWS_AS(s.run([](auto& ctx) { ctx.all_reduce(ReduceOp::sum, 1); }), mirror::shape_error);
    check_goes_on(s);
  }
}

TEST_CASE("agreement: a mismatch inside one worker is the same shape_error on every worker", "[mpi][mismatch]") {
  const int W = world_size();
  for (int R = 2; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    const int bad = W * R - 1;  // the last worker's last replica
    for (int fault = 0; fault < 3; ++fault) {
      CAPTURE(R, fault);
      std::string what;
      try {
        s.run([&](auto& ctx) {
          const bool me = ctx.replica_id_in_sync_group() == bad;
          ctx.all_reduce(ReduceOp::sum, 1.0);  // a collective every replica agrees on first
          if (fault == 0) ctx.all_reduce(ReduceOp::sum, std::vector<float>(me ? 5 : 4, 1.f));  // another size
          if (fault == 1 && me) ctx.broadcast(1, 0);                                          // another collective
          if (fault == 1 && !me) ctx.all_reduce(ReduceOp::max, 1);
          if (fault == 2) ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(me ? 9 : 8, 1.f));
        });
        FAIL("no error");
      } catch (const mirror::shape_error& e) {
        what = e.what();
      }
      CAPTURE(what);
      // Every worker's copy names the global replica (not the local index 1 or 2).
      CHECK_THAT(what, Catch::Contains("replica " + std::to_string(bad)));
      CHECK_THAT(what, Catch::Contains("collective #2"));
      CHECK(same_on_every_worker(what));
      check_goes_on(s);
    }
  }
}

TEST_CASE("agreement: a replica that returns early is the same timeout_error, with global ids, on every worker",
          "[mpi][mismatch]") {
  const int W = world_size();
  for (int R = 2; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    for (const int early : {R, W * R - 1, 1}) {  // worker 1's first replica; the last; worker 0's second
      for (const int at : {0, 1}) {  // before the first collective, or the second
        CAPTURE(R, early, at);
        std::vector<int> missing;
        std::string what;
        constexpr unsigned first_line = __LINE__ + 6, second_line = first_line + 2;
        try {
          s.run([&](auto& ctx) {
            const int g = ctx.replica_id_in_sync_group();
            if (at == 0 && g == early) return;
            // (first_line and second_line count from the constexpr above: keep these lines.)
            ctx.all_reduce(ReduceOp::sum, std::vector<float>(16, 1.f));
            if (at == 1 && g == early) return;
            ctx.all_reduce(ReduceOp::max, g);
          });
          FAIL("no error");
        } catch (const mirror::timeout_error& e) {
          missing = e.missing();
          what = e.what();
        }
        CAPTURE(what);
        CHECK(missing == std::vector<int>{early});
        CHECK_THAT(what, Catch::Contains("{" + std::to_string(early) + "}"));
        // Where the replicas of the early one's worker are, with this file's lines.
        const std::string waits = at == 0 ? "collective #1 (all_reduce(sum)) at " + site(first_line)
                                          : "collective #2 (all_reduce(max)) at " + site(second_line);
        CHECK_THAT(what, Catch::Contains("waits in " + waits));
        CHECK_THAT(what, Catch::Contains(at == 0 ? "replica " + std::to_string(early) + " made no collective call in this run"
                                                 : "replica " + std::to_string(early) +
                                                       "'s last call was collective #1 (all_reduce(sum)) at " +
                                                       site(first_line)));
        check_goes_on(s);
      }
    }
  }
}

TEST_CASE("agreement: a worker whose every replica returns early: a timeout_error at its next call", "[mpi][mismatch]") {
  // With one replica a worker nobody local waits for it: its run returns. Every worker makes the
  // same runs: the early worker's next run meets the others' run 1, and both throw the same
  // timeout_error; the others' run 2 is refused with it (its match, the early worker's run 2,
  // has failed), and run 3 is right everywhere.
  const int W = world_size(), w = world_rank();
  Strategy& s = strategy_with(1);
  const int early = W - 1;
  std::string first, second;
  std::vector<int> missing;
  try {
    s.run([&](auto& ctx) {
      ctx.all_reduce(ReduceOp::sum, 1);
      if (w == early) return;
      ctx.all_reduce(ReduceOp::sum, 2);
    });
  } catch (const mirror::timeout_error& e) {
    first = e.what();
    missing = e.missing();
  }
  try {
    s.run([](auto& ctx) { ctx.all_reduce(ReduceOp::sum, 1); });
    FAIL("no error");
  } catch (const mirror::timeout_error& e) {
    second = e.what();
    if (w == early) missing = e.missing();
  }
  CAPTURE(first, second);
  CHECK(first.empty() == (w == early));
  if (w != early) CHECK(second == first);
  CHECK_THAT(second, Catch::Contains("returned from fn without reaching"));
  CHECK_THAT(second, Catch::Contains("refuses its cross-worker calls through run"));
  CHECK(same_on_every_worker(second));
  CHECK(missing == std::vector<int>{early});
  check_goes_on(s);
}

// The issue-60 program: every worker makes the same runs; in run 1 every replica of one worker
// returns from fn without the collective the others make (blocking, non-blocking, or a gradient
// bucket), then each run k all-reduces k. Runs pair by their count: a run that returns normally
// must have paired with the same run on every worker, so its value is exact; once the runs the
// disagreement spoiled are over (run 2 at the latest), every run is exact on every worker.
TEST_CASE("agreement: after a worker's early return every run pairs with the same run of the others",
          "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  enum class skipped { blocking, async, bucket };
  for (int R = 1; R <= 2; ++R) {
    Strategy& s = strategy_with(R);
    const int N = W * R;
    for (const skipped how : {skipped::blocking, skipped::async, skipped::bucket}) {
      for (const int early : {W - 1, 0}) {
        CAPTURE(R, static_cast<int>(how), early);
        // What each of runs 1..5 did on this worker: the value it returned, or -1 for an error.
        std::vector<float> got;
        std::vector<std::string> errors;
        try {
          s.run([&](auto& ctx) {
            std::vector<float> g(5, 1.f);
            if (how == skipped::bucket) {
              auto buckets = ctx.gradient_buckets(ReduceOp::sum, g, 0);
              if (w == early) return;  // forgot ready and finish
              buckets.ready(0);
              buckets.finish();
              return;
            }
            if (w == early) return;
            if (how == skipped::blocking) {
              ctx.all_reduce(ReduceOp::sum, std::span<float>(g));
            } else {
              ctx.all_reduce_async(ReduceOp::sum, std::span<float>(g)).wait();
            }
          });
          got.push_back(0.f);
        } catch (const mirror::error& e) {
          got.push_back(-1.f);
          errors.push_back(e.what());
        }
        for (int k = 2; k <= 5; ++k) {
          try {
            const auto out = s.run([k](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, float(k)); });
            for (const float v : out) CHECK(v == float(k * N));  // never another run's value
            got.push_back(out.primary());
          } catch (const mirror::error& e) {
            got.push_back(-1.f);
            errors.push_back(e.what());
          }
        }
        CAPTURE(got, errors);
        CHECK(got[2] == float(3 * N));
        CHECK(got[3] == float(4 * N));
        CHECK(got[4] == float(5 * N));
        if (how == skipped::bucket) {
          // The dropped buckets are an error of the early worker's run, as an exception in fn.
          CHECK(got[0] == -1.f);
          CHECK(got[1] == float(2 * N));
        } else if (w == early) {
          CHECK(got[0] == 0.f);   // nobody local waited
          CHECK(got[1] == -1.f);  // its next cross-worker call meets the others' run 1
        } else {
          CHECK(got[0] == -1.f);
          CHECK(got[1] == -1.f);  // its run 2's match was the early worker's failed run 2
        }
        if (how != skipped::bucket) {
          REQUIRE(!errors.empty());
          CHECK_THAT(errors[0], Catch::Contains("returned from fn without reaching"));
          CHECK(same_on_every_worker(errors[0]));
        }
      }
    }
  }
}

TEST_CASE("agreement: a broadcast of another element type on one worker is a shape_error, empty or not",
          "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  for (int R = 1; R <= 2; ++R) {
    Strategy& s = strategy_with(R);
    for (const std::size_t n : {std::size_t{0}, std::size_t{3}}) {
      for (const int from : {0, W * R - 1}) {
        CAPTURE(R, n, from);
        std::vector<std::vector<std::int32_t>> narrow(static_cast<std::size_t>(R), std::vector<std::int32_t>(n, w));
        std::vector<std::vector<std::int64_t>> wide(static_cast<std::size_t>(R), std::vector<std::int64_t>(n, w));
        std::string what;
        try {
          s.run([&](auto& ctx) {
            const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group() - w * R);
            if (w == W - 1) {
              ctx.broadcast(std::span<std::int64_t>(wide[r]), from);
            } else {
              ctx.broadcast(std::span<std::int32_t>(narrow[r]), from);
            }
          });
          FAIL("no error");
        } catch (const mirror::shape_error& e) {
          what = e.what();
        }
        CAPTURE(what);
        CHECK(same_on_every_worker(what));
        for (const auto& v : narrow) CHECK(v == std::vector<std::int32_t>(n, w));  // nothing written
        for (const auto& v : wide) CHECK(v == std::vector<std::int64_t>(n, w));
        check_goes_on(s);
      }
    }
  }
}

TEST_CASE("agreement: an exception in fn keeps the original nested on its own worker", "[mpi]") {
  const int W = world_size(), w = world_rank();
  for (int R = 1; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    for (const int thrower : {0, W * R - 1, R - 1}) {
      CAPTURE(R, thrower);
      constexpr unsigned first_line = __LINE__ + 4;
      try {
        s.run([&](auto& ctx) {
          // (first_line counts from its definition above: keep the next line where it is.)
          ctx.all_reduce(ReduceOp::sum, 1);
          if (ctx.replica_id_in_sync_group() == thrower) throw std::out_of_range("the thrower's own");
          ctx.all_reduce(ReduceOp::sum, std::vector<float>(1000, 1.f));
        });
        FAIL("no error");
      } catch (const mirror::replica_error& e) {
        CHECK(e.replica() == thrower);
        CHECK_THAT(std::string(e.what()), Catch::Contains("the thrower's own"));
        // Where in fn, on every worker: after its first collective.
        CHECK_THAT(std::string(e.what()), Catch::Contains("(its last collective call was collective #1 (all_reduce(sum)) at " +
                                                          site(first_line) + ")"));
        if (w == thrower / R) {
          CHECK_THROWS_AS(e.rethrow_nested(), std::out_of_range);
        } else {
          CHECK_THAT(std::string(e.what()), Catch::Contains("worker " + std::to_string(thrower / R) + ":"));
        }
      }
      check_goes_on(s);
    }
  }
}

TEST_CASE("agreement: a broadcast or all_reduce of spans refused anywhere changes no span on any worker",
          "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  for (int R = 2; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    const int N = W * R;
    for (int fault = 0; fault < 5; ++fault) {
      CAPTURE(R, fault);
      std::vector<std::vector<float>> spans(static_cast<std::size_t>(R));
      for (int r = 0; r < R; ++r) spans[static_cast<std::size_t>(r)].assign(6, float(w * R + r));
      const auto before = spans;
      CHECK_THROWS_AS(s.run([&](auto& ctx) {
                        const int g = ctx.replica_id_in_sync_group();
                        auto& mine = spans[static_cast<std::size_t>(g - w * R)];
                        if (fault == 0) ctx.broadcast(std::span<float>(mine), w == W - 1 ? N - 1 : 0);  // roots differ
                        if (fault == 1 && w == W - 1) ctx.all_reduce(ReduceOp::sum, std::span<float>(mine));
                        if (fault == 1 && w != W - 1) ctx.broadcast(std::span<float>(mine), 0);
                        if (fault == 2) ctx.broadcast(std::span<float>(mine.data(), w == W - 1 ? 5 : 6), 0);  // sizes
                        // Inside the last worker only (its last replica): the others must not
                        // have reduced their spans locally when the failure reaches them.
                        const bool last = g == N - 1;
                        if (fault == 3) ctx.all_reduce(ReduceOp::sum, std::span<float>(mine.data(), last ? 5 : 6));
                        if (fault == 4) ctx.broadcast(std::span<float>(mine.data(), last ? 5 : 6), 0);
                      }),
                      mirror::shape_error);
      CHECK(spans == before);
      check_goes_on(s);
    }
  }
}

TEST_CASE("agreement: empty leaves on one worker and a mismatch on another: every worker throws", "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  for (int R = 2; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    const int bad = W * R - 1;
    for (int verb = 0; verb < 3; ++verb) {
      CAPTURE(R, verb);
      CHECK_THROWS_AS(s.run([&](auto& ctx) {
                        // Every replica passes 0 elements but the last worker's last, which passes 1.
                        const std::size_t n = ctx.replica_id_in_sync_group() == bad ? 1 : 0;
                        if (verb == 0) ctx.all_reduce(ReduceOp::sum, std::vector<float>(n, 1.f));
                        std::vector<float> buffer(n, 1.f);
                        if (verb == 1) ctx.broadcast(std::span<float>(buffer), 0);
                        if (verb == 2) ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(n, 1.f));
                      }),
                      mirror::shape_error);
      check_goes_on(s);
    }
  }
  (void)w;
}

TEST_CASE("agreement: a cross-worker timeout says the configured timeout and what the late worker did",
          "[mpi][timeout]") {
  // Its own strategy: after a timeout a strategy cannot continue (Open MPI cannot cancel a post).
  const int W = world_size(), w = world_rank();
  shared_strategy().reset();
  Strategy s(Cluster{.local = {.replicas = 2}, .timeout = std::chrono::milliseconds(1500)});
  const int late = W - 1;
  constexpr int tag_gave_up = 4712;
  constexpr unsigned first_line = __LINE__ + 4, second_line = first_line + 7;
  try {
    s.run([&](auto& ctx) {
      // (first_line and second_line count from the constexpr above: keep these lines.)
      ctx.all_reduce(ReduceOp::sum, 1);
      if (w == late && ctx.replica_id_in_sync_group() == late * 2) {
        for (int other = 0; other < W - 1; ++other) {
          int dummy = 0;
          MPI_Recv(&dummy, 1, MPI_INT, other, tag_gave_up, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
      }
      ctx.all_reduce(ReduceOp::mean, std::vector<float>(8, 1.f));
    });
    FAIL("no timeout_error");
  } catch (const mirror::timeout_error& e) {
    const std::string what = e.what();
    CAPTURE(what);
    if (w != late) {
      // The first to give up says the configured timeout; with 3 workers another waiting worker
      // may hear of it first and say so instead.
      if (what.find("gave up waiting for it") == std::string::npos) {
        CHECK_THAT(what, Catch::Contains("for the timeout of 1500 ms (devices::Cluster{.timeout})"));
      }
      CHECK_THAT(what, Catch::Contains("did not reach this collective"));
      CHECK_THAT(what, !Catch::Contains("dead or unreachable"));
      CHECK_THAT(what, Catch::Contains("collective #2 (all_reduce(mean)) of fn at " + site(second_line)));
      // What the late worker answered: its last call, with this file's line.
      if (what.find("gave up waiting for it") == std::string::npos) {
        CHECK_THAT(what, Catch::Contains("worker " + std::to_string(late) +
                                         "'s last cross-worker call was collective #1 (all_reduce(sum)) of fn at " +
                                         site(first_line)));
      }
      CHECK(e.missing() == std::vector<int>{2 * late, 2 * late + 1});
      int dummy = 0;
      MPI_Send(&dummy, 1, MPI_INT, late, tag_gave_up, MPI_COMM_WORLD);
    } else {
      CHECK_THAT(what, Catch::Contains("gave up waiting for this worker"));
    }
  }
}

TEST_CASE("agreement: gather of leaves whose element type differs across workers is a shape_error on every worker",
          "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  for (int R = 1; R <= 2; ++R) {
    Strategy& s = strategy_with(R);
    for (int pair = 0; pair < 2; ++pair) {
      CAPTURE(R, pair);
      // The last worker's components hold another element type: int32 against float (the same
      // size: the bytes would pass for each other), or float against double (not the same size).
      std::string what;
      try {
        if (w != W - 1) {
          if (pair == 0) (void)s.gather(s.run([](auto&) { return std::vector<float>{1.f, 2.f}; }), mirror::axis0);
          if (pair == 1) (void)s.gather(s.run([](auto&) { return std::vector<double>{1.0, 2.0}; }), mirror::axis0);
        } else {
          if (pair == 0) (void)s.gather(s.run([](auto&) { return std::vector<std::int32_t>{1, 2}; }), mirror::axis0);
          if (pair == 1) (void)s.gather(s.run([](auto&) { return std::vector<float>{1.f, 2.f}; }), mirror::axis0);
        }
        FAIL("no error");
      } catch (const mirror::shape_error& e) {
        what = e.what();
      }
      CAPTURE(what);
      CHECK_THAT(what, Catch::Contains("mirror::Strategy::gather"));
      CHECK_THAT(what, Catch::Contains("element type"));
      CHECK_THAT(what, Catch::Contains("worker " + std::to_string(W - 1)));
      CHECK(same_on_every_worker(what));
      // Usable after: a gather every worker agrees on.
      const auto all = s.gather(s.run([](auto& ctx) { return std::vector<int>{ctx.replica_id_in_sync_group()}; }),
                                mirror::axis0);
      std::vector<int> want(static_cast<std::size_t>(W * R));
      for (int g = 0; g < W * R; ++g) want[static_cast<std::size_t>(g)] = g;
      CHECK(all == want);
      check_goes_on(s);
    }
  }
}

TEST_CASE("agreement: ReplicaContext::all_gather of another element type on one worker is a shape_error naming both",
          "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  if (W < 2) return;
  for (int R = 1; R <= 2; ++R) {
    Strategy& s = strategy_with(R);
    // int32 against float (the same size: the bytes would pass for each other), float against
    // double (not the same size); the nest form and the span form.
    for (int pair = 0; pair < 3; ++pair) {
      CAPTURE(R, pair);
      const bool odd = w == W - 1;
      std::vector<std::string> texts(static_cast<std::size_t>(R));
      CHECK_THROWS_AS(s.run([&](auto& ctx) {
                        const auto l = static_cast<std::size_t>(ctx.replica_id_in_sync_group() - w * R);
                        try {
                          if (pair == 0 && odd) ctx.all_gather(std::vector<std::int32_t>(3, 1), mirror::axis0);
                          if (pair == 0 && !odd) ctx.all_gather(std::vector<float>(3, 1.f), mirror::axis0);
                          if (pair == 1 && odd) ctx.all_gather(std::tuple{1, std::vector<float>(2, 1.f)}, mirror::axis0);
                          if (pair == 1 && !odd) ctx.all_gather(std::tuple{1, std::vector<double>(2, 1.0)}, mirror::axis0);
                          if (pair == 2) {
                            std::vector<std::int32_t> in_i(2, 1), out_i(static_cast<std::size_t>(2 * W * R));
                            std::vector<float> in_f(2, 1.f), out_f(static_cast<std::size_t>(2 * W * R));
                            if (odd) ctx.all_gather(std::span<const std::int32_t>(in_i), std::span(out_i), mirror::axis0);
                            if (!odd) ctx.all_gather(std::span<const float>(in_f), std::span(out_f), mirror::axis0);
                          }
                        } catch (const mirror::shape_error& e) {
                          texts[l] = e.what();
                          throw;
                        }
                      }),
                      mirror::shape_error);
      CAPTURE(texts[0]);
      for (const auto& t : texts) CHECK(t == texts[0]);
      CHECK(same_on_every_worker(texts[0]));
      const std::string theirs = pair == 0 || pair == 2 ? "int32" : "float32";
      const std::string ours = pair == 0 || pair == 2 ? "float32" : "float64";
      CHECK_THAT(texts[0], Catch::Contains("leaf " + std::to_string(pair == 1 ? 1 : 0) + " holds " + theirs));
      CHECK_THAT(texts[0], Catch::Contains("(worker " + std::to_string(W - 1) + ") but " + ours));
      check_goes_on(s);
    }
  }
}

TEST_CASE("agreement: every replica of every worker sees the same error type inside fn", "[mpi][mismatch]") {
  const int W = world_size(), w = world_rank();
  for (int R = 2; R <= 3; ++R) {
    Strategy& s = strategy_with(R);
    const int N = W * R;
    // Mismatches across workers (the last worker differs) and inside one (the last replica).
    for (int fault = 0; fault < 6; ++fault) {
      CAPTURE(R, fault);
      std::vector<int> seen(static_cast<std::size_t>(R), 0);  // 1: shape_error, 2: anything else
      std::vector<std::string> texts(static_cast<std::size_t>(R));
      CHECK_THROWS_AS(s.run([&](auto& ctx) {
                        const int g = ctx.replica_id_in_sync_group();
                        const bool odd_worker = w == W - 1, odd_replica = g == N - 1;
                        auto& mine = seen[static_cast<std::size_t>(g - w * R)];
                        try {
                          if (fault == 0) ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(odd_worker ? 7 : 8, 1.f));
                          if (fault == 1 && odd_worker) ctx.reduce_scatter(ReduceOp::sum, std::vector<std::int32_t>(8, 1));
                          if (fault == 1 && !odd_worker) ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(8, 1.f));
                          // (Lengths may differ in all_gather; the nests may not.)
                          if (fault == 2 && odd_worker) ctx.all_gather(std::vector<float>(8, 1.f), mirror::axis0);
                          if (fault == 2 && !odd_worker) {
                            ctx.all_gather(std::tuple{std::vector<float>(4, 1.f), std::vector<float>(4, 1.f)},
                                           mirror::axis0);
                          }
                          if (fault == 3 && odd_worker) ctx.all_gather(std::vector<std::int32_t>(8, 1), mirror::axis0);
                          if (fault == 3 && !odd_worker) ctx.all_gather(std::vector<float>(8, 1.f), mirror::axis0);
                          if (fault == 4) ctx.reduce_scatter(ReduceOp::sum, std::vector<float>(odd_replica ? 9 : 8, 1.f));
                          if (fault == 5 && odd_replica) ctx.all_gather(std::vector<float>(8, 1.f), mirror::axis0);
                          if (fault == 5 && !odd_replica) {
                            ctx.all_gather(std::tuple{std::vector<float>(4, 1.f), std::vector<float>(4, 1.f)},
                                           mirror::axis0);
                          }
                        } catch (const mirror::shape_error& e) {
                          mine = 1;
                          texts[static_cast<std::size_t>(g - w * R)] = e.what();
                          throw;
                        } catch (...) {
                          mine = 2;
                          throw;
                        }
                      }),
                      mirror::shape_error);
      CHECK(seen == std::vector<int>(static_cast<std::size_t>(R), 1));
      for (const auto& t : texts) CHECK(t == texts[0]);
      CHECK(same_on_every_worker(texts[0]));
      check_goes_on(s);
    }
  }
}
