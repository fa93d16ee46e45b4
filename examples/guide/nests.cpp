// SPDX-License-Identifier: Apache-2.0
// docs/guide.md, "Nests and leaves": the snippets between the // [name] markers are copied
// into the guide (tools/check_docs.py keeps the two equal). Exits 1 on a wrong value.
#include <mirror/mirror.hpp>
#include "check.hpp"
#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/define_struct.hpp>
#include <array>
#include <cstdio>
#include <span>
#include <tuple>
#include <vector>

// [structs]
struct Layer {                                    // a Hana struct is a nest
  BOOST_HANA_DEFINE_STRUCT(Layer, (std::vector<float>, w), (std::vector<float>, b));
};
struct Stats {                                    // so is an existing struct, adapted
  double loss;
  std::array<long, 2> counts;
};
BOOST_HANA_ADAPT_STRUCT(Stats, loss, counts);
// [/structs]

// [leaf_traits]
// Your own buffer type becomes a leaf by specialising mirror::leaf_traits.
struct Buffer {
  float* data;
  std::size_t size;
};
template <>
struct mirror::leaf_traits<Buffer> {
  static constexpr bool is_leaf = true;
  using element_type = float;
  static constexpr int rank = 1;
  static constexpr bool is_view = true;     // reduced in place, like std::span
  static constexpr bool resizable = false;
  static std::span<float> elements(const Buffer& b) { return {b.data, b.size}; }
};
// [/leaf_traits]

using guide::check;

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 3}};

  // [nests]
  auto synced = strategy.run([](auto& ctx) {
    const float r = static_cast<float>(ctx.replica_id_in_sync_group());
    std::tuple<Layer, Stats> mine{Layer{std::vector<float>(4, r), {r}},
                                  Stats{0.5 * r, {1, 2}}};
    return ctx.all_reduce(mirror::ReduceOp::sum, mine);   // one fused collective per element type
  });
  const auto& [layer, stats] = synced.primary();          // layer.w[i] == 0+1+2, stats.counts == {3, 6}
  // [/nests]
  check(layer.w == std::vector<float>(4, 3.0f) && layer.b == std::vector<float>{3.0f}, "layer");
  check(stats.loss == 1.5 && stats.counts[0] == 3 && stats.counts[1] == 6, "stats");

  std::array<std::vector<float>, 3> memory{std::vector<float>(5, 1.0f), std::vector<float>(5, 2.0f),
                                           std::vector<float>(5, 3.0f)};
  strategy.run([&memory](auto& ctx) {
    auto& mine = memory[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
    ctx.all_reduce(mirror::ReduceOp::min, Buffer{mine.data(), mine.size()});
  });
  check(memory[0] == std::vector<float>(5, 1.0f) && memory[2] == std::vector<float>(5, 1.0f), "user leaf");

  return guide::result("nests");
}
