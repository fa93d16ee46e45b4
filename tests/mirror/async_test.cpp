// SPDX-License-Identifier: Apache-2.0
// The rules of the non-blocking collectives and gradient buckets on one process
// (docs/guide.md#overlapping-communication): handles, errors, the bucket plan. Their results
// against the blocking forms are in the conformance suites, on every (device, ops) pair;
// devices::Cluster, where the cross-worker step overlaps, in tests/mpi/async_test.cpp.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <stdexcept>

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>

namespace {
using mirror::ReduceOp;
using Strategy = mirror::Strategy<mirror::devices::Threads>;

Strategy& strategy_with(int replicas) {
  static std::vector<std::unique_ptr<Strategy>> cache(9);
  auto& s = cache[static_cast<std::size_t>(replicas)];
  if (!s) s = std::make_unique<Strategy>(mirror::devices::Threads{.replicas = replicas, .timeout = std::chrono::seconds(5)});
  return *s;
}
}  // namespace

TEST_CASE("async: wait() gives the result once; a second wait is a mirror::error", "[async]") {
  auto& s = strategy_with(3);
  std::atomic<int> twice{0};
  const auto sums = s.run([&](auto& ctx) {
    auto p = ctx.all_reduce_async(ReduceOp::sum, ctx.replica_id_in_sync_group() + 1);
    const int v = *p.wait();
    try {
      (void)p.wait();
    } catch (const mirror::error& e) {
      if (std::string(e.what()).find("already taken") != std::string::npos) ++twice;
    }
    return v;
  });
  for (const int v : sums) REQUIRE(v == 6);
  REQUIRE(twice == 3);
}

TEST_CASE("async: a moved-from handle owns nothing; the moved-to one gives the result", "[async]") {
  auto& s = strategy_with(2);
  const auto sums = s.run([&](auto& ctx) {
    auto p = ctx.all_reduce_async(ReduceOp::sum, std::vector<int>{1, 2});
    mirror::Pending<mirror::Synced<std::vector<int>>> q = std::move(p);
    auto r = ctx.all_reduce_async(ReduceOp::max, std::vector<int>{5, 5});
    r = std::move(q);  // the max's handle is dropped: it completes here
    return (*r.wait())[1];
  });
  for (const int v : sums) REQUIRE(v == 4);
}

TEST_CASE("async: the blocking form's errors: a mismatch is a shape_error on every replica", "[async]") {
  for (const int R : {2, 3}) {
    auto& s = strategy_with(R);
    std::atomic<int> caught{0};
    REQUIRE_THROWS_AS(s.run([&](auto& ctx) {
                        try {
                          auto p = ctx.all_reduce_async(
                              ReduceOp::sum, std::vector<float>(ctx.replica_id_in_sync_group() == 1 ? 4 : 3, 1.0f));
                          p.wait();
                        } catch (const mirror::shape_error&) {
                          ++caught;
                          throw;
                        }
                      }),
                      mirror::shape_error);
    REQUIRE(caught == R);
    // The strategy goes on.
    const auto ok = s.run([](auto& ctx) { return ctx.all_reduce_async(ReduceOp::sum, 1).wait(); });
    REQUIRE(ok[0] == R);
  }
}

TEST_CASE("async: a replica that never starts the collective is a timeout_error naming it", "[async]") {
  mirror::Strategy<mirror::devices::Threads> s(mirror::devices::Threads{.replicas = 2, .timeout = std::chrono::milliseconds(200)});
  try {
    s.run([](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) return;
      ctx.all_reduce_async(ReduceOp::sum, 1.0f).wait();
    });
    FAIL("no error");
  } catch (const mirror::timeout_error& e) {
    REQUIRE(e.missing() == std::vector<int>{1});
  }
}

