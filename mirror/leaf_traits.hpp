// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::leaf_traits<T>`: the customisation point that makes a type a leaf of a nest.
///
/// A leaf is a contiguous run of arithmetic elements that collectives reduce element by element.
/// mirror ships traits for arithmetic scalars, `std::vector<E>`, `std::array<E, N>` and
/// `std::span<E>` (E arithmetic). To make your own contiguous container a leaf, specialise
/// `leaf_traits` with these members:
///
/// | member | meaning |
/// |---|---|
/// | `static constexpr bool is_leaf = true;` | marks the specialisation |
/// | `using element_type = E;` | the arithmetic element type |
/// | `static constexpr int rank` | 0 for a scalar, 1 for a buffer (`axis0` needs rank >= 1) |
/// | `static constexpr bool is_view` | true if copying the leaf aliases the same memory: collectives then reduce in place, allocating nothing |
/// | `static constexpr bool resizable` | true if `resize(x, n)` exists (broadcast gives it the source's size) |
/// | `static std::span<E> elements(T&)` and `static std::span<const E> elements(const T&)` | the elements |
/// | `static void resize(T&, std::size_t)` | only when `resizable` |
/// | `static constexpr bool device_resident` | optional, default false: the elements live in memory the host must not read (GPU memory) |
///
/// **Device-resident leaves** (`device_resident = true`: `mirror::cuda::device_span`,
/// `thrust::device_vector`) are only ever touched through the device runtime's copy and combine
/// primitives, never dereferenced by mirror on the host: `Strategy::reduce` reduces them on the
/// replicas' devices and synchronises the stream holding the result; what would need a host
/// read (`reduce(op, v, axis0)`, variables) is a compile error, as is using them on a device
/// whose runtime is `host_addressable` (the CPU would read GPU memory).
///
/// **Example** (a user buffer type):
/// \code
/// struct Grad { float* p; std::size_t n; };
/// template <> struct mirror::leaf_traits<Grad> {
///   static constexpr bool is_leaf = true;
///   using element_type = float;
///   static constexpr int rank = 1;
///   static constexpr bool is_view = true, resizable = false;
///   static std::span<float> elements(const Grad& g) { return {g.p, g.n}; }
/// };
/// \endcode
/// (`tests/mirror/nest_test.cpp` compiles and runs this one.)

#include <array>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace mirror {

/// Primary template: not a leaf. Specialise it (see the file comment) to add a leaf type.
template <class T, class Enable = void>
struct leaf_traits {
  static constexpr bool is_leaf = false;  ///< not a leaf (nor, by itself, a nest)
};

namespace detail {
template <class T>
inline constexpr bool is_element_candidate = std::is_arithmetic_v<T>;
}  // namespace detail

/// Arithmetic scalars: a leaf of one element, reduced by value.
template <class T>
struct leaf_traits<T, std::enable_if_t<std::is_arithmetic_v<T>>> {
  ///@{
  /// The leaf_traits interface (the table in the file comment of mirror/leaf_traits.hpp).
  static constexpr bool is_leaf = true;
  using element_type = T;
  static constexpr int rank = 0;
  static constexpr bool is_view = false;
  static constexpr bool resizable = false;
  static std::span<T> elements(T& x) noexcept { return {&x, 1}; }
  static std::span<const T> elements(const T& x) noexcept { return {&x, 1}; }
  ///@}
};

/// `std::vector<E>`: an owning buffer; a reduction returns a new vector.
template <class E, class A>
struct leaf_traits<std::vector<E, A>, std::enable_if_t<std::is_arithmetic_v<E>>> {
  ///@{
  /// The leaf_traits interface (the table in the file comment of mirror/leaf_traits.hpp).
  static constexpr bool is_leaf = true;
  using element_type = E;
  static constexpr int rank = 1;
  static constexpr bool is_view = false;
  static constexpr bool resizable = true;
  static std::span<E> elements(std::vector<E, A>& x) noexcept { return {x.data(), x.size()}; }
  static std::span<const E> elements(const std::vector<E, A>& x) noexcept {
    return {x.data(), x.size()};
  }
  static void resize(std::vector<E, A>& x, std::size_t n) { x.resize(n); }
  ///@}
};

/// `std::array<E, N>` of arithmetic E: an owning fixed-size buffer. (An array of nests is a nest.)
template <class E, std::size_t N>
struct leaf_traits<std::array<E, N>, std::enable_if_t<std::is_arithmetic_v<E>>> {
  ///@{
  /// The leaf_traits interface (the table in the file comment of mirror/leaf_traits.hpp).
  static constexpr bool is_leaf = true;
  using element_type = E;
  static constexpr int rank = 1;
  static constexpr bool is_view = false;
  static constexpr bool resizable = false;
  static std::span<E> elements(std::array<E, N>& x) noexcept { return {x.data(), N}; }
  static std::span<const E> elements(const std::array<E, N>& x) noexcept { return {x.data(), N}; }
  ///@}
};

/// `std::span<E>` of mutable arithmetic E: a view. Collectives reduce it in place, so the result
/// lands in every replica's own buffer and nothing is allocated.
template <class E, std::size_t Extent>
struct leaf_traits<std::span<E, Extent>,
                   std::enable_if_t<std::is_arithmetic_v<E> && !std::is_const_v<E>>> {
  ///@{
  /// The leaf_traits interface (the table in the file comment of mirror/leaf_traits.hpp).
  static constexpr bool is_leaf = true;
  using element_type = E;
  static constexpr int rank = 1;
  static constexpr bool is_view = true;
  static constexpr bool resizable = false;
  static std::span<E> elements(const std::span<E, Extent>& x) noexcept { return {x.data(), x.size()}; }
  ///@}
};

/// True when `leaf_traits<T>` has been specialised (by mirror or by the user).
template <class T>
concept leaf = leaf_traits<std::remove_cvref_t<T>>::is_leaf;

/// True when leaf T declares `device_resident = true` (its elements are not host-readable).
template <class T>
inline constexpr bool device_resident_leaf = [] {
  if constexpr (requires { leaf_traits<std::remove_cvref_t<T>>::device_resident; }) {
    return static_cast<bool>(leaf_traits<std::remove_cvref_t<T>>::device_resident);
  } else {
    return false;
  }
}();

/// The element type of a leaf.
template <leaf T>
using leaf_element_t = typename leaf_traits<std::remove_cvref_t<T>>::element_type;

}  // namespace mirror
