// SPDX-License-Identifier: Apache-2.0
// ODR check: links odr_a.cpp and odr_b.cpp, which both include <mirror/mirror.hpp>.
int odr_a();
int odr_b();

int main() { return odr_a() == odr_b() ? 0 : 1; }
