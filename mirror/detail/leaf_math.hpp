// SPDX-License-Identifier: Apache-2.0
#pragma once
// Leaf-by-leaf arithmetic between two nests of one type, for variable updates. Shapes are
// checked for every leaf before any element changes, so an update is applied whole or not at all.

#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <cstddef>
#include <string>
#include <type_traits>
#include <mirror/detail/element_ops.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/host_reduce.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/detail/type_name.hpp>
#include <mirror/error.hpp>

namespace mirror::detail {

/// require_same_shape's error: leaf m.leaf of the value has m.second elements, the variable's
/// m.first.
[[noreturn]] MIRROR_DETAIL_INLINE void throw_variable_shape_error(const std::string& api, const shape_mismatch& m);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE void throw_variable_shape_error(const std::string& api, const shape_mismatch& m) {
  throw shape_error(format("%s: leaf %zu (%s) of the value has %zu elements but the variable's has %zu; a variable "
                           "keeps its shape",
                           api.c_str(), m.leaf, demangle(m.leaf_type).c_str(), m.second, m.first));
}
#endif

template <class T>
void require_same_shape(const T& have, const T& given, const std::string& api) {
  if (const shape_mismatch m = first_shape_mismatch(have, given)) throw_variable_shape_error(api, m);
}

enum class update_kind { assign, add, sub };

/// dst = src, dst += src or dst -= src, leaf by leaf (shapes already checked).
template <class T>
void apply_update(update_kind kind, T& dst, const T& src) {
  for_each_leaf(
      [&](auto& d, const auto& s) {
        using L = std::remove_cvref_t<decltype(d)>;
        using E = leaf_element_t<L>;
        const auto out = leaf_traits<L>::elements(d);
        const auto in = leaf_traits<L>::elements(s);
        switch (kind) {
          case update_kind::assign: std::copy(in.begin(), in.end(), out.begin()); break;
          case update_kind::add:
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<E>(out[i] + in[i]);
            break;
          case update_kind::sub:
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<E>(out[i] - in[i]);
            break;
        }
      },
      dst, src);
}

/// x /= n leaf by leaf, in the element type.
template <class T>
void divide_leaves(T& x, std::size_t n) {
  for_each_leaf(
      [&](auto& l) {
        const auto e = detail::elements_of(l);
        divide_all(e.data(), e.size(), n);
      },
      x);
}

template <class T>
consteval bool all_leaves_own() {
  return []<class... Ls>(type_list<Ls...>) { return (true && ... && !leaf_traits<Ls>::is_view); }(leaf_types_t<T>{});
}

/// True when some leaf of nest T lives in device memory (leaf_traits::device_resident).
template <class T>
consteval bool has_device_leaf() {
  return []<class... Ls>(type_list<Ls...>) { return (false || ... || device_resident_leaf<Ls>); }(leaf_types_t<T>{});
}

/// True when some leaf of nest T is resizable (leaf_traits::resizable: broadcast gives it the
/// source's size).
template <class T>
consteval bool has_resizable_leaf() {
  return []<class... Ls>(type_list<Ls...>) { return (false || ... || leaf_traits<Ls>::resizable); }(leaf_types_t<T>{});
}

template <class T>
consteval bool all_leaves_floating() {
  return []<class... Ls>(type_list<Ls...>) {
    return (true && ... && std::is_floating_point_v<leaf_element_t<Ls>>);
  }(leaf_types_t<T>{});
}

}  // namespace mirror::detail
