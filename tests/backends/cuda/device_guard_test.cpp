// SPDX-License-Identifier: Apache-2.0
// backends/cuda/device_guard.hpp with a fake device API: the guard makes a device current for its
// scope and gives the thread its previous device back, on every way out, without a call when the
// device is current already (the replica's hot path). Needs no GPU.
#include <catch2/catch.hpp>
#include <stdexcept>
#include <vector>
#include <mirror/backends/cuda/device_guard.hpp>

namespace {

struct fake_api {
  static inline int device = 0;
  static inline std::vector<int> sets;  // every make_current / restore, in order
  static int current() { return device; }
  static void make_current(int d) {
    if (d < 0) throw std::runtime_error("no such device");
    sets.push_back(d);
    device = d;
  }
  static void restore(int d) noexcept {
    sets.push_back(d);
    device = d;
  }
};
using guard = mirror::cuda::impl::basic_device_guard<fake_api>;

}  // namespace

TEST_CASE("cuda device guard: current for the scope, the previous device afterwards", "[cuda][no_gpu]") {
  fake_api::device = 2;
  fake_api::sets.clear();
  {
    const guard g(5);
    REQUIRE(fake_api::device == 5);
    REQUIRE(g.previous() == 2);
    {
      const guard inner(5);  // already current: no call
      REQUIRE(fake_api::sets == std::vector<int>{5});
    }
    REQUIRE(fake_api::device == 5);
  }
  REQUIRE(fake_api::device == 2);
  REQUIRE(fake_api::sets == std::vector<int>{5, 2});
}

TEST_CASE("cuda device guard: an exception in the scope still restores; a failed switch restores nothing",
          "[cuda][no_gpu]") {
  fake_api::device = 1;
  fake_api::sets.clear();
  REQUIRE_THROWS_AS(
      [] {
        const guard g(3);
        throw std::logic_error("the work failed");
      }(),
      std::logic_error);
  REQUIRE(fake_api::device == 1);
  fake_api::sets.clear();
  REQUIRE_THROWS_AS(guard(-1), std::runtime_error);
  REQUIRE(fake_api::device == 1);
  REQUIRE(fake_api::sets.empty());
}
