// SPDX-License-Identifier: Apache-2.0
#pragma once
// What every guide program uses to compare a value with the one its page states: check(ok, what)
// prints what was wrong, and the program exits with `guide_result(name)`, 1 when a check failed.
#include <cstdio>

namespace guide {
inline int failures = 0;

inline void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

/// Prints whether every value was as documented; the program's exit status.
inline int result(const char* program) {
  std::printf("%s: %s\n", program, failures == 0 ? "every value as documented" : "WRONG VALUES");
  return failures == 0 ? 0 : 1;
}
}  // namespace guide
