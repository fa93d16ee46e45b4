// SPDX-License-Identifier: Apache-2.0
// Call sites in errors (docs/errors.md#call-sites): every error a collective raises names each
// replica's call as FILE:LINE (both calls of a mismatch, where each arrived replica waits in a
// timeout, the last call of each one that never arrived), the same error on every replica, under
// every ops policy. The lines are this file's own, taken with __LINE__ next to each call.

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <mirror/mirror.hpp>

using mirror::ReduceOp;
using namespace std::chrono_literals;

namespace {

// What one replica caught inside fn.
struct caught {
  std::string type;  // "none" when its body returned normally
  std::string what;
};

// Runs body(ctx, replica) on every replica and keeps what each one caught.
template <class S, class Body>
std::vector<caught> errors_inside(S& s, Body&& body) {
  std::vector<caught> out(static_cast<std::size_t>(s.num_replicas_in_sync()), caught{"none", ""});
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    caught& mine = out[static_cast<std::size_t>(r)];
    try {
      body(ctx, r);
    } catch (const mirror::timeout_error& e) {
      mine = {"timeout_error", e.what()};
    } catch (const mirror::shape_error& e) {
      mine = {"shape_error", e.what()};
    } catch (const mirror::aggregation_error& e) {
      mine = {"aggregation_error", e.what()};
    } catch (const mirror::error& e) {
      mine = {"error", e.what()};
    }
  });
  return out;
}

// FILE:LINE as the messages give it: this file's name as the compiler was given it (__FILE__,
// which std::source_location::file_name() also gives).
std::string site(unsigned line) { return std::string(__FILE__) + ":" + std::to_string(line); }

// Every replica in `who` caught the same error of type `type`; returns its text.
std::string same_error(const std::vector<caught>& all, const std::string& type, std::vector<int> who = {}) {
  if (who.empty()) {
    for (std::size_t r = 0; r < all.size(); ++r) who.push_back(static_cast<int>(r));
  }
  const caught& first = all[static_cast<std::size_t>(who.front())];
  for (const int r : who) {
    CAPTURE(r);
    REQUIRE(all[static_cast<std::size_t>(r)].type == type);
    REQUIRE(all[static_cast<std::size_t>(r)].what == first.what);
  }
  return first.what;
}

}  // namespace

