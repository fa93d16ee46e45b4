// SPDX-License-Identifier: Apache-2.0
#pragma once
// The parts of <ranges> mirror uses, without the rest: the range concepts and accessors
// (std::ranges::input_range, iterator_t, begin, size, ...), std::ranges::view_interface, and
// detail::all, views::all's rule for keeping a range. <ranges> adds every view adaptor (split,
// join, zip, iota, ...), which mirror never names (docs/design.md#compile-time). libstdc++ keeps
// the concepts and accessors in <bits/ranges_base.h> (which its <span> and <string_view> include
// anyway) and view_interface in <bits/ranges_util.h>. Other standard libraries get <ranges>. A
// program that uses std::views includes <ranges> itself.

#include <version>

#if defined(__GLIBCXX__) && __has_include(<bits/ranges_base.h>) && __has_include(<bits/ranges_util.h>)
#include <compare>   // what the internal headers need first, as <ranges> includes them
#include <iterator>
#include <bits/ranges_base.h>
#include <bits/ranges_util.h>
#else
#include <ranges>
#endif
#include <concepts>
#include <type_traits>
#include <utility>

namespace mirror::detail {

/// A view of an lvalue range that lives elsewhere (std::ranges::ref_view's role).
template <std::ranges::range R>
  requires std::is_object_v<R>
class range_ref : public std::ranges::view_interface<range_ref<R>> {
 public:
  constexpr explicit range_ref(R& range) noexcept : range_(&range) {}
  constexpr std::ranges::iterator_t<R> begin() const { return std::ranges::begin(*range_); }
  constexpr std::ranges::sentinel_t<R> end() const { return std::ranges::end(*range_); }
  constexpr auto size() const
    requires std::ranges::sized_range<R>
  {
    return std::ranges::size(*range_);
  }

 private:
  R* range_;
};

/// A view that owns an rvalue range moved into it (std::ranges::owning_view's role): move-only,
/// so the range is never copied behind the user's back.
template <std::ranges::range R>
  requires std::movable<R> && std::is_object_v<R>
class range_owner : public std::ranges::view_interface<range_owner<R>> {
 public:
  constexpr explicit range_owner(R&& range) noexcept(std::is_nothrow_move_constructible_v<R>)
      : range_(std::move(range)) {}
  range_owner(range_owner&&) = default;
  range_owner& operator=(range_owner&&) = default;

  constexpr auto begin() { return std::ranges::begin(range_); }
  constexpr auto end() { return std::ranges::end(range_); }
  constexpr auto begin() const
    requires std::ranges::range<const R>
  {
    return std::ranges::begin(range_);
  }
  constexpr auto end() const
    requires std::ranges::range<const R>
  {
    return std::ranges::end(range_);
  }
  constexpr auto size()
    requires std::ranges::sized_range<R>
  {
    return std::ranges::size(range_);
  }
  constexpr auto size() const
    requires std::ranges::sized_range<const R>
  {
    return std::ranges::size(range_);
  }

 private:
  R range_;
};

/// std::views::all's rule: a view is copied (or moved), an lvalue range is referenced, an
/// rvalue range is moved into a view that owns it.
template <std::ranges::viewable_range R>
constexpr auto all(R&& range) {
  if constexpr (std::ranges::view<std::decay_t<R>>) {
    return std::decay_t<R>(std::forward<R>(range));
  } else if constexpr (std::is_lvalue_reference_v<R>) {
    return range_ref<std::remove_reference_t<R>>(range);
  } else {
    return range_owner<std::remove_cvref_t<R>>(std::move(range));
  }
}

/// The view detail::all(R) returns.
template <std::ranges::viewable_range R>
using all_t = decltype(detail::all(std::declval<R>()));

}  // namespace mirror::detail
