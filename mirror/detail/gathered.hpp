// SPDX-License-Identifier: Apache-2.0
#pragma once
// The type all_gather and gather return for a nest: the same nest, with each leaf replaced by one
// that can hold every replica's leaves one after another (docs/guide.md#collectives-inside-run). A
// scalar or std::array leaf becomes a std::vector; std::vector and mirror::matrix stay. Views
// cannot grow, and a Hana struct cannot change a member's type: those nests have no gathered type.

#include <array>
#include <boost/hana/tuple.hpp>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <mirror/concepts/nest.hpp>
#include <mirror/leaf_traits.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/detail/type_name.hpp>

namespace mirror::detail {

/// Whether L is a std::span of a fixed extent (it cannot view a cut of another length).
template <class L>
struct is_fixed_extent_span : std::false_type {};
template <class E, std::size_t Extent>
struct is_fixed_extent_span<std::span<E, Extent>> : std::bool_constant<Extent != std::dynamic_extent> {};

/// No gathered type (see the file comment); all_gather's static_assert names the fix.
struct not_gatherable {};

template <class T>
struct gathered;
template <class T>
using gathered_t = typename gathered<std::remove_cvref_t<T>>::type;

template <class... Ts>
std::tuple<gathered_t<Ts>...> gathered_std(std::tuple<Ts...>*);
template <class A, class B>
std::pair<gathered_t<A>, gathered_t<B>> gathered_std(std::pair<A, B>*);
template <class X, std::size_t N>
std::array<gathered_t<X>, N> gathered_std(std::array<X, N>*);

template <class T>
auto gathered_pick() {
  if constexpr (leaf<T>) {
    using L = leaf_traits<T>;
    if constexpr (L::rank == 0 || (!L::resizable && !L::is_view && L::rank == 1)) {
      return std::vector<typename L::element_type>{};  // a scalar or a fixed-size array
    } else if constexpr (L::resizable) {
      return T{};  // std::vector, mirror::matrix
    } else {
      return not_gatherable{};  // a view: the span form of all_gather
    }
  } else if constexpr (is_std_tuple_like<T>::value) {
    return gathered_std(static_cast<T*>(nullptr));
  } else if constexpr (is_hana_tuple<T>::value) {
    return []<class... Ts>(boost::hana::tuple<Ts...>*) {
      return boost::hana::tuple<gathered_t<Ts>...>{};
    }(static_cast<T*>(nullptr));
  } else {
    // A Hana struct keeps its type: every leaf must already be one that grows.
    constexpr bool all_grow = []<class... Ls>(type_list<Ls...>) {
      return (true && ... && (leaf_traits<Ls>::resizable && leaf_traits<Ls>::rank >= 1));
    }(leaf_types_t<T>{});
    if constexpr (all_grow) {
      return T{};
    } else {
      return not_gatherable{};
    }
  }
}

template <class T>
struct gathered {
  using type = decltype(gathered_pick<T>());
};

/// Whether nest T has a gathered type: no view leaf, no Hana struct holding a leaf that cannot grow.
template <class T>
constexpr bool gatherable() {
  using G = gathered_t<T>;
  if constexpr (std::is_same_v<G, not_gatherable>) {
    return false;
  } else {
    return []<class... Ls>(type_list<Ls...>) {
      return (true && ... && !std::is_same_v<Ls, not_gatherable>);
    }(leaf_types_t<G>{}) && leaf_count<G>() == leaf_count<T>();
  }
}

}  // namespace mirror::detail

namespace mirror::detail {

/// Elements per row of a leaf: a matrix's columns, 1 for every other leaf (its first dimension
/// is its elements). all_gather concatenates rows, so this must agree across replicas.
template <class L>
std::size_t row_width(const L& l) noexcept {
  if constexpr (requires { l.cols; }) {
    return l.cols;
  } else {
    return 1;
  }
}

/// Sizes a gathered leaf for `total` elements of rows `width` wide.
template <class G>
void size_gathered(G& out, std::size_t total, std::size_t width) {
  if constexpr (requires { out.cols; }) {
    out.cols = width;
    out.data.resize(total);
  } else {
    out.resize(total);
  }
}

/// The positions (in traversal order) of the leaves of nest type T whose element type is E.
template <class T, class E>
constexpr std::array<std::size_t, leaf_count<T, E>()> leaf_positions() {
  std::array<std::size_t, leaf_count<T, E>()> out{};
  [&]<class... Ls>(type_list<Ls...>) {
    std::size_t i = 0, j = 0;
    ((std::is_same_v<leaf_element_t<Ls>, E> ? (out[j++] = i, ++i) : ++i), ...);
  }(leaf_types_t<T>{});
  return out;
}

/// Strategy::gather's local step: every component's leaves concatenated in replica order into
/// one nest (a scalar or std::array leaf becomes a vector). Rows of a component that are not as
/// wide as the first component's set `problem` to the message (not thrown: on a multi-worker
/// strategy every worker must learn of it in the cross-worker step, and throw together);
/// `first_replica` is the global id of components[0]'s replica.
template <class T>
gathered_t<T> gather_components(std::span<const T> components, int first_replica, std::string& problem) {
  using G = gathered_t<T>;
  constexpr std::size_t K = leaf_count<T>();
  std::array<std::size_t, K> totals{}, widths{};
  for (std::size_t r = 0; r < components.size(); ++r) {
    std::size_t k = 0;
    for_each_leaf(
        [&](const auto& l) {
          const std::size_t w = row_width(l);
          if (r == 0) widths[k] = w;
          if (w != widths[k] && problem.empty()) {
            problem = format("mirror::Strategy::gather(value, axis0): leaf %zu (%s) has rows of %zu elements on "
                             "replica %d but of %zu on replica %d; gather concatenates along the first dimension "
                             "only, so every replica's rows must be equally wide",
                             k, type_name<std::remove_cvref_t<decltype(l)>>().c_str(), w,
                             first_replica + static_cast<int>(r), widths[k], first_replica)
                          .c_str();
          }
          totals[k++] += elements_of(l).size();
        },
        components[r]);
  }
  G out{};
  std::size_t k = 0;
  for_each_leaf([&](auto& o) { size_gathered(o, totals[k], widths[k]); ++k; }, out);
  // T and G differ where a scalar or std::array leaf became a vector, so the two nests are
  // walked apart: G's leaves first, as byte addresses, then each component's into them.
  std::array<unsigned char*, K> to{};
  k = 0;
  for_each_leaf([&](auto& o) { to[k++] = reinterpret_cast<unsigned char*>(elements_of(o).data()); }, out);
  for (const T& c : components) {
    k = 0;
    for_each_leaf(
        [&](const auto& l) {
          const auto from = elements_of(l);
          if (!from.empty()) std::memcpy(to[k], from.data(), from.size_bytes());
          to[k++] += from.size_bytes();
        },
        c);
  }
  return out;
}

}  // namespace mirror::detail
