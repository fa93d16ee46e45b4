// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fault-injection suites' reference (tests/fault/fault_injection.cpp in one process,
// tests/fault/cluster_fault_injection.cpp across workers): a serial fold of the replicas'
// values as docs/errors.md and mirror/reduce_op.hpp document it, NaNs and signed zeros included,
// and a bitwise-meaning comparison.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>
#include <mirror/reduce_op.hpp>

namespace mirror::test {

/// The documented result of a reduction of the replicas' values x, in replica order (mean: the
/// sum divided by their count in the element type).
template <class E>
E reference(mirror::ReduceOp op, const std::vector<E>& x) {
  E acc = x[0];
  for (std::size_t r = 1; r < x.size(); ++r) {
    const E v = x[r];
    switch (op) {
      case mirror::ReduceOp::sum:
      case mirror::ReduceOp::mean: acc = static_cast<E>(acc + v); break;
      case mirror::ReduceOp::prod: acc = static_cast<E>(acc * v); break;
      case mirror::ReduceOp::min:
      case mirror::ReduceOp::max:
        if constexpr (std::is_floating_point_v<E>) {
          if (std::isnan(acc) || std::isnan(v)) {
            acc = std::numeric_limits<E>::quiet_NaN();
          } else if (acc == 0 && v == 0) {  // zeros of either sign: -0 is below +0
            const bool negative = op == mirror::ReduceOp::min ? (std::signbit(acc) || std::signbit(v))
                                                      : (std::signbit(acc) && std::signbit(v));
            acc = negative ? E(-0.0) : E(0.0);
          } else {
            acc = op == mirror::ReduceOp::min ? std::fmin(acc, v) : std::fmax(acc, v);
          }
        } else {
          acc = op == mirror::ReduceOp::min ? std::min(acc, v) : std::max(acc, v);
        }
        break;
    }
  }
  if (op == mirror::ReduceOp::mean) acc = static_cast<E>(acc / static_cast<E>(x.size()));
  return acc;
}

/// Equal, NaN equal to NaN, and -0 unequal to +0.
template <class E>
bool same(E a, E b) {
  if constexpr (std::is_floating_point_v<E>) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return a == b && std::signbit(a) == std::signbit(b);
  } else {
    return a == b;
  }
}

}  // namespace mirror::test
