// SPDX-License-Identifier: Apache-2.0
// ODR check: the twin of odr_a.cpp (see there).
#include <mirror/mirror.hpp>

int odr_b() { return static_cast<int>(mirror::ReduceOp::sum); }
