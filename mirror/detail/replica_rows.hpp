// SPDX-License-Identifier: Apache-2.0
#pragma once
// The balanced split of a count over parts: input rows over replicas (distribute_dataset), and
// the slices of the cross-worker all-reduce in worker order (backends/mpi).

#include <mirror/detail/lean_std.hpp>  // std::min without <algorithm>
#include <cstddef>
#include <utility>

namespace mirror::detail {

/// TF's split of G rows over R replicas: the first G mod R replicas get one more row.
/// Returns replica r's rows [first, first + count).
constexpr std::pair<std::size_t, std::size_t> replica_rows(std::size_t global, int replicas, int r) noexcept {
  const std::size_t n = static_cast<std::size_t>(replicas), i = static_cast<std::size_t>(r);
  const std::size_t base = global / n, extra = global % n;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

}  // namespace mirror::detail
