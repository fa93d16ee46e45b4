// SPDX-License-Identifier: Apache-2.0
#pragma once
// The leaves of one element type, as one replica's device pointers, seen by ops policies as one
// virtual concatenation (TF's packing concatenates them the same way).

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <span>
#include <utility>

namespace mirror::detail {

/// One replica's leaves of element type E. `sizes` is equal on every replica (checked before
/// any ops policy runs).
template <class Rt, class E>
struct segment_list {
  using pointer = typename Rt::template pointer<E>;
  std::span<const pointer> leaves;
  std::span<const std::size_t> sizes;
  std::size_t total;
};

/// Calls f(leaf, offset_in_leaf, count, virtual_offset) for the parts of the virtual range
/// [begin, end) that fall in each leaf, in order.
template <class F>
void for_each_piece(std::span<const std::size_t> sizes, std::size_t begin, std::size_t end, F&& f) {
  std::size_t start = 0;
  for (std::size_t k = 0; k < sizes.size() && start < end; ++k) {
    const std::size_t stop = start + sizes[k];
    const std::size_t a = std::max(begin, start), b = std::min(end, stop);
    if (a < b) f(k, a - start, b - a, a);
    start = stop;
  }
}

/// Part `r` of `parts` of the range [a, b) of elements of `element_size` bytes, with boundaries
/// on 64-byte multiples so that two replicas never write the same cache line.
inline std::pair<std::size_t, std::size_t> chunk_of(std::size_t a, std::size_t b, int r, int parts,
                                                    std::size_t element_size) noexcept {
  const std::size_t line = element_size >= 64 ? 1 : 64 / element_size;
  const std::size_t n = b - a;
  std::size_t per = (n + static_cast<std::size_t>(parts) - 1) / static_cast<std::size_t>(parts);
  per = (per + line - 1) / line * line;
  const std::size_t lo = std::min(b, a + per * static_cast<std::size_t>(r));
  const std::size_t hi = std::min(b, lo + per);
  return {lo, hi};
}

/// The same for elements of type E (the line a compile-time constant).
template <class E>
std::pair<std::size_t, std::size_t> chunk_of(std::size_t a, std::size_t b, int r, int parts) noexcept {
  return chunk_of(a, b, r, parts, sizeof(E));
}

}  // namespace mirror::detail