TEMPLATE_TEST_CASE("a mismatch names both calls' sites, on every replica, under every ops policy", "[call_sites]",
                   mirror::ops::ChunkOwnerAllReduce, mirror::ops::ReductionToOneDevice,
                   mirror::ops::HierarchicalCopy) {
  mirror::Strategy<mirror::devices::Threads, TestType> s{{.replicas = 3}};

  SECTION("two different collectives") {
    std::atomic<unsigned> reduce_line{0}, broadcast_line{0};
    const auto all = errors_inside(s, [&](auto& ctx, int r) {
      if (r != 2) {
        reduce_line = __LINE__ + 1;
        (void)ctx.all_reduce(ReduceOp::sum, 1.0f);
      } else {
        broadcast_line = __LINE__ + 1;
        (void)ctx.broadcast(1.0f, 0);
      }
    });
    const std::string text = same_error(all, "shape_error");
    CHECK_THAT(text, Catch::Contains("replica 0 called all_reduce(sum) at ") && Catch::Contains(site(reduce_line)));
    CHECK_THAT(text, Catch::Contains("replica 2 called broadcast(from = 0) at ") &&
                         Catch::Contains(site(broadcast_line)));
  }

  SECTION("different nests") {
    std::atomic<unsigned> float_line{0}, double_line{0};
    const auto all = errors_inside(s, [&](auto& ctx, int r) {
      if (r == 0) {
        float_line = __LINE__ + 1;
        (void)ctx.all_reduce(ReduceOp::sum, 1.0f);
      } else {
        double_line = __LINE__ + 1;
        (void)ctx.all_reduce(ReduceOp::sum, 1.0);
      }
    });
    const std::string text = same_error(all, "shape_error");
    CHECK_THAT(text, Catch::Contains("mismatched nests") && Catch::Contains("passed double at " + site(double_line)) &&
                         Catch::Contains("passed float at " + site(float_line)));
  }

  SECTION("different sizes, the second collective of fn") {
    std::atomic<unsigned> first_line{0}, short_line{0}, long_line{0};
    const auto all = errors_inside(s, [&](auto& ctx, int r) {
      first_line = __LINE__ + 1;
      (void)ctx.all_reduce(ReduceOp::max, r);
      std::vector<float> x(r == 1 ? 7 : 8, 1.0f);
      if (r == 1) {
        short_line = __LINE__ + 1;
        (void)ctx.all_reduce(ReduceOp::sum, std::span<float>(x));
      } else {
        long_line = __LINE__ + 1;
        (void)ctx.all_reduce(ReduceOp::sum, std::span<float>(x));
      }
    });
    const std::string text = same_error(all, "shape_error");
    CHECK_THAT(text, Catch::Contains("collective #2 (all_reduce(sum))") &&
                         Catch::Contains("7 elements on replica 1 (at " + site(short_line) + ")") &&
                         Catch::Contains("8 on replica 0 (at " + site(long_line) + ")"));
    // (The flight recorder's table after the message does list the first call.)
    CHECK_THAT(text.substr(0, text.find('\n')), !Catch::Contains(site(first_line)));
  }

  SECTION("reduce_scatter lengths, and an all_gather against a merge_call") {
    std::atomic<unsigned> scatter_line{0};
    auto all = errors_inside(s, [&](auto& ctx, int r) {
      std::vector<int> x(r == 2 ? 5 : 6, 1);
      scatter_line = __LINE__ + 1;
      (void)ctx.reduce_scatter(ReduceOp::sum, x);
    });
    std::string text = same_error(all, "shape_error");
    CHECK_THAT(text, Catch::Contains("reduce_scatter(sum)") && Catch::Contains("(at " + site(scatter_line) + ")"));

    std::atomic<unsigned> gather_line{0}, merge_line{0};
    all = errors_inside(s, [&](auto& ctx, int r) {
      if (r == 1) {
        merge_line = __LINE__ + 1;
        (void)ctx.merge_call([](auto&, const auto&) { return 0; }, r);
      } else {
        gather_line = __LINE__ + 1;
        (void)ctx.all_gather(std::vector<int>{r}, mirror::axis0);
      }
    });
    text = same_error(all, "shape_error");
    CHECK_THAT(text, Catch::Contains("called all_gather at " + site(gather_line)) &&
                         Catch::Contains("called merge_call at " + site(merge_line)));
  }

  SECTION("the strategy works after each") {
    const auto out = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
    for (const int v : out) REQUIRE(v == 3);
  }
}

TEST_CASE("a timeout names where each replica waits and the last call of each that never came", "[call_sites]") {
  mirror::Strategy<mirror::devices::Threads> s{{.replicas = 3, .timeout = 300ms}};

  SECTION("a replica that returned from fn") {
    std::atomic<unsigned> first_line{0}, second_line{0};
    const auto all = errors_inside(s, [&](auto& ctx, int r) {
      first_line = __LINE__ + 1;
      (void)ctx.all_reduce(ReduceOp::sum, r);
      if (r == 2) return;
      second_line = __LINE__ + 1;
      (void)ctx.broadcast(r, 1);
    });
    CHECK(all[2].type == "none");
    const std::string text = same_error(all, "timeout_error", {0, 1});
    CHECK_THAT(text, Catch::Contains("replicas {2} returned from fn without reaching"));
    // The replica that found replica 2 gone leads; the other may wait beside it or not have
    // arrived yet (then its last call is #1).
    CHECK_THAT(text, Catch::Contains(" waits in collective #2 (broadcast(from = 1)) at " + site(second_line)));
    CHECK_THAT(text, Catch::Contains("replica 2's last call was collective #1 (all_reduce(sum)) at " +
                                     site(first_line)));
  }

  SECTION("a replica too slow for the timeout, and one that made no call") {
    std::atomic<unsigned> first_line{0}, second_line{0};
    const auto all = errors_inside(s, [&](auto& ctx, int r) {
      if (r == 0) {
        std::this_thread::sleep_for(1500ms);  // five timeouts
      } else {
        first_line = __LINE__ + 1;
        (void)ctx.all_reduce(ReduceOp::min, r);
      }
    });
    const std::string text = same_error(all, "timeout_error", {1, 2});
    CHECK(all[0].type == "none");  // it never called a collective
    CHECK_THAT(text, Catch::Contains("replicas {0} did not reach it"));
    CHECK_THAT(text, Catch::Contains("replica 0 made no collective call in this run"));
    // The replica that timed out first leads ("waited in"), the other is listed ("waits in").
    CHECK_THAT(text, Catch::Contains("replica 1 wait") && Catch::Contains("replica 2 wait") &&
                         Catch::Contains("in collective #1 (all_reduce(min)) at " + site(first_line)));
    (void)second_line;
  }

  SECTION("the strategy works after each") {
    const auto out = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 1); });
    for (const int v : out) REQUIRE(v == 3);
  }
}

