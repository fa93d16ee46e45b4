// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the batch split of distribute_dataset (mirror/distributed_dataset.hpp) for
// random global batch sizes G (ragged steps included), workers W, this worker's index w, replicas
// per worker R, and leaf shapes (vectors, matrices of 1-6 columns, nests of both), against
// TensorFlow's split rule (docs/guide.md#input, docs/multi-worker.md#input), written here from the
// rule: of G rows over N = W*R global replicas the first G mod N get one row more, each replica's
// rows follow the previous replica's, worker w keeps global replicas w*R .. w*R+R-1, and iteration
// ends at the range's end or at a batch with no rows. A matrix whose element count is not a whole
// number of rows is a shape_error (issue 33), as are leaves of one batch with different row counts.
//
// Oracle: every replica's view is exactly its rows (pointers into the global batch, the right
// count, the matrix's columns), the views of one step cover the worker's part of the batch with
// no row lost or repeated, and the number of steps is right. Anything else is a finding.
//
//   tests/fuzz/run_fuzz.sh split SECONDS
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <tuple>
#include <vector>
#include <mirror/distributed_dataset.hpp>

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "split_fuzz: %s\n", what);
  std::abort();
}

/// Reads small numbers off the input; zeros once it runs out.
struct reader {
  const std::uint8_t* p;
  std::size_t n;
  unsigned take(unsigned bound) {  // 0 .. bound - 1
    if (n == 0 || bound == 0) return 0;
    const unsigned v = *p;
    ++p;
    --n;
    return v % bound;
  }
};

/// Global replica g's first row and row count of a batch of `rows`, from the rule.
std::pair<std::size_t, std::size_t> expected_rows(std::size_t rows, int N, int g) {
  std::size_t first = 0;
  for (int i = 0; i < g; ++i) first += rows / static_cast<std::size_t>(N) + (static_cast<std::size_t>(i) < rows % static_cast<std::size_t>(N) ? 1 : 0);
  const std::size_t count = rows / static_cast<std::size_t>(N) + (static_cast<std::size_t>(g) < rows % static_cast<std::size_t>(N) ? 1 : 0);
  return {first, count};
}

