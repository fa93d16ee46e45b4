// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::axis_t<N>` and `mirror::axis0`: the spelling of "also reduce this dimension".

namespace mirror {

/// A tag naming a dimension of a leaf. Only the leading (batch) dimension, `axis_t<0>`, exists.
template <int N>
struct axis_t {
  static_assert(N == 0, "mirror::axis_t<N>: only the leading (batch) axis, mirror::axis0, is supported");
};

/// `strategy.reduce(op, value, mirror::axis0)` also reduces the leading dimension of every leaf.
inline constexpr axis_t<0> axis0{};

}  // namespace mirror
