// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::matrix<E>` and `mirror::matrix_view<E>`: 2-D row-major batch leaves
/// (`[batch, features]`), so that `distribute_dataset` splits images by rows.

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>
#include <mirror/leaf_traits.hpp>

namespace mirror {

/// A view of `rows() x cols` elements, row-major: row i is `data[i * cols, (i + 1) * cols)`.
/// `data.size()` must be a multiple of `cols`: `distribute_dataset` throws `mirror::shape_error`
/// for a batch leaf that is not a whole number of rows.
/// As a nest leaf it is reduced element-wise, in place (like `std::span<E>`); as a batch leaf
/// its leading dimension is the row.
template <class E>
struct matrix_view {
  std::span<E> data;     ///< the elements, row after row
  std::size_t cols = 1;  ///< elements per row

  /// `data.size() / cols` (0 when `cols` is 0).
  std::size_t rows() const noexcept { return cols == 0 ? 0 : data.size() / cols; }
  /// Rows [first, first + count).
  matrix_view subrows(std::size_t first, std::size_t count) const noexcept {
    return {data.subspan(first * cols, count * cols), cols};
  }
  /// The element in row `r`, column `c` (unchecked).
  E& operator()(std::size_t r, std::size_t c) const noexcept { return data[r * cols + c]; }
  /// A read-only view of the same rows.
  operator matrix_view<const E>() const noexcept { return {data, cols}; }
};

/// An owning `rows() x cols` row-major matrix. `distribute_dataset` hands replicas
/// `matrix_view<const E>` slices of it (no copy), and throws `mirror::shape_error` when
/// `data.size()` is not a multiple of `cols`.
template <class E>
struct matrix {
  std::vector<E> data;   ///< the elements, row after row
  std::size_t cols = 1;  ///< elements per row

  /// `data.size() / cols` (0 when `cols` is 0).
  std::size_t rows() const noexcept { return cols == 0 ? 0 : data.size() / cols; }
  ///@{
  /// A view of all rows.
  matrix_view<E> view() noexcept { return {data, cols}; }
  matrix_view<const E> view() const noexcept { return {data, cols}; }
  ///@}
  ///@{
  /// The element in row `r`, column `c` (unchecked).
  E& operator()(std::size_t r, std::size_t c) noexcept { return data[r * cols + c]; }
  const E& operator()(std::size_t r, std::size_t c) const noexcept { return data[r * cols + c]; }
  ///@}
  friend bool operator==(const matrix&, const matrix&) = default;
};

/// `matrix<E>` is a rank-2 owning leaf: reduced element-wise, split by rows as a batch.
template <class E>
struct leaf_traits<matrix<E>, std::enable_if_t<std::is_arithmetic_v<E>>> {
  ///@{
  /// The leaf_traits interface (the table in the file comment of mirror/leaf_traits.hpp).
  static constexpr bool is_leaf = true;
  using element_type = E;
  static constexpr int rank = 2;
  static constexpr bool is_view = false;
  static constexpr bool resizable = true;
  static std::span<E> elements(matrix<E>& x) noexcept { return x.data; }
  static std::span<const E> elements(const matrix<E>& x) noexcept { return x.data; }
  static void resize(matrix<E>& x, std::size_t n) { x.data.resize(n); }
  ///@}
};

/// `matrix_view<E>` of mutable E is a rank-2 view leaf: reduced in place, like `std::span<E>`.
template <class E>
struct leaf_traits<matrix_view<E>, std::enable_if_t<std::is_arithmetic_v<E> && !std::is_const_v<E>>> {
  ///@{
  /// The leaf_traits interface (the table in the file comment of mirror/leaf_traits.hpp).
  static constexpr bool is_leaf = true;
  using element_type = E;
  static constexpr int rank = 2;
  static constexpr bool is_view = true;
  static constexpr bool resizable = false;
  static std::span<E> elements(const matrix_view<E>& x) noexcept { return x.data; }
  ///@}
};

}  // namespace mirror
