// SPDX-License-Identifier: Apache-2.0
#pragma once
// The model of the elastic tests (tests/mpi/elastic_test.cpp, tests/fault/elastic_kill.cpp): a
// training whose every operation is exact in any order of reduction (integer arithmetic), so
// that a serial replay owes nothing to how many workers reduced each step. Step k consumes global
// batch k of `batch` rows; each row's gradient depends on the parameters, so a lost or repeated
// row, a lost or repeated step, or a step applied on some workers only changes the result.

#include <cstdint>
#include <vector>

namespace elastic_model {

inline constexpr int params = 8;

struct model {
  std::vector<std::int64_t> p = std::vector<std::int64_t>(params, 1);
  std::int64_t rows_seen = 0;  // every row of every committed step, once
};

inline std::int64_t row_gradient(const std::vector<std::int64_t>& p, std::int64_t step, std::int64_t row, int k) {
  const std::int64_t x = (step * 7919 + row * 104729) % 1000003;
  return ((p[static_cast<std::size_t>(k)] * 31 + x * (k + 1)) % 1009) - 504;
}

/// Rows [first, last) of global batch `step`: their gradients summed, then the row count.
inline std::vector<std::int64_t> rows_gradient(const model& m, std::int64_t step, std::int64_t first, std::int64_t last) {
  std::vector<std::int64_t> g(params + 1, 0);
  for (std::int64_t row = first; row < last; ++row) {
    for (int k = 0; k < params; ++k) g[static_cast<std::size_t>(k)] += row_gradient(m.p, step, row, k);
  }
  g[params] = last - first;
  return g;
}

/// One step's update from the summed gradient of its rows (rows_gradient's layout).
inline void apply_step(model& m, const std::vector<std::int64_t>& g) {
  for (int k = 0; k < params; ++k) {
    auto& v = m.p[static_cast<std::size_t>(k)];
    v = (v * 3 + g[static_cast<std::size_t>(k)]) % 2147483647;
  }
  m.rows_seen += g[params];
}

/// `steps` steps on one process.
inline model replay(std::int64_t steps, int batch) {
  model m;
  for (std::int64_t step = 0; step < steps; ++step) apply_step(m, rows_gradient(m, step, 0, batch));
  return m;
}

}  // namespace elastic_model
