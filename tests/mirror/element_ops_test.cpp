// SPDX-License-Identifier: Apache-2.0
// The host reduction kernels against a serial loop, bit for bit, on inputs where the order of
// the operations shows: floats of mixed magnitudes (a sum in another order rounds differently),
// NaNs, signed zeros and infinities for min and max. The conformance suite's inputs are small
// integers, exact in any order, so it cannot see an order change; these can.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>
#include <mirror/detail/element_kernels.hpp>
#include <mirror/detail/host_reduce.hpp>
#include "support/reference.hpp"

namespace {

using mirror::ReduceOp;

template <class E>
E random_value(std::mt19937& g, ReduceOp op) {
  if constexpr (std::is_floating_point_v<E>) {
    if (op == ReduceOp::min || op == ReduceOp::max) {
      // One in eight a special value, where `a < b ? b : a` and std::max-like rewrites differ.
      switch (std::uniform_int_distribution<int>(0, 15)(g)) {
        case 0: return std::numeric_limits<E>::quiet_NaN();
        case 1: return E(-0.0);
        case 2: return E(0.0);
        case 3: return std::numeric_limits<E>::infinity();
        default: break;
      }
    }
    if (op == ReduceOp::prod) return E(std::uniform_real_distribution<double>(0.5, 1.5)(g));
    // Magnitudes from 1e-3 to 1e3: a sum's rounding depends on the order of its terms.
    const double m = std::pow(10.0, std::uniform_real_distribution<double>(-3, 3)(g));
    return E(std::uniform_int_distribution<int>(0, 1)(g) != 0 ? m : -m);
  } else {
    if (op == ReduceOp::prod) return E(std::uniform_int_distribution<int>(-1, 1)(g));
    return E(std::uniform_int_distribution<int>(-50, 50)(g));
  }
}

template <class E>
bool same_bits(const std::vector<E>& a, const std::vector<E>& b) {
  if constexpr (std::is_same_v<E, long double>) {
    // 10 value bytes; the rest is padding that a bitwise comparison would read.
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(&a[i], &b[i], 10) != 0) return false;
    }
    return true;
  } else {
    return mirror::test::same_bits(a.data(), b.data(), a.size());
  }
}

}  // namespace

TEMPLATE_TEST_CASE("combine_into equals a serial loop, bit for bit", "[element_ops]", float, double, std::int32_t,
                   std::int8_t, std::uint16_t, long double) {
  using E = TestType;
  std::mt19937 g(42);
  // Lengths around the 16-byte groups (the rest goes through the scalar loop).
  for (const std::size_t n : {0, 1, 3, 4, 5, 8, 17, 1001}) {
    for (const auto op : mirror::test::all_ops) {
      CAPTURE(n, mirror::to_string(op));
      // One element in: element-aligned, not 16-byte aligned (the kernels load unaligned).
      std::vector<E> dst(n + 1), src(n + 1);
      for (auto& x : dst) x = random_value<E>(g, op);
      for (auto& x : src) x = random_value<E>(g, op);
      std::vector<E> expected(dst.begin() + 1, dst.end());
      for (std::size_t i = 0; i < n; ++i) expected[i] = mirror::detail::combine(op, expected[i], src[i + 1]);
      mirror::detail::combine_into(op, dst.data() + 1, src.data() + 1, n);
      REQUIRE(same_bits(std::vector<E>(dst.begin() + 1, dst.end()), expected));
    }
  }
}

TEMPLATE_TEST_CASE("sum_many adds the sources in order, bit for bit", "[element_ops]", float, double, std::int32_t,
                   std::int8_t, std::uint16_t) {
  using E = TestType;
  static_assert(mirror::detail::has_sum_many<E>);
  std::mt19937 g(43);
  constexpr std::size_t w = 16 / sizeof(E);
  // Odd and even counts (the loop takes sources in pairs), up to and past combine_pass.
  for (const std::size_t count : {0, 1, 2, 3, 7, 8, 9}) {
    for (const std::size_t n : {std::size_t{0}, w, 3 * w, 250 * w}) {
      CAPTURE(count, n);
      std::vector<E> dst(n + 1);
      std::vector<std::vector<E>> src(count, std::vector<E>(n + 1));
      for (auto& x : dst) x = random_value<E>(g, ReduceOp::sum);
      for (auto& s : src) {
        for (auto& x : s) x = random_value<E>(g, ReduceOp::sum);
      }
      std::vector<E> expected(dst.begin() + 1, dst.end());
      for (std::size_t j = 0; j < count; ++j) {
        for (std::size_t i = 0; i < n; ++i) expected[i] = static_cast<E>(expected[i] + src[j][i + 1]);
      }
      std::vector<const void*> from(count);
      for (std::size_t j = 0; j < count; ++j) from[j] = src[j].data() + 1;
      mirror::detail::sum_many<E>(dst.data() + 1, from.data(), count, n);
      REQUIRE(same_bits(std::vector<E>(dst.begin() + 1, dst.end()), expected));
    }
  }
}

TEMPLATE_TEST_CASE("sum_pair_in_place writes a + b into both buffers, bit for bit", "[element_ops]", float, double,
                   std::int32_t, std::int8_t, std::uint16_t) {
  using E = TestType;
  static_assert(mirror::detail::has_sum_many<E>);
  std::mt19937 g(45);
  constexpr std::size_t w = 16 / sizeof(E);
  for (const std::size_t n : {std::size_t{0}, w, 3 * w, 250 * w}) {
    CAPTURE(n);
    // One element of padding on each side (unaligned groups; the neighbours stay untouched).
    std::vector<E> a(n + 2), b(n + 2);
    for (auto& x : a) x = random_value<E>(g, ReduceOp::sum);
    for (auto& x : b) x = random_value<E>(g, ReduceOp::sum);
    std::vector<E> expected_a = a, expected_b = b;
    for (std::size_t i = 1; i <= n; ++i) expected_a[i] = expected_b[i] = static_cast<E>(a[i] + b[i]);
    mirror::detail::sum_pair_in_place<E>(a.data() + 1, b.data() + 1, n);
    REQUIRE(same_bits(a, expected_a));
    REQUIRE(same_bits(b, expected_b));
  }
}

