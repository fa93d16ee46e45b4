// SPDX-License-Identifier: Apache-2.0
// backends/threads: the persistent pool, oversubscription, parking when idle, timeouts and the
// names of replicas that never arrive.

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <mirror/mirror.hpp>
#include <sched.h>
#include "support/reference.hpp"

using mirror::ReduceOp;
using namespace std::chrono_literals;
using S = mirror::Strategy<mirror::devices::Threads>;


TEST_CASE("the pool is created once; replica 0 is the calling thread", "[threads][pool]") {
  S s{{.replicas = 4}};
  auto ids = [&] {
    return s.run([](auto&) { return std::this_thread::get_id(); });
  };
  const auto first = ids(), second = ids();
  REQUIRE(first[0] == std::this_thread::get_id());
  std::set<std::thread::id> distinct(first.begin(), first.end());
  REQUIRE(distinct.size() == 4);
  for (std::size_t r = 0; r < 4; ++r) REQUIRE(first[r] == second[r]);
}

TEST_CASE("16 replicas on a 2-core machine make progress through many collectives", "[threads][oversubscribed]") {
  S s{{.replicas = 16}};
  for (int step = 0; step < 20; ++step) {
    const auto out = s.run([&](auto& ctx) {
      std::vector<double> x(1000, double(ctx.replica_id_in_sync_group()));
      for (int k = 0; k < 5; ++k) x = *ctx.all_reduce(ReduceOp::mean, x);
      return ctx.all_reduce(ReduceOp::sum, x[0]);
    });
    for (double v : out) REQUIRE(v == 16 * 7.5);
  }
}

TEST_CASE("an idle pool parks instead of spinning", "[threads][pool]") {
  // Oversubscribed (8 replicas: no spin, four yields) and with a core per replica (the long
  // spin, 1 ms): after a run every worker ends up parked on the pool's condition variable,
  // where it burns no CPU, and the next run wakes them all. Event-based: the test waits for
  // the parked count; the deadline only turns a pool that never parks into a failure.
  const int cores = static_cast<int>(mirror::threads::usable_cores());
  for (const int replicas : {8, std::max(cores, 2)}) {
    CAPTURE(replicas);
    S s{{.replicas = replicas}};
    for (int round = 0; round < 3; ++round) {
      REQUIRE(s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); }).primary() == replicas);
      const auto deadline = std::chrono::steady_clock::now() + 60s;
      while (s.runtime().parked_workers() != replicas - 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      REQUIRE(s.runtime().parked_workers() == replicas - 1);
    }
  }
}

TEST_CASE("a replica that returns without reaching a collective is named", "[threads][errors]") {
  S s{{.replicas = 4}};
  try {
    s.run([](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 2) return;
      ctx.all_reduce(ReduceOp::sum, 1);
    });
    FAIL("no exception");
  } catch (const mirror::timeout_error& e) {
    REQUIRE(e.missing() == std::vector<int>{2});
    REQUIRE_THAT(e.what(), Catch::Contains("{2} returned from fn without reaching"));
  }
  REQUIRE(s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); }).primary() == 4);
}

TEST_CASE("a timeout names the collective as fn wrote it: its number, kind and argument", "[threads][errors][timeout]") {
  // Numbered like the agreement check's shape_error (collective #1 is fn's first), not by the
  // runtime's exchanges: the all_reduce of a vector, the broadcast and the merge_call before it
  // take several exchanges each, but count one collective each.
  S s{{.replicas = 3}};
  try {
    s.run([](auto& ctx) {
      ctx.all_reduce(ReduceOp::max, std::vector<double>(5000, 1.0));
      ctx.broadcast(std::vector<int>(100, ctx.replica_id_in_sync_group()), 2);
      ctx.merge_call([](S&, mirror::PerReplica<int>) {}, 1);
      if (ctx.replica_id_in_sync_group() == 0) return;
      ctx.broadcast(1.5f, 1);  // collective #4: replica 0 has returned
    });
    FAIL("no exception");
  } catch (const mirror::timeout_error& e) {
    REQUIRE(e.missing() == std::vector<int>{0});
    REQUIRE_THAT(e.what(), Catch::Contains("collective #4 (broadcast(from = 1))") &&
                               Catch::Contains("{0} returned from fn without reaching"));
  }
}

