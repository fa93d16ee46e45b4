// SPDX-License-Identifier: Apache-2.0
// mirror/checkpoint.hpp in one process: save writes one file atomically, restore brings the
// values back (TF values_test testSaveAndRestoreOnRead: a SUM variable read 7 restores to 7).

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <stdlib.h>  // mkdtemp
#include <mirror/mirror.hpp>

using mirror::VariableAggregation;
using S = mirror::Strategy<mirror::devices::Threads>;

namespace {
std::filesystem::path temp_dir() {
  char tmpl[] = "/tmp/mirror_checkpoint_test_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}
}  // namespace

TEST_CASE("save then restore gives back every variable; sync-on-read sums restore to their read", "[checkpoint]") {
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  auto w = s.make_variable(std::vector<float>{1.f, 2.f}, VariableAggregation::sum);
  auto sum = s.make_sync_on_read_variable(0.0, VariableAggregation::sum);
  s.run([](auto& ctx, auto& a) { a.assign(ctx.replica_id_in_sync_group() == 0 ? 4.0 : 3.0); }, sum);
  REQUIRE(sum.value() == 7.0);
  mirror::save(s, path, w, sum);
  CHECK(std::filesystem::exists(path));
  CHECK(!std::filesystem::exists(path.string() + ".tmp"));
  w.assign(std::vector<float>{0.f, 0.f});
  sum.assign(0.0);
  mirror::restore(s, path, w, sum);
  for (const auto& c : S::local_results(w)) CHECK(c == std::vector<float>{1.f, 2.f});
  CHECK(sum.value() == 7.0);
  // TF's rule for an ON_READ SUM restore: each copy holds value / N.
  for (const double c : S::local_results(sum)) CHECK(c == 3.5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("save and restore report what went wrong and change nothing", "[checkpoint]") {
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  auto w = s.make_variable(std::vector<float>{1.f, 2.f}, VariableAggregation::sum);
  CHECK_THROWS_AS(mirror::save(s, dir / "missing" / "ckpt", w), mirror::backend_error);
  CHECK_THROWS_AS(mirror::restore(s, dir / "nothing_here", w), mirror::backend_error);
  {
    std::ofstream junk(dir / "junk");
    junk << "not a checkpoint";
  }
  CHECK_THROWS_AS(mirror::restore(s, dir / "junk", w), mirror::shape_error);
  mirror::save(s, dir / "ckpt", w);
  auto three = s.make_variable(std::vector<float>{0.f, 0.f, 0.f}, VariableAggregation::sum);
  try {
    mirror::restore(s, dir / "ckpt", three);
    FAIL("no shape_error");
  } catch (const mirror::shape_error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("the checkpoint holds 2 elements, the variable 3"));
  }
  CHECK(three.value() == std::vector<float>{0.f, 0.f, 0.f});
  auto ints = s.make_variable(std::vector<std::int32_t>{0, 0}, VariableAggregation::sum);
  CHECK_THROWS_AS(mirror::restore(s, dir / "ckpt", ints), mirror::shape_error);  // saved float
  std::filesystem::remove_all(dir);
}

TEST_CASE("restore rejects a checkpoint with more data than the variables take", "[checkpoint][errors]") {
  // Issue 33: a tuple of two 5-float vectors restored into one 5-float vector succeeded and took
  // the first leaf. A checkpoint must match the variables exactly.
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  using Pair = std::tuple<std::vector<float>, std::vector<float>>;
  auto pair = s.make_variable(Pair{std::vector<float>(5, 1.5f), std::vector<float>(5, 2.5f)}, VariableAggregation::sum);
  mirror::save(s, path, pair);
  auto one = s.make_variable(std::vector<float>(5, 0.0f), VariableAggregation::sum);
  REQUIRE_THROWS_AS(mirror::restore(s, path, one), mirror::shape_error);
  REQUIRE_THROWS_WITH(mirror::restore(s, path, one), Catch::Contains(path.string()) && Catch::Contains("more"));
  CHECK(one.value() == std::vector<float>(5, 0.0f));  // unchanged
  std::filesystem::remove_all(dir);
}