TEST_CASE("variable updates in replica context name their call site", "[call_sites][variables]") {
  mirror::Strategy<mirror::devices::Threads> s{{.replicas = 2}};

  SECTION("assign with no aggregation") {
    auto v = s.make_variable(std::vector<float>(4, 0.0f));
    std::atomic<unsigned> line{0};
    std::vector<std::string> texts(2);
    s.run([&](auto& ctx, auto& var) {
      try {
        line = __LINE__ + 1;
        var.assign(std::vector<float>(4, 1.0f));
      } catch (const mirror::aggregation_error& e) {
        texts[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = e.what();
      }
    }, v);
    for (const auto& t : texts) CHECK_THAT(t, Catch::Contains("assign at " + site(line)));
  }

  SECTION("update_sharded with a gradient of the wrong length") {
    auto v = s.make_variable(std::vector<float>(6, 0.0f), mirror::VariableAggregation::sum);
    std::atomic<unsigned> line{0};
    std::vector<std::string> texts(2);
    s.run([&](auto& ctx, auto& var) {
      std::vector<float> g(5, 1.0f);
      try {
        line = __LINE__ + 1;
        var.update_sharded([](std::span<float>, std::span<const float>) {}, ReduceOp::sum, std::span<float>(g));
      } catch (const mirror::shape_error& e) {
        texts[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = e.what();
      }
    }, v);
    for (const auto& t : texts) CHECK_THAT(t, Catch::Contains("update_sharded at " + site(line)));
  }
}

TEST_CASE("merge_call captures its call site with up to four arguments", "[call_sites]") {
  mirror::Strategy<mirror::devices::Threads> s{{.replicas = 2}};
  // Each arity against an all_reduce on replica 1: the mismatch message names the merge_call's line.
  const auto named = [&](auto call) {
    unsigned line = 0;  // written by replica 0 only, read after the run
    const auto all = errors_inside(s, [&](auto& ctx, int r) {
      if (r == 0) {
        call(ctx, line);
      } else {
        (void)ctx.all_reduce(ReduceOp::sum, 1);
      }
    });
    return std::pair{same_error(all, "shape_error"), line};
  };
  const auto f = [](auto&, const auto&...) { return 1; };
  {
    const auto [text, line] = named([&](auto& ctx, unsigned& l) { l = __LINE__; (void)ctx.merge_call(f); });
    CHECK_THAT(text, Catch::Contains("called merge_call at " + site(line)));
  }
  {
    const auto [text, line] = named([&](auto& ctx, unsigned& l) { l = __LINE__; (void)ctx.merge_call(f, 1, 2.0, 'c', 4u); });
    CHECK_THAT(text, Catch::Contains("called merge_call at " + site(line)));
  }
  {
    const auto [text, line] = named([&](auto& ctx, unsigned& l) { l = __LINE__; (void)ctx.merge_call(f, 1, 2, 3, 4, 5); });
    CHECK_THAT(text, Catch::Contains("called merge_call at an unknown call site"));
    (void)line;
  }
  // And every arity still computes: the sum of each replica's arguments.
  const auto sums = s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    return ctx.merge_call(
        [](auto& strategy, const auto& a, const auto& b, const auto& c) {
          return strategy.reduce(ReduceOp::sum, a) + strategy.reduce(ReduceOp::sum, b) + strategy.reduce(ReduceOp::sum, c);
        },
        r, 10 * r, 100 * r);
  });
  for (const int v : sums) CHECK(v == 111);
}