TEST_CASE("a replica that is late beyond the timeout is named, and the others do not hang", "[threads][errors][timeout]") {
  // Replica 1 reaches the all_reduce only after both others have thrown their timeout_error:
  // late by construction, not by a sleep longer than the timeout.
  S s{{.replicas = 3, .timeout = 200ms}};
  std::atomic<int> gave_up{0};
  const auto start = std::chrono::steady_clock::now();
  try {
    s.run([&](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) {
        while (gave_up.load() < 2) std::this_thread::yield();
        ctx.all_reduce(ReduceOp::sum, 1);  // the run's timeout_error, at once
        return;
      }
      try {
        ctx.all_reduce(ReduceOp::sum, 1);
      } catch (const mirror::timeout_error&) {
        ++gave_up;
        throw;
      }
    });
    FAIL("no exception");
  } catch (const mirror::timeout_error& e) {
    REQUIRE(e.missing() == std::vector<int>{1});
    REQUIRE_THAT(e.what(), Catch::Contains("200 ms") && Catch::Contains("{1} did not reach") &&
                               Catch::Contains("collective #1 (all_reduce(sum))"));
  }
  REQUIRE(gave_up == 2);
  REQUIRE(std::chrono::steady_clock::now() - start >= 200ms);  // not before the timeout
  REQUIRE(s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); }).primary() == 3);
}

TEST_CASE("every replica of a timed-out run throws the one error that its claimant built", "[threads][errors][timeout]") {
  // Issue 33: 13 replicas, ReductionToOneDevice{.reduce_to = 3}; every replica takes part in a
  // broadcast of 75,360 doubles from replica 9, then 9 returns from fn and the others all_reduce.
  // Each waiter used to build its own timeout_error: one built after another replica's cancel()
  // named replicas that were only cancelled ({9, 10}), and a replica cancelled between the claim
  // of the failure and its publication got the internal cancellation instead. Now one replica
  // claims the failure and every other one rethrows its error: the same text, the same missing
  // list, on every replica and out of run. Many rounds, since which replica wakes first varies.
  // The failure comes from replica 9's return, seen at once, not from the clock: the issue's
  // 200 ms timeout only let a loaded machine (13 threads on 2 cores) time out a round's
  // broadcast instead, which failed this test for the wrong reason.
  mirror::Strategy<mirror::devices::Threads, mirror::ops::ReductionToOneDevice> s{{.replicas = 13, .timeout = 5s},
                                                                                 {.reduce_to = 3}};
  const int rounds = mirror::test::sanitized ? 100 : 2000;
  for (int round = 0; round < rounds; ++round) {
    CAPTURE(round);
    std::vector<std::string> caught(13);  // what each replica's collective threw
    std::string reported;
    auto describe = [](const mirror::timeout_error& e) {
      std::string text = "missing {";
      for (const int r : e.missing()) text += std::to_string(r) + " ";
      return text + "}: " + e.what();
    };
    try {
      s.run([&](auto& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        std::string& mine = caught[static_cast<std::size_t>(r)];
        std::vector<double> v(75360, double(r));
        try {
          ctx.broadcast(std::span<double>(v), 9);
          if (r == 9) return;
          ctx.all_reduce(ReduceOp::max, std::vector<double>(1, double(r)));
          mine = "no error";
        } catch (const mirror::timeout_error& e) {
          mine = describe(e);
          throw;
        } catch (...) {
          mine = "another exception";
          throw;
        }
      });
      FAIL("no timeout_error");
    } catch (const mirror::timeout_error& e) {
      reported = describe(e);
    }
    REQUIRE_THAT(reported, Catch::StartsWith("missing {9 }: "));
    for (int r = 0; r < 13; ++r) {
      CAPTURE(r);
      if (r != 9) REQUIRE(caught[static_cast<std::size_t>(r)] == reported);
    }
  }
  REQUIRE(s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); }).primary() == 13);
}

