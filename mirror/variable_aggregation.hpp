// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::VariableAggregation`: how replicas' updates of a variable combine.

#include <optional>
#include <string_view>
#include <mirror/reduce_op.hpp>

namespace mirror {

/// How a variable combines the replicas' values (TF's `tf.VariableAggregation`):
/// - `none`: they do not combine. A `MirroredVariable` then rejects updates in replica context
///   (`aggregation_error`; TF would silently update one copy and break the mirror), and a
///   `SyncOnReadVariable` cannot be read in cross-replica context.
/// - `sum`, `mean`: reduced with `ReduceOp::sum` / `ReduceOp::mean`.
/// - `only_first_replica`: replica 0's value is taken.
enum class VariableAggregation { none, sum, mean, only_first_replica };

/// The enumerator's name (`"sum"`), as error messages print it.
constexpr std::string_view to_string(VariableAggregation a) noexcept {
  switch (a) {
    case VariableAggregation::none: return "none";
    case VariableAggregation::sum: return "sum";
    case VariableAggregation::mean: return "mean";
    case VariableAggregation::only_first_replica: return "only_first_replica";
  }
  return "?";
}

}  // namespace mirror
