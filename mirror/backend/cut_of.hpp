// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::backend::cut_of`: the batch-split rule, the one way mirror divides a count over parts.

#include <mirror/detail/lean_std.hpp>  // std::min without <algorithm>
#include <cstddef>
#include <utility>

namespace mirror::backend {

/// Part `r` of `total` elements split over `parts`: TF's batch split, in which the first
/// `total mod parts` parts get one element more. Returns {first, count}. The rule behind input
/// distribution (rows over replicas), `reduce_scatter`'s cuts, `mirror::cut_for_replica`, and the
/// slices of the cross-worker all-reduce (workers in order).
constexpr std::pair<std::size_t, std::size_t> cut_of(std::size_t total, int parts, int r) noexcept {
  const std::size_t n = static_cast<std::size_t>(parts), i = static_cast<std::size_t>(r);
  const std::size_t base = total / n, extra = total % n;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

}  // namespace mirror::backend