TEST_CASE("a timed-out collective ends the run's collectives, even when fn catches the error",
          "[threads][errors][timeout]") {
  // Replica 0 times out, catches the error and goes on; replica 1 arrives late at the first
  // collective (with another op). Its first collective must not pair with replica 0's stale
  // arrival, nor replica 0's second one with anything: every later collective of the run throws
  // the timeout, and run reports it (it once crashed describing a "disagreement" from a slot
  // that held no check).
  S s{{.replicas = 2, .timeout = 100ms}};
  std::atomic<bool> caught{false};
  std::atomic<int> second_returned{0};
  try {
    s.run([&](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 0) {
        try {
          ctx.all_reduce(ReduceOp::sum, 1.0f);
        } catch (const mirror::timeout_error&) {
          caught = true;
        }
        ctx.all_reduce(ReduceOp::sum, 2.0f);
        ++second_returned;
      } else {
        while (!caught) std::this_thread::yield();  // late: after replica 0 gave up
        ctx.all_reduce(ReduceOp::max, 1.0f);
        ++second_returned;
      }
    });
    FAIL("no exception");
  } catch (const mirror::timeout_error& e) {
    REQUIRE(e.missing() == std::vector<int>{1});
    REQUIRE_THAT(e.what(), Catch::Contains("100 ms") && Catch::Contains("{1} did not reach"));
  }
  REQUIRE(second_returned == 0);
  REQUIRE(s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); }).primary() == 2);
}

TEST_CASE("many strategies can live side by side", "[threads][pool]") {
  S a{{.replicas = 2}}, b{{.replicas = 3}};
  const auto x = a.run([&](auto& ctx) {
    // a different strategy may run from inside fn: only the same one cannot nest
    const auto inner = b.run([](auto& c) { return c.all_reduce(ReduceOp::sum, 1); });
    return ctx.all_reduce(ReduceOp::sum, inner.primary());
  });
  REQUIRE(x.primary() == 6);
}

TEST_CASE("the pool counts the cores of its affinity mask", "[threads][pool]") {
  // usable_cores() reads the calling thread's mask, which the pool's threads inherit: under
  // taskset or a cpuset, replicas that each seem to have a core would spin through each
  // other's time slices.
  cpu_set_t all;
  CPU_ZERO(&all);
  REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  REQUIRE(mirror::threads::usable_cores() == static_cast<unsigned>(CPU_COUNT(&all)));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  struct restore {
    cpu_set_t mask;
    ~restore() { sched_setaffinity(0, sizeof mask, &mask); }
  } restore_mask{all};
  CHECK(mirror::threads::usable_cores() == 1u);
  // Four replicas on one core: correct results through many barriers, parked, not spun.
  S s{{.replicas = 4}};
  for (int step = 0; step < 200; ++step) {
    const auto out = s.run([&](auto& ctx) {
      const double mine = ctx.replica_id_in_sync_group() + step;
      return ctx.all_reduce(ReduceOp::sum, mine);
    });
    for (double v : out) REQUIRE(v == 6.0 + 4.0 * step);
  }
  // And a limit set while the pool exists (as devices::Cluster does) changes nothing visible.
  s.runtime().limit_cores(64);
  const auto out = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::max, ctx.replica_id_in_sync_group()); });
  for (int v : out) REQUIRE(v == 3);
}

TEST_CASE("scratch of a one-off large collective is freed; a loop's is kept", "[threads][pool]") {
  // ReductionToOneDevice accumulates in the scratch of the replica it reduces to.
  mirror::Strategy<mirror::devices::Threads, mirror::ops::ReductionToOneDevice> s{{.replicas = 2}};
  const std::size_t n = 1u << 18;  // 1 MiB of floats
  const std::size_t held = n * sizeof(float);
  auto big = [&] {
    const auto out = s.run([&](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, std::vector<float>(n, 1.f)); });
    REQUIRE(out.primary() == std::vector<float>(n, 2.f));
  };
  auto none = [&] { s.run([](auto&) {}); };
  // A loop that reduces 1 MiB every other call keeps the buffer across every trim point: no
  // allocation after the first call.
  big();
  const auto allocations = s.runtime().scratch_allocations();
  for (int k = 0; k < 40; ++k) {
    big();
    none();
    REQUIRE(s.runtime().scratch_bytes() >= held);
  }
  CHECK(s.runtime().scratch_allocations() == allocations);
  // After a one-off, small collectives only: the 1 MiB goes within one trim period (16 calls).
  for (int k = 0; k < 40; ++k) {
    const auto out = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1.f); });
    REQUIRE(out.primary() == 2.f);
  }
  CHECK(s.runtime().scratch_bytes() < held / 4);
  // No collective at all: nothing is held.
  for (int k = 0; k < 40; ++k) none();
  CHECK(s.runtime().scratch_bytes() == 0);
  big();  // and it comes back when needed
  CHECK(s.runtime().scratch_bytes() >= held);
}
