// SPDX-License-Identifier: Apache-2.0
#pragma once
// An element type's reduction arithmetic as values (its element_kind and five function pointers), so
// that an algorithm written over bytes is compiled once for every element type instead of once
// per type: only the arithmetic, which must see the type to vectorise, is instantiated per type.
// ops::ChunkOwnerAllReduce and Strategy::reduce's per-leaf work (detail::reduce_leaf) run on it
// (docs/design.md#compile-time).

#include <cstddef>
#include <mirror/reduce_op.hpp>
#include <mirror/detail/element_kind.hpp>
#include <mirror/detail/element_ops.hpp>

namespace mirror::detail {

struct element_kernels {
  element_kind kind;  ///< E's run-time tag
  constexpr std::size_t size() const noexcept { return kind.bytes; }  ///< sizeof(E)
  /// combine_into<E> over n elements at byte addresses aligned for E.
  void (*combine)(ReduceOp op, void* dst, const void* src, std::size_t n) noexcept;
  /// sum_many<E>: dst += src[0], ..., += src[count-1] (E pointers, as const void*; best at most
  /// combine_pass of them), n elements each, n a multiple of 16 / size. Null where E has no
  /// vector loop (has_sum_many).
  void (*sum)(void* dst, const void* const* src, std::size_t count, std::size_t n) noexcept;
  /// sum_pair_in_place<E>: a and b both set to a + b, n elements, n a multiple of 16 / size.
  /// Null where sum is.
  void (*sum_pair)(void* a, void* b, std::size_t n) noexcept;
  /// divide_all<E> over n elements.
  void (*divide)(void* p, std::size_t n, std::size_t count) noexcept;
  /// The k-th of an array of E* (an array that another replica published: read as E*, which it
  /// is, not through a differently typed pointer).
  unsigned char* (*leaf)(const void* leaves, std::size_t k) noexcept;
};

template <class E>
struct element_kernels_of {
  static void combine(ReduceOp op, void* dst, const void* src, std::size_t n) noexcept {
    combine_into(op, static_cast<E*>(dst), static_cast<const E*>(src), n);
  }
  static void divide(void* p, std::size_t n, std::size_t count) noexcept {
    divide_all(static_cast<E*>(p), n, count);
  }
  static unsigned char* leaf(const void* leaves, std::size_t k) noexcept {
    return reinterpret_cast<unsigned char*>(static_cast<E* const*>(leaves)[k]);
  }
  static constexpr element_kernels value{element_kind_of<E>(), &combine, has_sum_many<E> ? &sum_many<E> : nullptr,
                                         has_sum_many<E> ? &sum_pair_in_place<E> : nullptr, &divide, &leaf};
};

}  // namespace mirror::detail