TEST_CASE("gradient buckets: the plan cuts reverse leaf order by bytes and by element type", "[async]") {
  auto& s = strategy_with(2);
  using Grads = std::tuple<std::vector<float>, std::vector<float>, std::vector<double>, std::vector<float>,
                           std::vector<float>>;
  struct plan {
    std::size_t cap;
    std::size_t buckets;
    std::vector<std::size_t> of;  // bucket of each leaf
  };
  // Bytes: 40, 1200, 56, 132, 0. Reverse order: leaf 4, 3 (floats), then a double, then floats.
  const std::vector<plan> plans{
      {0, 5, {4, 3, 2, 1, 0}},                  // one leaf each
      {100, 4, {3, 2, 1, 0, 0}},                // {4, 3}: 0 B + 132 B reach 100 B; {2}: a type change
      {1 << 20, 3, {2, 2, 1, 0, 0}},            // type changes cut: {4, 3}, {2}, {1, 0}
  };
  for (const plan& p : plans) {
    CAPTURE(p.cap);
    std::atomic<int> wrong{0};
    s.run([&](auto& ctx) {
      Grads g{std::vector<float>(10), std::vector<float>(300), std::vector<double>(7), std::vector<float>(33),
              std::vector<float>{}};
      auto b = ctx.gradient_buckets(ReduceOp::sum, g, p.cap);
      if (b.num_buckets() != p.buckets) ++wrong;
      for (std::size_t i = 0; i < 5; ++i) {
        if (b.bucket_of(i) != p.of[i]) ++wrong;
      }
      for (std::size_t i = 0; i < 5; ++i) b.ready(i);
      b.finish();
    });
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("sharded gradient buckets: leaves of 64 KiB or more are buckets of their own, smaller ones share",
          "[async]") {
  auto& s = strategy_with(2);
  // Bytes: 40, 64 KiB (16384 floats), 132, 64 KiB - 4, 4. Reverse: {4, 3, 2} (all under 64 KiB,
  // together under the cap), then leaf 1 alone (64 KiB), then {0}.
  using Grads = std::tuple<std::vector<float>, std::vector<float>, std::vector<float>, std::vector<float>,
                           std::vector<float>>;
  std::atomic<int> wrong{0};
  s.run([&](auto& ctx) {
    Grads g{std::vector<float>(10), std::vector<float>(16384), std::vector<float>(33), std::vector<float>(16383),
            std::vector<float>(1)};
    auto b = ctx.gradient_buckets(ReduceOp::sum, g, std::size_t{1} << 20, mirror::sharded);
    const std::vector<std::size_t> want{2, 1, 0, 0, 0};
    if (b.num_buckets() != 3) ++wrong;
    for (std::size_t i = 0; i < 5; ++i) {
      if (b.bucket_of(i) != want[i]) ++wrong;
    }
    for (std::size_t i = 0; i < 5; ++i) b.ready(i);
    b.finish();
  });
  REQUIRE(wrong == 0);
}

TEST_CASE("gradient buckets: a loop's steps reuse the plan, and new leaf sizes or addresses get a new one",
          "[async]") {
  auto& s = strategy_with(2);
  using Grads = std::array<std::span<float>, 3>;
  // Three steps over layers cut from one flat buffer per replica (adjacent: reduced in place;
  // the plan is kept), then the same sizes in separate buffers (not adjacent any more: a plan
  // that ignored addresses would reduce leaf 1 and past its end instead of packing leaves 2 and
  // 1), then other sizes. 100-byte buckets; reverse order: sizes {10, 30, 5}: {2, 1}, {0};
  // sizes {30, 2, 2}: {2, 1, 0}.
  std::array<std::vector<float>, 2> flat{std::vector<float>(45), std::vector<float>(45)};
  struct step {
    bool flat;
    std::array<std::size_t, 3> sizes;
    std::array<std::size_t, 3> of;
  };
  const std::vector<step> steps{{true, {10, 30, 5}, {1, 0, 0}}, {true, {10, 30, 5}, {1, 0, 0}},
                                {true, {10, 30, 5}, {1, 0, 0}}, {false, {10, 30, 5}, {1, 0, 0}},
                                {false, {30, 2, 2}, {0, 0, 0}}};
  for (std::size_t t = 0; t < steps.size(); ++t) {
    CAPTURE(t);
    std::atomic<int> wrong{0};
    s.run([&](auto& ctx) {
      const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
      const auto& z = steps[t].sizes;
      std::array<std::vector<float>, 3> own{std::vector<float>(z[0]), std::vector<float>(z[1]), std::vector<float>(z[2])};
      Grads g = steps[t].flat ? Grads{std::span<float>(flat[r].data(), z[0]), std::span<float>(flat[r].data() + z[0], z[1]),
                                      std::span<float>(flat[r].data() + z[0] + z[1], z[2])}
                              : Grads{std::span<float>(own[0]), std::span<float>(own[1]), std::span<float>(own[2])};
      std::fill(flat[r].begin(), flat[r].end(), 1.0f);
      for (auto& v : own) std::fill(v.begin(), v.end(), 1.0f);
      auto b = ctx.gradient_buckets(ReduceOp::sum, g, 100);
      for (std::size_t i = 0; i < 3; ++i) {
        if (b.bucket_of(i) != steps[t].of[i]) ++wrong;
      }
      for (std::size_t i = 3; i-- > 0;) b.ready(i);
      b.finish();
      for (const auto& leaf : g) {
        for (const float x : leaf) {
          if (x != 2.0f) ++wrong;
        }
      }
    });
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("gradient buckets: misuse is a mirror::error naming the call", "[async]") {
  auto& s = strategy_with(2);
  std::atomic<int> errors{0};
  s.run([&](auto& ctx) {
    std::tuple<std::vector<float>, std::vector<float>> g{std::vector<float>(4, 1.0f), std::vector<float>(4, 1.0f)};
    auto b = ctx.gradient_buckets(ReduceOp::sum, g, 0);
    const auto expect = [&](auto&& call, const char* says) {
      try {
        call();
      } catch (const mirror::error& e) {
        const std::string what = e.what();
        if (what.find(says) != std::string::npos && what.find("async_test.cpp") != std::string::npos) ++errors;
      }
    };
    expect([&] { b.ready(2); }, "the nest has 2 leaves");
    b.ready(1);
    expect([&] { b.ready(1); }, "already made ready");
    b.finish();  // starts leaf 0's bucket, never made ready
    expect([&] { b.finish(); }, "called twice");
    expect([&] { b.ready(0); }, "finish() was already called");
    if (std::get<0>(g)[3] != 2.0f || std::get<1>(g)[0] != 2.0f) errors += 100;
  });
  REQUIRE(errors == 2 * 4);
}

TEST_CASE("gradient buckets: leaves of other sizes on one replica are a shape_error on every replica", "[async]") {
  auto& s = strategy_with(3);
  REQUIRE_THROWS_AS(s.run([](auto& ctx) {
                      std::tuple<std::vector<float>, std::vector<float>> g{
                          std::vector<float>(4), std::vector<float>(ctx.replica_id_in_sync_group() == 2 ? 5 : 4)};
                      auto b = ctx.gradient_buckets(ReduceOp::sum, g, 0);
                      b.ready(1);
                      b.ready(0);
                      b.finish();
                    }),
                    mirror::shape_error);
  // The error names the user's leaves, their types and sizes, and the bucket, not only the span
  // the bucket packed them into: one replica's leaf 1 has 11 elements, the other's 10.
  for (const std::size_t cap : {std::size_t{0}, std::size_t{1} << 20}) {
    CAPTURE(cap);
    std::vector<std::string> seen(3);
    REQUIRE_THROWS_AS(s.run([&](auto& ctx) {
                        const int g = ctx.replica_id_in_sync_group();
                        std::tuple<std::vector<float>, std::vector<float>> grads{std::vector<float>(150),
                                                                                  std::vector<float>(g == 1 ? 11 : 10)};
                        auto b = ctx.gradient_buckets(ReduceOp::sum, grads, cap);
                        try {
                          b.ready(1);
                          b.ready(0);
                          b.finish();
                        } catch (const mirror::shape_error& e) {
                          seen[static_cast<std::size_t>(g)] = e.what();
                          throw;
                        }
                      }),
                      mirror::shape_error);
    CAPTURE(seen);
    for (int g = 0; g < 3; ++g) {
      const std::string& what = seen[static_cast<std::size_t>(g)];
      CHECK_THAT(what, Catch::Contains("mirror::GradientBuckets at ") && Catch::Contains("async_test.cpp"));
      CHECK_THAT(what, Catch::Contains("on replica " + std::to_string(g)));
      CHECK_THAT(what, Catch::Contains("leaf 1 (std::vector<float") &&
                           Catch::Contains(g == 1 ? ") 11 elements" : ") 10 elements"));
      CHECK_THAT(what, Catch::Contains(cap == 0 ? "bucket 0, which reduces leaves 1..1" : "bucket 0, which reduces leaves 0..1"));
    }
  }
}

TEST_CASE("gradient buckets: finish() of spans returns them as Synced, for a variable's update", "[async]") {
  auto& s = strategy_with(2);
  auto v = s.make_variable(std::vector<float>(3, 0.0f));
  std::vector<std::vector<float>> grads(2, std::vector<float>(3, 1.0f));
  s.run([&](auto& ctx, auto& var) {
    std::tuple<std::span<float>> g{std::span<float>(grads[static_cast<std::size_t>(ctx.replica_id_in_sync_group())])};
    auto b = ctx.gradient_buckets(ReduceOp::sum, g, 0);
    b.ready(0);
    const mirror::Synced<std::tuple<std::span<float>>> reduced = b.finish();
    var.update([](std::vector<float>& w, const std::tuple<std::span<float>>& d) { w[0] += std::get<0>(d)[0]; }, reduced);
  }, v);
  REQUIRE(v.value()[0] == 2.0f);
}

TEST_CASE("gradient buckets: layers cut from one flat buffer are reduced in place, adjacent ones together",
          "[async]") {
  auto& s = strategy_with(3);
  // Leaves 0-2 adjacent in one buffer; leaf 3 elsewhere (a bucket of {2, 3} must pack).
  using Grads = std::array<std::span<float>, 4>;
  for (const std::size_t cap : {std::size_t{0}, std::size_t{64}, std::size_t{1} << 20}) {
    CAPTURE(cap);
    std::atomic<int> wrong{0};
    s.run([&](auto& ctx) {
      const float g = static_cast<float>(ctx.replica_id_in_sync_group());
      std::vector<float> flat(30), apart(7);
      for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = g * 0.37f + static_cast<float>(i) * 0.011f;
      for (std::size_t i = 0; i < apart.size(); ++i) apart[i] = g * 1.3f - static_cast<float>(i);
      const std::vector<float> flat_in = flat, apart_in = apart;
      Grads grads{std::span<float>(flat.data(), 10), std::span<float>(flat.data() + 10, 5),
                  std::span<float>(flat.data() + 15, 15), std::span<float>(apart)};
      auto b = ctx.gradient_buckets(ReduceOp::mean, grads, cap);
      for (std::size_t i = 4; i-- > 0;) b.ready(i);
      b.finish();
      const auto want_flat = ctx.all_reduce(ReduceOp::mean, flat_in);
      const auto want_apart = ctx.all_reduce(ReduceOp::mean, apart_in);
      if (flat != *want_flat || apart != *want_apart) ++wrong;
    });
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("gradient buckets: a leaf given a new buffer of its size before its bucket starts is read there",
          "[async]") {
  // The natural backward pass: `std::get<1>(g) = layer.backward();` after gradient_buckets(),
  // which frees the vector's buffer the plan recorded. Reading that one was a use-after-free.
  auto& s = strategy_with(2);
  for (const std::size_t cap : {std::size_t{0}, std::size_t{1} << 20}) {  // a bucket per leaf, one packed
    CAPTURE(cap);
    const auto got = s.run([&](auto& ctx) {
      const float g = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
      std::tuple<std::vector<float>, std::vector<float>> grads{std::vector<float>(5, 0.f), std::vector<float>(300, 0.f)};
      auto buckets = ctx.gradient_buckets(ReduceOp::sum, grads, cap);
      std::get<1>(grads) = std::vector<float>(300, g);  // a new buffer
      buckets.ready(1);
      std::get<0>(grads) = std::vector<float>(5, 2 * g);
      buckets.ready(0);
      buckets.finish();
      return grads;
    });
    for (const auto& a : std::get<0>(got)) CHECK(a == std::vector<float>(5, 2 * (1 + 2)));
    for (const auto& b : std::get<1>(got)) CHECK(b == std::vector<float>(300, 1 + 2));
  }
}

TEST_CASE("gradient buckets: a leaf resized, or moved out of an in-place run, is a mirror::error naming it",
          "[async]") {
  auto& s = strategy_with(2);
  std::string what;
  try {
    s.run([&](auto& ctx) {
      std::tuple<std::vector<float>, std::vector<float>> grads{std::vector<float>(10, 1.f), std::vector<float>(10, 1.f)};
      auto buckets = ctx.gradient_buckets(ReduceOp::sum, grads, 0);
      buckets.ready(1);
      std::get<0>(grads) = std::vector<float>(11, 1.f);  // backward's output of another size
      buckets.ready(0);
      buckets.finish();
    });
    FAIL("no error");
  } catch (const mirror::error& e) {
    what = e.what();
  }
  CAPTURE(what);
  CHECK_THAT(what, Catch::Contains("leaf 0 of grads"));
  CHECK_THAT(what, Catch::Contains("has 11 elements now, 10 then"));
  CHECK_THAT(what, Catch::Contains("async_test.cpp"));
  CHECK_THAT(what, Catch::Contains("assign into the leaf's existing buffer"));
  // Spans cut from one flat buffer share an in-place bucket: one pointed elsewhere cannot join it.
  std::vector<std::vector<float>> other(2, std::vector<float>(4, 1.f));
  try {
    s.run([&](auto& ctx) {
      std::vector<float> flat(8, 1.f);
      std::array<std::span<float>, 2> grads{std::span<float>(flat.data(), 4), std::span<float>(flat.data() + 4, 4)};
      auto buckets = ctx.gradient_buckets(ReduceOp::sum, grads, 1 << 20);
      grads[0] = std::span<float>(other[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
      buckets.ready(1);
      buckets.ready(0);
      buckets.finish();
    });
    FAIL("no error");
  } catch (const mirror::error& e) {
    what = e.what();
  }
  CHECK_THAT(what, Catch::Contains("moved out of the run of adjacent leaves"));
  // A run of spans re-cut from another flat buffer, still adjacent: read there.
  const auto sums = s.run([](auto& ctx) {
    const float g = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
    std::vector<float> flat(8, 0.f), other(8, g);
    std::array<std::span<float>, 2> grads{std::span<float>(flat.data(), 3), std::span<float>(flat.data() + 3, 5)};
    auto buckets = ctx.gradient_buckets(ReduceOp::sum, grads, 1 << 20);
    grads = {std::span<float>(other.data(), 3), std::span<float>(other.data() + 3, 5)};
    buckets.ready(1);
    buckets.ready(0);
    buckets.finish();
    return other;
  });
  for (const auto& v : sums) CHECK(v == std::vector<float>(8, 1 + 2));
  // Caught in fn, and finish() anyway: the bucket that never started is neither waited for nor
  // copied back (its leaf's old buffer is freed, and the packed staging is stale).
  for (const std::size_t cap : {std::size_t{0}, std::size_t{1} << 20}) {
    std::atomic<int> refused{0};
    s.run([&](auto& ctx) {
      std::tuple<std::vector<float>, std::vector<float>> grads{std::vector<float>(10, 1.f), std::vector<float>(10, 1.f)};
      auto buckets = ctx.gradient_buckets(ReduceOp::sum, grads, cap);
      std::get<0>(grads) = std::vector<float>(12, 1.f);
      buckets.ready(1);
      try {
        buckets.ready(0);
      } catch (const mirror::error&) {
        ++refused;
      }
      try {
        buckets.finish();
      } catch (const mirror::error&) {
        ++refused;
      }
      if (std::get<0>(grads) != std::vector<float>(12, 1.f)) refused += 100;
    });
    CHECK(refused == 2 * 2);  // ready(0) and finish(), on both replicas
  }
  // Nothing was reduced, and the strategy goes on.
  for (const auto& v : other) CHECK(v == std::vector<float>(4, 1.f));
  CHECK(s.reduce(ReduceOp::sum, s.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); })) == 1);
}

TEST_CASE("gradient buckets: dropped without finish() is an error from run on every replica", "[async]") {
  auto& s = strategy_with(2);
  for (const bool all_ready : {false, true}) {
    CAPTURE(all_ready);
    std::atomic<int> seen{0};
    std::string what;
    try {
      s.run([&](auto& ctx) {
        std::tuple<std::vector<float>, std::vector<float>> grads{std::vector<float>(3, 1.f), std::vector<float>(3, 1.f)};
        {
          auto buckets = ctx.gradient_buckets(ReduceOp::sum, grads, 0);
          buckets.ready(1);
          if (all_ready) buckets.ready(0);
        }  // no finish()
        ++seen;
      });
      FAIL("no error");
    } catch (const mirror::error& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK(seen == 2);  // fn went on; the error came when it returned
    CHECK_THAT(what, Catch::Contains("destroyed without finish()"));
    if (!all_ready) CHECK_THAT(what, Catch::Contains("leaves {0} (1 of 2) were never made ready"));
  }
  // Dropped by an exception leaving fn: that exception is the error, not the drop.
  CHECK_THROWS_WITH(s.run([](auto& ctx) {
                      std::vector<float> g(3, 1.f);
                      auto buckets = ctx.gradient_buckets(ReduceOp::sum, g, 0);
                      throw std::runtime_error("backward failed");
                    }),
                    Catch::Contains("backward failed"));
}
