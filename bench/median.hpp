// SPDX-License-Identifier: Apache-2.0
#pragma once
// The median the benchmark programs outside Google Benchmark report (their own repetitions).
#include <algorithm>
#include <cstddef>
#include <vector>

namespace bench {

/// The median of `v` (the mean of the middle two for an even count); `v` must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace bench
