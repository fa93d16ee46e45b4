// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The `mirror::nest` concept: the values collectives accept.
///
/// **Models.** A nest is a leaf (`mirror::leaf`, see `mirror/leaf_traits.hpp`), or one of these
/// containers of nests, to any depth:
/// - `std::tuple<...>`, `std::pair<A, B>`, `boost::hana::tuple<...>`;
/// - `std::array<N, K>` whose element is itself a non-arithmetic nest (an array of arithmetic
///   elements is a leaf: one contiguous buffer);
/// - a struct adapted with `BOOST_HANA_DEFINE_STRUCT` or `BOOST_HANA_ADAPT_STRUCT`.
///
/// **Minimal complete definition.** Nothing for the container kinds above; a new leaf type needs a
/// `mirror::leaf_traits` specialisation.
///
/// **Laws.** A collective returns a value of the nest's own type, and visits its leaves in a fixed
/// order (declaration order, depth first), so leaf *k* of one replica meets leaf *k* of every other.

#include <array>
#include <boost/hana/accessors.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/tuple.hpp>
#include <cstddef>
#include <mirror/leaf_traits.hpp>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mirror {
namespace detail {

template <class T>
struct is_std_tuple_like : std::false_type {};
template <class... Ts>
struct is_std_tuple_like<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct is_std_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T, std::size_t N>
struct is_std_tuple_like<std::array<T, N>> : std::bool_constant<!leaf<std::array<T, N>>> {};

template <class T>
struct is_hana_tuple : std::false_type {};
template <class... Ts>
struct is_hana_tuple<boost::hana::tuple<Ts...>> : std::true_type {};

template <class T>
inline constexpr bool is_hana_struct = boost::hana::Struct<T>::value;

template <class T>
consteval bool is_nest_impl();

template <class Tuple, std::size_t... I>
consteval bool all_std_elements_are_nests(std::index_sequence<I...>) {
  return (is_nest_impl<std::remove_cvref_t<std::tuple_element_t<I, Tuple>>>() && ...);
}

template <class... Ts>
consteval bool all_are_nests(boost::hana::tuple<Ts...>*) {
  return (is_nest_impl<std::remove_cvref_t<Ts>>() && ...);
}

template <class S>
consteval bool all_members_are_nests() {
  bool ok = true;
  boost::hana::for_each(boost::hana::accessors<S>(), [&](auto pair) {
    using member = std::remove_cvref_t<decltype(boost::hana::second(pair)(std::declval<S&>()))>;
    ok = ok && is_nest_impl<member>();
  });
  return ok;
}

template <class T>
consteval bool is_nest_impl() {
  if constexpr (leaf<T>) {
    return true;
  } else if constexpr (is_std_tuple_like<T>::value) {
    return all_std_elements_are_nests<T>(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (is_hana_tuple<T>::value) {
    return all_are_nests(static_cast<T*>(nullptr));
  } else if constexpr (is_hana_struct<T>) {
    return all_members_are_nests<T>();
  } else {
    return false;
  }
}

}  // namespace detail

/// Satisfied by the types collectives accept: see the file comment.
template <class T>
concept nest = detail::is_nest_impl<std::remove_cvref_t<T>>();

namespace detail {
template <class T>
struct is_vector_of_non_arithmetic : std::false_type {};
template <class E, class A>
struct is_vector_of_non_arithmetic<std::vector<E, A>> : std::bool_constant<!std::is_arithmetic_v<E>> {};

/// The body of a collective's overload for a value that is not a nest: one sentence that says
/// why, in place of the constraint's notes (and of run's "fn must be callable" after them).
template <class T>
constexpr bool explain_not_nest() {
  using N = std::remove_cvref_t<T>;
  static_assert(!is_vector_of_non_arithmetic<N>::value,
                "mirror: a std::vector of vectors (or of other non-arithmetic elements) is not a mirror::nest: a "
                "leaf is one contiguous buffer of arithmetic elements, and a nest's shape is fixed by its type, so a "
                "run-time list of buffers is neither; use std::array<std::vector<E>, K>, a std::tuple or a Hana "
                "struct of leaves, or one flat std::vector<E> (and std::span views of its parts)");
  static_assert(is_vector_of_non_arithmetic<N>::value || nest<N>,
                "mirror: this value is not a mirror::nest: pass a leaf (an arithmetic scalar, std::vector or "
                "std::array of arithmetic elements, std::span, mirror::matrix, or a type with mirror::leaf_traits) or "
                "a std::tuple, std::pair, std::array, boost::hana::tuple or Hana struct of nests");
  return false;
}
}  // namespace detail

}  // namespace mirror