TEMPLATE_TEST_CASE("reduce_leaf equals a serial loop over the components", "[element_ops]", float,
                   double) {
  using E = TestType;
  std::mt19937 g(7);
  // 5000 elements: not whole 16-byte groups.
  for (const std::size_t components : {1, 2, 9, 16}) {
    for (const auto op : mirror::test::all_ops) {
      if (op == ReduceOp::mean) continue;  // its callers reduce a mean as a sum and divide once
      CAPTURE(components, mirror::to_string(op));
      const std::size_t n = 5000;
      std::vector<std::vector<E>> in(components, std::vector<E>(n));
      for (auto& c : in) {
        for (auto& x : c) x = random_value<E>(g, op);
      }
      std::vector<E> expected = in[0];
      for (std::size_t r = 1; r < components; ++r) {
        for (std::size_t i = 0; i < n; ++i) expected[i] = mirror::detail::combine(op, expected[i], in[r][i]);
      }
      std::vector<const void*> from(components);
      for (std::size_t r = 0; r < components; ++r) from[r] = in[r].data();
      std::vector<E> out(n);
      mirror::detail::reduce_leaf(op, out.data(), n, from.data(), components, mirror::detail::serial_parallel(),
                                  mirror::detail::element_kernels_of<E>::value);
      REQUIRE(same_bits(out, expected));
    }
  }
}

TEMPLATE_TEST_CASE("divide_all equals dividing element by element", "[element_ops]", float, double, std::int32_t,
                   std::int8_t, long double) {
  using E = TestType;
  std::mt19937 g(44);
  for (const std::size_t n : {0, 1, 3, 4, 5, 17, 1001}) {
    for (const std::size_t count : {1, 3, 7, 200}) {
      CAPTURE(n, count);
      std::vector<E> p(n + 1);
      for (auto& x : p) x = random_value<E>(g, ReduceOp::sum);
      std::vector<E> expected(p.begin() + 1, p.end());
      for (auto& x : expected) x = mirror::detail::divide(x, count);
      mirror::detail::divide_all(p.data() + 1, n, count);
      REQUIRE(same_bits(std::vector<E>(p.begin() + 1, p.end()), expected));
    }
  }
}

TEMPLATE_TEST_CASE("min and max are IEEE 754-2019 minimum and maximum: NaN wins, -0 is below +0, in either order",
                   "[element_ops][min_max]", float, double, long double) {
  // Against std:: functions: with no NaN and not two zeros, std::fmin / std::fmax; a NaN operand
  // gives a NaN (std::isnan); zeros of both signs give -0 for min and +0 for max (std::signbit).
  // Every pair of special and ordinary values, in both orders, through the scalar combine and the
  // vector loop (the pairs fill whole 16-byte groups, and a tail).
  using E = TestType;
  const E nan = std::numeric_limits<E>::quiet_NaN(), inf = std::numeric_limits<E>::infinity();
  const std::vector<E> values = {nan, -nan, E(-0.0), E(0.0), inf, -inf, E(1.5), E(-1.5), E(1e-30), E(-3),
                                 std::numeric_limits<E>::denorm_min(), std::numeric_limits<E>::max()};
  std::vector<E> dst, src;
  for (const E a : values) {
    for (const E b : values) {
      dst.push_back(a);
      src.push_back(b);
    }
  }
  for (const auto op : {ReduceOp::min, ReduceOp::max}) {
    std::vector<E> vectored = dst;
    mirror::detail::combine_into(op, vectored.data(), src.data(), vectored.size());
    for (std::size_t i = 0; i < dst.size(); ++i) {
      const E a = dst[i], b = src[i];
      CAPTURE(mirror::to_string(op), double(a), double(b));
      for (const E got : {mirror::detail::combine(op, a, b), vectored[i]}) {
        if (std::isnan(a) || std::isnan(b)) {
          REQUIRE(std::isnan(got));
        } else if (a == 0 && b == 0) {
          const bool negative = op == ReduceOp::min ? (std::signbit(a) || std::signbit(b))
                                                    : (std::signbit(a) && std::signbit(b));
          REQUIRE((got == 0 && std::signbit(got) == negative));
        } else {
          REQUIRE(got == (op == ReduceOp::min ? std::fmin(a, b) : std::fmax(a, b)));
        }
      }
      // Order-free: the same result the other way round (a NaN's bits may differ).
      const E other = mirror::detail::combine(op, b, a), got = mirror::detail::combine(op, a, b);
      if (std::isnan(got)) {
        REQUIRE(std::isnan(other));
      } else {
        REQUIRE((other == got && std::signbit(other) == std::signbit(got)));
      }
    }
  }
}

TEMPLATE_TEST_CASE("integer min and max are the smaller and the larger", "[element_ops][min_max]", std::int8_t,
                   std::int32_t, std::uint16_t, std::int64_t) {
  using E = TestType;
  std::mt19937 g(45);
  std::vector<E> a(1001), b(1001);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<E>(g());
    b[i] = static_cast<E>(g());
  }
  for (const auto op : {ReduceOp::min, ReduceOp::max}) {
    std::vector<E> out = a;
    mirror::detail::combine_into(op, out.data(), b.data(), out.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      REQUIRE(out[i] == (op == ReduceOp::min ? std::min(a[i], b[i]) : std::max(a[i], b[i])));
    }
  }
}
