// SPDX-License-Identifier: Apache-2.0
// ODR check: the twin of odr_a.cpp (see there).
#include <mirror/mirror.hpp>

int odr_b() {
  mirror::Strategy<mirror::devices::Threads> strategy({.replicas = 3});
  const auto sum = strategy.run([](auto& ctx) { return ctx.all_reduce(mirror::ReduceOp::sum, 1.0); });
  return static_cast<int>(sum.primary());  // 3
}
