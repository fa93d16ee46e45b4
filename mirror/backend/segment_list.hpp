// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::backend::segment_list`: the leaves of one element type of one replica's collective,
/// as an ops policy sees them, and the helpers that walk them as one packed range.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <span>
#include <utility>

namespace mirror::backend {

/// One replica's leaves of element type `E` as handles into its device's memory
/// (`Rt::pointer<E>`), seen as one virtual concatenation (the leaves one after another, as
/// TensorFlow packs them). `sizes` is equal on every replica: the collectives layer checks it
/// before any ops policy runs.
///
/// A list of `const E` is an input the policy only reads (`all_gather`'s `in`): its handles are
/// `Rt::pointer<const E>`, which the runtime's `copy` and `combine` accept as sources, and which
/// nothing can write through.
template <class Rt, class E>
struct segment_list {
  /// A handle into one replica's memory: `E*` on host devices.
  using pointer = typename Rt::template pointer<E>;
  std::span<const pointer> leaves;     ///< one handle per leaf, in nest order
  std::span<const std::size_t> sizes;  ///< elements per leaf
  std::size_t total;                   ///< the sum of `sizes`
};

/// The read-only input of a collective: `segment_list<Rt, const E>`.
template <class Rt, class E>
using const_segment_list = segment_list<Rt, const E>;

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
/// on 64-byte multiples so that two replicas never write the same cache line. {first, last}.
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

}  // namespace mirror::backend
