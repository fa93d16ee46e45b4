// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::ReduceOp`: how values from several replicas combine into one.

#include <string_view>

namespace mirror {

/// The cross-replica reduction applied element by element.
///
/// `sum`, `min`, `max`, `prod` combine the replicas' elements. `mean` is the sum divided by the
/// number of replicas (or, with `axis0`, by the total element count). It keeps the element type:
/// integer leaves divide as integers, truncating toward zero, as C++ `/` does.
///
/// **Example**: `ctx.all_reduce(mirror::ReduceOp::mean, grads)`.
enum class ReduceOp { sum, mean, min, max, prod };

/// The enumerator's name, for error messages and benchmark labels.
constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
  }
  return "?";
}

}  // namespace mirror
