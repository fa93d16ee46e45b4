// SPDX-License-Identifier: Apache-2.0
#pragma once
// How Strategy::run types its result: T → PerReplica<T>, Synced<T> → Mirrored<T>, and a tuple
// (std::tuple, std::pair, boost::hana::tuple) element by element.

#include <boost/hana/at.hpp>
#include <boost/hana/tuple.hpp>
#include <cstddef>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>
#include <mirror/detail/access.hpp>

namespace mirror::detail {

template <class T>
struct lift_one {
  using type = PerReplica<T>;
  static type make(std::vector<T>&& v) { return type(std::move(v)); }
};
template <class T>
struct lift_one<Synced<T>> {
  using type = Mirrored<T>;
  static type make(std::vector<Synced<T>>&& v) {
    std::vector<T> copies;
    copies.reserve(v.size());
    for (auto& s : v) copies.push_back(access::unwrap(std::move(s)));
    return access::mirrored(std::move(copies));
  }
};

template <class R>
struct run_result : lift_one<R> {
  /// Moves replica r's results (all engaged) into the lifted value.
  static typename lift_one<R>::type assemble(std::vector<std::optional<R>>& slots) {
    std::vector<R> v;
    v.reserve(slots.size());
    for (auto& s : slots) v.push_back(std::move(*s));
    return lift_one<R>::make(std::move(v));
  }
};

/// Synced<T> results go straight into the Mirrored<T>'s copies (no vector of Synced<T> between).
template <class T>
struct run_result<Synced<T>> {
  using type = Mirrored<T>;
  static type assemble(std::vector<std::optional<Synced<T>>>& slots) {
    std::vector<T> copies;
    copies.reserve(slots.size());
    for (auto& s : slots) copies.push_back(access::unwrap(std::move(*s)));
    return access::mirrored(std::move(copies));
  }
};

template <template <class...> class Tuple, class... Ts>
struct tuple_run_result {
  using type = Tuple<typename lift_one<Ts>::type...>;
  template <std::size_t I, class Get>
  static auto column(std::vector<std::optional<Tuple<Ts...>>>& slots, Get get) {
    using E = std::remove_cvref_t<decltype(get(std::declval<Tuple<Ts...>&>()))>;
    std::vector<E> v;
    v.reserve(slots.size());
    for (auto& s : slots) v.push_back(std::move(get(*s)));
    return lift_one<E>::make(std::move(v));
  }
};

template <class... Ts>
struct run_result<std::tuple<Ts...>> : tuple_run_result<std::tuple, Ts...> {
  static auto assemble(std::vector<std::optional<std::tuple<Ts...>>>& slots) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<typename lift_one<Ts>::type...>(
          tuple_run_result<std::tuple, Ts...>::template column<I>(slots, [](auto& t) -> auto& { return std::get<I>(t); })...);
    }(std::index_sequence_for<Ts...>{});
  }
};
template <class A, class B>
struct run_result<std::pair<A, B>> : tuple_run_result<std::pair, A, B> {
  static auto assemble(std::vector<std::optional<std::pair<A, B>>>& slots) {
    using base = tuple_run_result<std::pair, A, B>;
    return std::pair<typename lift_one<A>::type, typename lift_one<B>::type>(
        base::template column<0>(slots, [](auto& t) -> auto& { return t.first; }),
        base::template column<1>(slots, [](auto& t) -> auto& { return t.second; }));
  }
};
template <class... Ts>
struct run_result<boost::hana::tuple<Ts...>> : tuple_run_result<boost::hana::tuple, Ts...> {
  static auto assemble(std::vector<std::optional<boost::hana::tuple<Ts...>>>& slots) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return boost::hana::tuple<typename lift_one<Ts>::type...>(
          tuple_run_result<boost::hana::tuple, Ts...>::template column<I>(
              slots, [](auto& t) -> auto& { return boost::hana::at_c<I>(t); })...);
    }(std::index_sequence_for<Ts...>{});
  }
};

}  // namespace mirror::detail
