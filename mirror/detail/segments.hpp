// SPDX-License-Identifier: Apache-2.0
#pragma once
// The leaves of one element type, as one replica's device pointers, seen by ops policies as one
// virtual concatenation (TF's packing concatenates them the same way).

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <mirror/detail/separate_compilation.hpp>
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

/// Part `r` of `parts` of the range [a, b), with boundaries on 64-byte multiples of E so that
/// two replicas never write the same cache line.
template <class E>
std::pair<std::size_t, std::size_t> chunk_of(std::size_t a, std::size_t b, int r, int parts) noexcept {
  constexpr std::size_t line = sizeof(E) >= 64 ? 1 : 64 / sizeof(E);
  const std::size_t n = b - a;
  std::size_t per = (n + static_cast<std::size_t>(parts) - 1) / static_cast<std::size_t>(parts);
  per = (per + line - 1) / line * line;
  const std::size_t lo = std::min(b, a + per * static_cast<std::size_t>(r));
  const std::size_t hi = std::min(b, lo + per);
  return {lo, hi};
}

// Instantiated once, in libmirror_threads, for a separately compiled program (separate_compilation.hpp).
#define MIRROR_DETAIL_SEGMENTS_INSTANCES(KIND, E) \
  KIND std::pair<std::size_t, std::size_t> chunk_of<E>(std::size_t, std::size_t, int, int) noexcept;
#if MIRROR_DETAIL_EXTERN_TEMPLATES
MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT(MIRROR_DETAIL_SEGMENTS_INSTANCES, extern template)
#endif

}  // namespace mirror::detail
