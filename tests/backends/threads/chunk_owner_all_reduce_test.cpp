// SPDX-License-Identifier: Apache-2.0
// The conformance suites (tests/conformance/all_reduce_suite.hpp, gather_scatter_suite.hpp) for mirror::devices::Threads with mirror::ops::ChunkOwnerAllReduce{}.
#define CONFORMANCE_DEVICE mirror::devices::Threads
#define CONFORMANCE_OPS mirror::ops::ChunkOwnerAllReduce{}
#define CONFORMANCE_TAG "[threads][chunk_owner]"

#include "conformance/all_reduce_suite.hpp"
#include "conformance/gather_scatter_suite.hpp"

// The suite's element types are 4 and 8 bytes wide. The chunk-owner all-reduce moves bytes and
// calls each type's arithmetic through detail::element_kernels, so the widths it does not cover
// are checked here: 1 and 2 bytes (eight int8 fit the scalar path, 64 the one-line path) and
// long double (16 bytes, 16-aligned: never the scalar path). Two leaves of different lengths,
// so each leaf's byte offset in the packed line and in the chunks counts. Compared by value:
// long double has padding bytes that a bitwise comparison would read.
TEMPLATE_TEST_CASE("chunk owner: 1-, 2- and 16-byte elements equal a serial reference on every path",
                   "[threads][chunk_owner]", std::int8_t, std::uint16_t, long double) {
  using E = TestType;
  using Nest = std::tuple<std::vector<E>, std::vector<E>>;
  for (const int R : {2, 3, 7, 8}) {
    mirror::Strategy<mirror::devices::Threads, mirror::ops::ChunkOwnerAllReduce> s(
        mirror::test::make_device<mirror::devices::Threads>(R));
    // (first leaf, second leaf): a 2-byte scalar line, one cache line, several 8 KiB blocks,
    // and (8 replicas: 32 KiB blocks) several wide blocks of long double.
    const std::pair<std::size_t, std::size_t> shapes[] = {{1, 1}, {3, 1}, {2, 0}, {13, 7}, {5000, 3001}, {40000, 30001}};
    for (const auto& [n1, n2] : shapes) {
      for (const auto op : mirror::test::all_ops) {
        CAPTURE(R, n1, n2, mirror::to_string(op));
        const std::vector<E> expected = mirror::test::serial_reference<E>(op, R, n1 + n2);
        std::vector<Nest> inputs;
        for (int r = 0; r < R; ++r) {
          const std::vector<E> v = mirror::test::input_vector<E>(op, r, n1 + n2);
          inputs.emplace_back(std::vector<E>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n1)),
                              std::vector<E>(v.begin() + static_cast<std::ptrdiff_t>(n1), v.end()));
        }
        std::atomic<int> wrong{0};
        s.run([&](auto& ctx) {
          const auto out = ctx.all_reduce(op, inputs[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]);
          std::vector<E> got = std::get<0>(*out);
          got.insert(got.end(), std::get<1>(*out).begin(), std::get<1>(*out).end());
          if (got != expected) ++wrong;
        });
        REQUIRE(wrong == 0);
      }
    }
  }
}

// The suite's inputs are small integers, exact in any order of addition. Sums of 3 or more
// replicas read the other replicas side by side (detail::sum_many); with floats of mixed
// magnitudes any change in the order of the additions would show in the bits. Lengths that are
// not whole 16-byte groups, so that some blocks take the one-at-a-time path; and long enough
// (300007) that with 9 and 16 replicas each owner combines several 32 KiB blocks, the last
// one ragged.
TEMPLATE_TEST_CASE("chunk owner: sums and means of many replicas add in replica order, bit for bit",
                   "[threads][chunk_owner]", float, double) {
  using E = TestType;
  std::mt19937 g(11);
  std::uniform_real_distribution<double> exponent(-4, 4);
  for (const int R : {3, 4, 9, 16}) {
    mirror::Strategy<mirror::devices::Threads, mirror::ops::ChunkOwnerAllReduce> s(
        mirror::test::make_device<mirror::devices::Threads>(R));
    for (const std::size_t n : {std::size_t{4096}, std::size_t{3 * 2048 + 5}, std::size_t{300007}}) {
      for (const auto op : {mirror::ReduceOp::sum, mirror::ReduceOp::mean}) {
        CAPTURE(R, n, mirror::to_string(op));
        std::vector<std::vector<E>> buffers(static_cast<std::size_t>(R), std::vector<E>(n));
        for (auto& b : buffers) {
          for (auto& x : b) x = static_cast<E>((g() % 2 != 0 ? 1 : -1) * std::pow(10.0, exponent(g)));
        }
        std::vector<E> expected = buffers[0];
        for (std::size_t r = 1; r < buffers.size(); ++r) {
          for (std::size_t i = 0; i < n; ++i) expected[i] = static_cast<E>(expected[i] + buffers[r][i]);
        }
        if (op == mirror::ReduceOp::mean) {
          for (auto& x : expected) x = static_cast<E>(x / static_cast<E>(R));
        }
        s.run([&](auto& ctx) {
          ctx.all_reduce(op, std::span<E>(buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())]));
        });
        for (const auto& b : buffers) REQUIRE(mirror::test::same_bits(b.data(), expected.data(), n));
      }
    }
  }
}
