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
#include <typeinfo>
#include <utility>

namespace mirror::detail {

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

// ---- leaf paths: how to reach each leaf of a nest type from its root ----
//
// for_each_leaf used to recurse through the nest, once per visitor: every call site's lambda
// instantiated the walk (and Hana's for_each machinery) again for every node type. The paths
// below are computed once per nest type; a visit is then one fold expression over them.

/// One step down: element I of a std::tuple, std::pair or std::array.
template <std::size_t I>
struct std_step {
  template <class X>
  static constexpr decltype(auto) get(X& x) {
    return std::get<I>(x);
  }
};
/// One step down: element I of a boost::hana::tuple.
template <std::size_t I>
struct hana_tuple_step {
  template <class X>
  static constexpr decltype(auto) get(X& x) {
    return boost::hana::at_c<I>(x);
  }
};
/// One step down: member I (declaration order) of a Hana struct S.
template <class S, std::size_t I>
struct hana_member_step {
  template <class X>
  static constexpr decltype(auto) get(X& x) {
    return boost::hana::second(boost::hana::at_c<I>(boost::hana::accessors<S>()))(x);
  }
};

/// The steps from a nest's root to one of its leaves.
template <class... Steps>
struct leaf_path;
template <>
struct leaf_path<> {
  template <class X>
  static constexpr X& get(X& x) {
    return x;
  }
};
// Paths of up to three steps in one function each (a nest three levels deep, the usual depth,
// then compiles one function per path and constness instead of one per suffix of the path);
// deeper paths take three steps at a time.
template <class A>
struct leaf_path<A> {
  template <class X>
  static constexpr decltype(auto) get(X& x) {
    return A::get(x);
  }
};
template <class A, class B>
struct leaf_path<A, B> {
  template <class X>
  static constexpr decltype(auto) get(X& x) {
    return B::get(A::get(x));
  }
};
template <class A, class B, class C, class... Rest>
struct leaf_path<A, B, C, Rest...> {
  template <class X>
  static constexpr decltype(auto) get(X& x) {
    if constexpr (sizeof...(Rest) == 0) {
      return C::get(B::get(A::get(x)));
    } else {
      return leaf_path<Rest...>::get(C::get(B::get(A::get(x))));
    }
  }
};

template <class Step, class Paths>
struct prepend_step;
template <class Step, class... Paths>
struct prepend_step<Step, type_list<Paths...>> {
  template <class P>
  struct one;
  template <class... Steps>
  struct one<leaf_path<Steps...>> {
    using type = leaf_path<Step, Steps...>;
  };
  using type = type_list<typename one<Paths>::type...>;
};

template <class T>
struct leaf_paths;
template <class T>
using leaf_paths_t = typename leaf_paths<T>::type;

/// The paths to the leaves of nest type T, depth first, in declaration order.
template <class T>
struct leaf_paths {
  static auto pick() {
    if constexpr (leaf<T>) {
      return type_list<leaf_path<>>{};
    } else if constexpr (is_std_tuple_like<T>::value) {
      return []<std::size_t... I>(std::index_sequence<I...>) {
        return typename concat<typename prepend_step<
            std_step<I>, leaf_paths_t<std::remove_cvref_t<std::tuple_element_t<I, T>>>>::type...>::type{};
      }(std::make_index_sequence<std::tuple_size_v<T>>{});
    } else if constexpr (is_hana_tuple<T>::value) {
      return []<class... Ts>(boost::hana::tuple<Ts...>*) {
        return []<std::size_t... I>(std::index_sequence<I...>) {
          return typename concat<typename prepend_step<
              hana_tuple_step<I>, leaf_paths_t<std::remove_cvref_t<Ts>>>::type...>::type{};
        }(std::index_sequence_for<Ts...>{});
      }(static_cast<T*>(nullptr));
    } else if constexpr (is_hana_struct<T>) {
      return []<class... Ms>(type_list<Ms...>) {
        return []<std::size_t... I>(std::index_sequence<I...>) {
          return typename concat<typename prepend_step<hana_member_step<T, I>, leaf_paths_t<Ms>>::type...>::type{};
        }(std::index_sequence_for<Ms...>{});
      }(struct_member_types<T>());
    } else {
      static_assert(nest<T>, "mirror: not a nest (see mirror/concepts/nest.hpp)");
      return type_list<>{};
    }
  }
  using type = decltype(pick());
};

// One nest and two nests in lockstep (the common cases) are one fold each; more go through a
// helper per path.
template <class F, class... Paths, class X0>
constexpr void visit_leaf_paths(type_list<Paths...>, F& f, X0& x0) {
  (static_cast<void>(f(Paths::get(x0))), ...);
}
template <class F, class... Paths, class X0, class X1>
constexpr void visit_leaf_paths(type_list<Paths...>, F& f, X0& x0, X1& x1) {
  (static_cast<void>(f(Paths::get(x0), Paths::get(x1))), ...);
}
template <class Path, class F, class... Xs>
constexpr void visit_leaf_path(F& f, Xs&... xs) {
  f(Path::get(xs)...);
}
template <class F, class... Paths, class X0, class X1, class X2, class... Xs>
constexpr void visit_leaf_paths(type_list<Paths...>, F& f, X0& x0, X1& x1, X2& x2, Xs&... xs) {
  (visit_leaf_path<Paths>(f, x0, x1, x2, xs...), ...);
}

/// Calls `f(leaf_of_x0, leaf_of_x1, ...)` for every leaf position of the nests `xs` (all of one
/// type, each possibly const), depth first, in declaration order.
template <class F, class X0, class... Xs>
constexpr void for_each_leaf(F&& f, X0&& x0, Xs&&... xs) {
  using T = std::remove_cvref_t<X0>;
  static_assert((std::is_same_v<T, std::remove_cvref_t<Xs>> && ...));
  visit_leaf_paths(leaf_paths_t<T>{}, f, x0, xs...);
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

/// The type of each leaf of nest type T, in traversal order (and a null end): what error
/// messages name leaves by. A constant table; built by an initialised static it cost a guard
/// and a lambda per nest type.
template <class L>
struct type_info_table;
template <class... Ls>
struct type_info_table<type_list<Ls...>> {
  static constexpr const std::type_info* value[] = {&typeid(Ls)..., nullptr};
};
template <class T>
inline constexpr const std::type_info* const* leaf_type_infos = type_info_table<leaf_types_t<T>>::value;

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

/// The elements of one leaf, its type deduced: `leaf_traits<L>::elements(leaf)`.
template <class L>
constexpr auto elements_of(L& leaf) noexcept(noexcept(leaf_traits<std::remove_const_t<L>>::elements(leaf))) {
  return leaf_traits<std::remove_const_t<L>>::elements(leaf);
}

/// Calls f.template operator()<T>() for each T of a type_list.
template <class... Ts, class F>
constexpr void for_each_type(type_list<Ts...>, F&& f) {
  (f.template operator()<Ts>(), ...);
}

/// The elements of every leaf of element type E in a nest, in traversal order (one fused
/// collective per element type walks these): `std::span<E>`s, or `std::span<const E>`s of a
/// const nest (the inputs of a collective that only reads them).
template <class E, class N>
auto leaves_of(N& nest) {
  using S = std::conditional_t<std::is_const_v<N>, const E, E>;
  std::array<std::span<S>, leaf_count<std::remove_const_t<N>, E>()> out{};
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