// A view (span or matrix_view) against the global leaf: the rows [first, first + count).
template <class V, class L>
void check_view(const V& view, const L& leaf, std::size_t first, std::size_t count) {
  if constexpr (requires { view.cols; }) {
    if (view.cols != leaf.cols) finding("a matrix view lost its columns");
    if (view.rows() != count || view.data.size() != count * leaf.cols) finding("a matrix view has the wrong rows");
    if (count > 0 && view.data.data() != leaf.data.data() + first * leaf.cols) finding("a matrix view starts at the wrong row");
  } else {
    if (view.size() != count) finding("a view has the wrong number of rows");
    if (count > 0 && view.data() != leaf.data() + first) finding("a view starts at the wrong row");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, size};
  const int W = 1 + static_cast<int>(in.take(4));
  const int w = static_cast<int>(in.take(static_cast<unsigned>(W)));
  const int R = 1 + static_cast<int>(in.take(8));
  const int N = W * R;
  const unsigned shape = in.take(3);       // 0: vector, 1: matrix, 2: tuple of both
  const std::size_t cols = in.take(7);     // 0 .. 6 (0: no columns)
  const unsigned steps = 1 + in.take(4);
  const bool ragged = in.take(2) != 0;     // the matrix holds a partial row
  using Batch = std::tuple<std::vector<int>, mirror::matrix<float>>;
  std::vector<std::vector<int>> vectors;
  std::vector<mirror::matrix<float>> matrices;
  std::vector<Batch> tuples;
  std::vector<std::size_t> rows;
  for (unsigned k = 0; k < steps; ++k) {
    const std::size_t G = in.take(4) == 0 ? in.take(256) : in.take(3 * static_cast<unsigned>(N) + 2);
    rows.push_back(G);
    std::vector<int> v(G);
    for (std::size_t i = 0; i < G; ++i) v[i] = static_cast<int>(i);
    mirror::matrix<float> m{std::vector<float>(G * cols + (ragged && cols > 1 ? 1 : 0), 1.0f), cols};
    vectors.push_back(v);
    matrices.push_back(m);
    tuples.emplace_back(v, m);
  }
  // What the rule says iteration gives, batch by batch: a shape_error at the first batch whose
  // matrix holds a partial row or whose leaves disagree on their rows; else a step per batch up
  // to the first one with no rows.
  const bool has_vector = shape != 1, has_matrix = shape != 0;
  std::size_t expected_steps = 0;
  bool expected_error = false;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const std::size_t elements = matrices[k].data.size();
    const bool partial = cols == 0 ? elements != 0 : elements % cols != 0;
    const std::size_t matrix_rows = cols == 0 ? 0 : elements / cols;
    if (has_matrix && partial) {
      expected_error = true;
      break;
    }
    if (has_vector && has_matrix && matrix_rows != rows[k]) {
      expected_error = true;
      break;
    }
    const std::size_t batch_rows = has_vector ? rows[k] : matrix_rows;
    if (batch_rows == 0) break;
    ++expected_steps;
  }

  // What DistributedDataset does at each step (its advance()): the batch's rows
  // (detail::batch_rows, which checks the leaves), the end at a batch with no rows, and each
  // local replica's views (detail::split_batch). (The iterator itself is not compiled here:
  // clang before 16 cannot instantiate libstdc++ 12's std::ranges::view_interface, which its
  // range wrappers derive from; tests/mirror/distributed_dataset_test.cpp runs it.)
  auto walk = [&](const auto& batches, auto&& check_step) {
    using B = typename std::remove_cvref_t<decltype(batches)>::value_type;
    std::size_t step = 0;
    bool threw = false;
    try {
      for (const B& batch : batches) {
        const std::size_t G = mirror::detail::batch_rows(batch);
        if (G == 0) break;
        if (step >= expected_steps) finding("more steps than the rule gives");
        if (G != rows[step]) finding("batch_rows is not the leaves' rows");
        std::vector<mirror::detail::batch_view_t<B>> per_replica;
        for (int r = 0; r < R; ++r) per_replica.push_back(mirror::detail::split_batch(batch, G, N, w * R + r));
        check_step(per_replica, step);
        ++step;
      }
    } catch (const mirror::shape_error&) {
      threw = true;
    }
    if (threw != expected_error) finding(threw ? "a shape_error for a well-formed batch" : "a malformed batch was split");
    if (step != expected_steps) finding("wrong number of steps");
  };

  auto each_replica = [&](std::size_t step, auto&& f) {
    for (int r = 0; r < R; ++r) {
      const auto [first, count] = expected_rows(rows[step], N, w * R + r);
      f(r, first, count);
    }
  };

  if (shape == 0) {
    walk(vectors, [&](const auto& pr, std::size_t step) {
      std::size_t covered = 0;
      each_replica(step, [&](int r, std::size_t first, std::size_t count) {
        check_view(pr[static_cast<std::size_t>(r)], vectors[step], first, count);
        for (std::size_t i = 0; i < count; ++i) {
          if (pr[static_cast<std::size_t>(r)][i] != static_cast<int>(first + i)) finding("a row's value moved");
        }
        covered += count;
      });
      std::size_t part = 0;
      for (int r = 0; r < R; ++r) part += expected_rows(rows[step], N, w * R + r).second;
      if (covered != part) finding("the worker's rows are not covered");
    });
  } else if (shape == 1) {
    walk(matrices, [&](const auto& pr, std::size_t step) {
      each_replica(step, [&](int r, std::size_t first, std::size_t count) {
        check_view(pr[static_cast<std::size_t>(r)], matrices[step], first, count);
      });
    });
  } else {
    walk(tuples, [&](const auto& pr, std::size_t step) {
      each_replica(step, [&](int r, std::size_t first, std::size_t count) {
        check_view(std::get<0>(pr[static_cast<std::size_t>(r)]), std::get<0>(tuples[step]), first, count);
        check_view(std::get<1>(pr[static_cast<std::size_t>(r)]), std::get<1>(tuples[step]), first, count);
      });
    });
  }
  return 0;
}
