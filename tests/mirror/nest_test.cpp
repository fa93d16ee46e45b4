// SPDX-License-Identifier: Apache-2.0
// mirror/concepts/nest.hpp and mirror/leaf_traits.hpp: what is a nest, traversal order, and a
// user leaf type through the leaf_traits customisation point.

#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/tuple.hpp>
#include <catch2/catch.hpp>
#include <string>
#include <vector>
#include <mirror/mirror.hpp>

namespace {
struct Defined {
  BOOST_HANA_DEFINE_STRUCT(Defined, (std::vector<float>, w), (int, n));
};
struct Plain {
  double x;
  std::array<Defined, 2> parts;
};
/// A user buffer type made a leaf: a view over memory the user owns (reduced in place).
struct Grad {
  float* p;
  std::size_t n;
};
}  // namespace
BOOST_HANA_ADAPT_STRUCT(Plain, x, parts);

template <>
struct mirror::leaf_traits<Grad> {
  static constexpr bool is_leaf = true;
  using element_type = float;
  static constexpr int rank = 1;
  static constexpr bool is_view = true;
  static constexpr bool resizable = false;
  static std::span<float> elements(const Grad& g) { return {g.p, g.n}; }
};

static_assert(mirror::nest<float> && mirror::nest<std::int8_t> && mirror::nest<std::vector<double>>);
static_assert(mirror::nest<std::array<int, 3>> && mirror::nest<std::span<float>>);
static_assert(mirror::nest<std::tuple<int, std::pair<float, std::vector<int>>>>);
static_assert(mirror::nest<boost::hana::tuple<int, Defined>> && mirror::nest<Defined> && mirror::nest<Plain>);
static_assert(mirror::nest<std::array<Defined, 2>> && mirror::nest<Grad>);
static_assert(!mirror::nest<std::string> && !mirror::nest<std::tuple<int, std::string>>);
static_assert(!mirror::nest<std::span<const float>>);  // read-only memory cannot be reduced in place
static_assert(!mirror::nest<std::vector<std::vector<float>>>);  // not contiguous
static_assert(mirror::detail::leaf_count<Plain>() == 5);
static_assert(std::is_same_v<mirror::detail::element_types_t<Plain>, mirror::detail::type_list<double, float, int>>);

TEST_CASE("leaves are visited depth first in declaration order", "[nest]") {
  Plain p{1.5, {Defined{{1, 2}, 3}, Defined{{4}, 5}}};
  std::vector<std::size_t> sizes;
  std::vector<double> firsts;
  mirror::detail::for_each_leaf(
      [&](auto& l) {
        const auto e = mirror::leaf_traits<std::remove_cvref_t<decltype(l)>>::elements(l);
        sizes.push_back(e.size());
        firsts.push_back(double(e[0]));
      },
      p);
  REQUIRE(sizes == std::vector<std::size_t>{1, 2, 1, 1, 1});
  REQUIRE(firsts == std::vector<double>{1.5, 1, 3, 4, 5});
}

TEST_CASE("a user leaf type is reduced through leaf_traits", "[nest][leaf_traits]") {
  mirror::Strategy<mirror::devices::Threads> s{{.replicas = 3}};
  std::vector<std::vector<float>> memory(3, std::vector<float>(100));
  const auto out = s.run([&](auto& ctx) {
    auto& mine = memory[static_cast<std::size_t>(ctx.replica_id_in_sync_group())];
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = float(i) * float(ctx.replica_id_in_sync_group());
    return ctx.all_reduce(mirror::ReduceOp::sum, std::tuple{Grad{mine.data(), mine.size()}, Plain{1.0, {}}});
  });
  for (const auto& m : memory) {
    for (std::size_t i = 0; i < m.size(); ++i) REQUIRE(m[i] == float(i) * 3.0f);
  }
  REQUIRE(std::get<1>(out.primary()).x == 3.0);
}
