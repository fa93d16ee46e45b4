// SPDX-License-Identifier: Apache-2.0
#pragma once
// Depth-first traversal of nests (mirror/concepts/nest.hpp), in lockstep over several nests of
// the same type, plus compile-time facts about a nest type (leaf count, element types).

#include <boost/hana/accessors.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/unpack.hpp>
#include <array>
#include <cstddef>
#include <span>
#include <mirror/concepts/nest.hpp>
#include <tuple>
#include <type_traits>
#include <utility>

namespace mirror::detail {

/// Calls `f(leaf_of_x0, leaf_of_x1, ...)` for every leaf position of the nests `xs` (all of one
/// type, each possibly const), depth first, in declaration order.
template <class F, class X0, class... Xs>
constexpr void for_each_leaf(F&& f, X0&& x0, Xs&&... xs) {
  using T = std::remove_cvref_t<X0>;
  static_assert((std::is_same_v<T, std::remove_cvref_t<Xs>> && ...));
  if constexpr (leaf<T>) {
    f(x0, xs...);
  } else if constexpr (is_std_tuple_like<T>::value) {
    auto one = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
      for_each_leaf(f, std::get<J>(x0), std::get<J>(xs)...);
    };
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (one(std::integral_constant<std::size_t, I>{}), ...);
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (is_hana_tuple<T>::value) {
    constexpr std::size_t n = decltype(boost::hana::length(x0))::value;
    auto one = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
      for_each_leaf(f, boost::hana::at_c<J>(x0), boost::hana::at_c<J>(xs)...);
    };
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (one(std::integral_constant<std::size_t, I>{}), ...);
    }(std::make_index_sequence<n>{});
  } else if constexpr (is_hana_struct<T>) {
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto pair) {
      auto get = boost::hana::second(pair);
      for_each_leaf(f, get(x0), get(xs)...);
    });
  } else {
    static_assert(nest<T>, "mirror: not a nest (see mirror/concepts/nest.hpp)");
  }
}

template <class... Ts>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ts);
};

template <class... Ls>
struct concat;
template <>
struct concat<> {
  using type = type_list<>;
};
template <class... As>
struct concat<type_list<As...>> {
  using type = type_list<As...>;
};
template <class... As, class... Bs, class... Rest>
struct concat<type_list<As...>, type_list<Bs...>, Rest...> {
  using type = typename concat<type_list<As..., Bs...>, Rest...>::type;
};

template <class S>
auto struct_member_types() {
  return boost::hana::unpack(boost::hana::accessors<S>(), [](auto... pairs) {
    return type_list<std::remove_cvref_t<decltype(boost::hana::second(pairs)(std::declval<S&>()))>...>{};
  });
}

template <class T>
struct leaf_types;

template <class L>
struct leaf_types_of_list;
template <class... Ts>
struct leaf_types_of_list<type_list<Ts...>> {
  using type = typename concat<typename leaf_types<Ts>::type...>::type;
};

template <class T, class Seq>
struct std_elements;
template <class T, std::size_t... I>
struct std_elements<T, std::index_sequence<I...>> {
  using type = type_list<std::remove_cvref_t<std::tuple_element_t<I, T>>...>;
};

/// The leaf types of nest type T, in traversal order (with repeats).
template <class T>
struct leaf_types {
  static auto pick() {
    if constexpr (leaf<T>) {
      return type_list<T>{};
    } else if constexpr (is_std_tuple_like<T>::value) {
      return typename leaf_types_of_list<
          typename std_elements<T, std::make_index_sequence<std::tuple_size_v<T>>>::type>::type{};
    } else if constexpr (is_hana_tuple<T>::value) {
      return []<class... Ts>(boost::hana::tuple<Ts...>*) {
        return typename leaf_types_of_list<type_list<std::remove_cvref_t<Ts>...>>::type{};
      }(static_cast<T*>(nullptr));
    } else if constexpr (is_hana_struct<T>) {
      return typename leaf_types_of_list<decltype(struct_member_types<T>())>::type{};
    } else {
      return type_list<>{};
    }
  }
  using type = decltype(pick());
};
template <class T>
using leaf_types_t = typename leaf_types<T>::type;

template <class L, class T>
struct append_unique;
template <class... Ts, class T>
struct append_unique<type_list<Ts...>, T> {
  using type = std::conditional_t<(std::is_same_v<T, Ts> || ...), type_list<Ts...>, type_list<Ts..., T>>;
};
template <class Acc, class L>
struct unique_elements;
template <class Acc>
struct unique_elements<Acc, type_list<>> {
  using type = Acc;
};
template <class Acc, class L0, class... Ls>
struct unique_elements<Acc, type_list<L0, Ls...>> {
  using type = typename unique_elements<typename append_unique<Acc, leaf_element_t<L0>>::type,
                                        type_list<Ls...>>::type;
};

/// The distinct element types of nest type T, in order of first appearance.
template <class T>
using element_types_t = typename unique_elements<type_list<>, leaf_types_t<T>>::type;

/// Number of leaves of nest type T, and how many of them have element type E.
template <class T, class E = void>
constexpr std::size_t leaf_count() {
  return []<class... Ls>(type_list<Ls...>) {
    return (std::size_t{0} + ... + (std::is_void_v<E> || std::is_same_v<leaf_element_t<Ls>, E> ? 1 : 0));
  }(leaf_types_t<T>{});
}

/// Calls f.template operator()<T>() for each T of a type_list.
template <class... Ts, class F>
constexpr void for_each_type(type_list<Ts...>, F&& f) {
  (f.template operator()<Ts>(), ...);
}

/// The elements of every leaf of element type E in a nest, in traversal order (one fused
/// collective per element type walks these).
template <class E, class N>
std::array<std::span<E>, leaf_count<N, E>()> leaves_of(N& nest) {
  std::array<std::span<E>, leaf_count<N, E>()> out{};
  std::size_t i = 0;
  for_each_leaf(
      [&](auto& l) {
        using L = std::remove_cvref_t<decltype(l)>;
        if constexpr (std::is_same_v<leaf_element_t<L>, E>) out[i++] = leaf_traits<L>::elements(l);
      },
      nest);
  return out;
}

}  // namespace mirror::detail
