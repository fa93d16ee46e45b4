// SPDX-License-Identifier: Apache-2.0
// ODR check (style.md, convention 9): odr_a.cpp and odr_b.cpp both include the umbrella
// header and link into one binary; a non-inline definition in a header fails the link.
#include <mirror/mirror.hpp>

int odr_a() { return static_cast<int>(mirror::ReduceOp::sum); }
