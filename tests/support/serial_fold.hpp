// SPDX-License-Identifier: Apache-2.0
#pragma once
// Bitwise order checks of an all-reduce: floats of mixed magnitudes, whose sums round
// differently in any other order, and the serial fold in replica order 0, 1, ..., N-1 that a
// policy documented as "replica order" must equal bit for bit.
#include <cstddef>
#include <mirror/reduce_op.hpp>

namespace mirror::test {

/// Replica r's element i.
inline float mixed_magnitude(int r, std::size_t i) {
  const float v[] = {1e8f, 1.0f, -1e8f, 3.25f, 1e-3f, -7.5e7f, 0.1f};
  const auto u = static_cast<std::size_t>(r);
  return v[(u * 3 + i) % 7] * float(1 + (u + i) % 3);
}

/// Element i of the all-reduce of `replicas` replicas' mixed_magnitude values, folded in replica
/// order (mean: the sum divided by the count). No NaN or signed zero occurs, so min and max need
/// no IEEE special cases.
inline float serial_fold(ReduceOp op, int replicas, std::size_t i) {
  float acc = mixed_magnitude(0, i);
  for (int r = 1; r < replicas; ++r) {
    const float x = mixed_magnitude(r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean: acc = acc + x; break;
      case ReduceOp::prod: acc = acc * x; break;
      case ReduceOp::min: acc = x < acc ? x : acc; break;
      case ReduceOp::max: acc = acc < x ? x : acc; break;
    }
  }
  return op == ReduceOp::mean ? acc / float(replicas) : acc;
}

}  // namespace mirror::test
