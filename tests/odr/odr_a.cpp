// SPDX-License-Identifier: Apache-2.0
// ODR check (docs/design.md#tests): odr_a.cpp and odr_b.cpp both include the umbrella
// header, use the same parts of it and link into one binary; a non-inline definition in a
// header fails the link. Built twice: header-only (odr) and with MIRROR_SEPARATE_COMPILATION
// against libmirror_threads (odr_separate), where a definition compiled both in a program and
// in the library would fail the link too.
#include <mirror/mirror.hpp>

int odr_a() {
  mirror::Strategy<mirror::devices::Threads> strategy({.replicas = 2});
  const auto sum = strategy.run([](auto& ctx) { return ctx.all_reduce(mirror::ReduceOp::sum, 1.5f); });
  return static_cast<int>(sum.primary());  // 3
}
