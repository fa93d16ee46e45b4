// SPDX-License-Identifier: Apache-2.0
#pragma once
// What every conformance suite of a test file shares: the (device, ops) pair the file names
// (CONFORMANCE_DEVICE, CONFORMANCE_OPS; see all_reduce_suite.hpp), the optional macros'
// defaults, and one strategy per replica count, made once and reused by every suite.

#include <array>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <mirror/mirror.hpp>
#include "support/reference.hpp"

#ifndef CONFORMANCE_SUPPORTS
#define CONFORMANCE_SUPPORTS(R) true
#endif
#ifndef CONFORMANCE_MEAN_IS_PREMUL_SUM
#define CONFORMANCE_MEAN_IS_PREMUL_SUM 0
#endif

namespace conformance {

using Device = CONFORMANCE_DEVICE;
using Ops = std::remove_cvref_t<decltype(CONFORMANCE_OPS)>;
using Strategy = mirror::Strategy<Device, Ops>;

/// The strategy of `replicas` replicas (1..16) for this file's pair.
inline Strategy& strategy_with(int replicas) {
  static std::array<std::unique_ptr<Strategy>, 17> cache;
  auto& s = cache[static_cast<std::size_t>(replicas)];
  if (!s) s = std::make_unique<Strategy>(mirror::test::make_device<Device>(replicas), CONFORMANCE_OPS);
  return *s;
}

}  // namespace conformance
