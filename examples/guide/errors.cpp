// SPDX-License-Identifier: Apache-2.0
// docs/errors.md: each error kind raised for real, caught as its type, its message printed.
// The snippets between the // [name] markers are copied into the page (tools/check_docs.py
// keeps the two equal). Exits 1 when an error is not the documented one.
#include <mirror/mirror.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mirror/source_location.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

static int failures = 0;
static void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

// [call_site_helper]
// A helper that makes a collective for its caller passes the caller's call site on.
template <class Ctx>
float global_norm(Ctx& ctx, std::span<const float> g,
                  mirror::source_location where = mirror::source_location::current()) {
  float local = 0;
  for (float x : g) local += x * x;
  return std::sqrt(*ctx.all_reduce(mirror::ReduceOp::sum, local, where));
}
// [/call_site_helper]

int main() {
  // [strategy]
  using namespace std::chrono_literals;
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2, .timeout = 2s}};
  // [/strategy]

  // [shape_error]
  try {
    strategy.run([](auto& ctx) {     // replica 1 passes one element more
      std::vector<float> v(3 + static_cast<std::size_t>(ctx.replica_id_in_sync_group()), 1.0f);
      return ctx.all_reduce(mirror::ReduceOp::sum, v);
    });
  } catch (const mirror::shape_error& e) {
    std::printf("shape_error: %s\n", e.what());
  }
  // [/shape_error]

  // [replica_error]
  try {
    strategy.run([](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) throw std::runtime_error("out of data");
      return ctx.all_reduce(mirror::ReduceOp::sum, 1.0f);    // cancelled on replica 0
    });
  } catch (const mirror::replica_error& e) {
    std::printf("replica_error from replica %d: %s\n", e.replica(), e.what());
    try {
      e.rethrow_nested();                                     // the original exception
    } catch (const std::runtime_error& original) {
      std::printf("  original: %s\n", original.what());
    }
  }
  // [/replica_error]

  // [catch_all]
  bool rethrown = false;
  try {
    strategy.run([&](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) throw std::runtime_error("out of data");
      try {
        ctx.all_reduce(mirror::ReduceOp::sum, 1.0f);          // cancelled: replica 1 failed
      } catch (const std::exception& e) {
        std::printf("replica 0 caught: %s\n", e.what());      // your errors and mirror's
        throw;
      } catch (...) {
        rethrown = true;                                      // mirror's cancellation, or another
        throw;                                                // type you do not know: rethrow it
      }
    });
  } catch (const mirror::replica_error& e) {
    std::printf("run reports replica %d: %s\n", e.replica(), e.what());
  }
  // [/catch_all]
  check(rethrown, "a cancelled collective throws what only catch (...) sees");

  // [timeout_error]
  try {
    strategy.run([](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 0) ctx.all_reduce(mirror::ReduceOp::sum, 1.0f);
    });                                                       // replica 1 never calls it
  } catch (const mirror::timeout_error& e) {
    std::printf("timeout_error, missing replica %d: %s\n", e.missing().at(0), e.what());
  }
  // [/timeout_error]

  // [call_sites]
  const unsigned norm_line = __LINE__ + 4;
  try {
    strategy.run([](auto& ctx) {
      const std::vector<float> g(4, 1.0f);
      if (ctx.replica_id_in_sync_group() == 0) return global_norm(ctx, g);
      return *ctx.all_reduce(mirror::ReduceOp::max, 1.0f);
    });
  } catch (const mirror::shape_error& e) {
    std::printf("shape_error: %s\n", e.what());
    const std::string site = std::string(__FILE__) + ":" + std::to_string(norm_line);
    check(std::strstr(e.what(), (site + " but").c_str()) != nullptr, "the helper's caller is named");
  }
  // [/call_sites]

  // [aggregation_error]
  auto v = strategy.make_variable(0.0f);                      // aggregation none
  try {
    strategy.run([](auto&, auto& var) { var.assign_add(1.0f); }, v);
  } catch (const mirror::aggregation_error& e) {
    std::printf("aggregation_error: %s\n", e.what());
  }
  // [/aggregation_error]
  check(v.value() == 0.0f && v[1] == 0.0f, "a rejected update changes no copy");

  // [invalid_argument]
  try {
    mirror::Strategy<mirror::devices::Threads, mirror::ops::ReductionToOneDevice> bad{
        {.replicas = 2}, {.reduce_to = 5}};
  } catch (const std::invalid_argument& e) {
    std::printf("invalid_argument: %s\n", e.what());
  }
  // [/invalid_argument]

  // The strategy is still usable after every one of them.
  auto sum = strategy.run([](auto& ctx) { return ctx.all_reduce(mirror::ReduceOp::sum, 2); });
  check(sum.primary() == 4, "usable after errors");

  // Each catch above must have run: count them by catching again, by base class.
  int caught = 0;
  for (int kind = 0; kind < 3; ++kind) {
    try {
      strategy.run([kind](auto& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        if (kind == 0) return ctx.all_reduce(mirror::ReduceOp::sum, std::vector<int>(1 + r)).get().size();
        if (kind == 1 && r == 1) throw 42;
        if (kind == 2 && r == 1) return std::size_t{0};
        return ctx.all_reduce(mirror::ReduceOp::sum, std::vector<int>(1)).get().size();
      });
    } catch (const mirror::error& e) {                        // every mirror error derives from it
      caught += (kind == 0 && dynamic_cast<const mirror::shape_error*>(&e)) ||
                (kind == 1 && dynamic_cast<const mirror::replica_error*>(&e)) ||
                (kind == 2 && dynamic_cast<const mirror::timeout_error*>(&e));
    }
  }
  check(caught == 3, "each error kind is raised as documented");

  std::printf("errors: %s\n", failures == 0 ? "every error as documented" : "WRONG ERRORS");
  return failures == 0 ? 0 : 1;
}
