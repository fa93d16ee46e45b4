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
/// For floating-point elements `min` and `max` are IEEE 754-2019's minimum and maximum
/// (TensorFlow's reduce_min, reduce_max): a NaN on any replica gives NaN, and -0 is less than +0,
/// so the result does not depend on the order the replicas are combined in (except under
/// `ops::NcclAllReduce`, which uses NCCL's own ncclMin and ncclMax).
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
