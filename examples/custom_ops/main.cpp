// SPDX-License-Identifier: Apache-2.0
// docs/backend.md's program: a strategy with an ops policy of one's own (slice_owner_all_reduce.hpp),
// checked against a serial loop. Exits 1 when a value differs.
#include <cstdio>
#include <vector>
#include <mirror/mirror.hpp>
#include "slice_owner_all_reduce.hpp"

int main() {
  // [use]
  static_assert(mirror::cross_device_ops<example::SliceOwnerAllReduce, mirror::devices::Threads>);
  using Strategy = mirror::Strategy<mirror::devices::Threads, example::SliceOwnerAllReduce>;
  Strategy strategy(mirror::devices::Threads{.replicas = 4});

  auto sums = strategy.run([](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<float> grad(1000);
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = 0.25f * float(r + 1) + float(i);
    return ctx.all_reduce(mirror::ReduceOp::sum, grad);
  });  // Mirrored<std::vector<float>>
  // [/use]

  bool ok = true;
  for (int r = 0; r < strategy.num_replicas_in_sync(); ++r) {
    const std::vector<float>& got = sums[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < got.size(); ++i) {
      float want = 0;
      for (int q = 0; q < 4; ++q) want += 0.25f * float(q + 1) + float(i);
      if (got[i] != want) ok = false;
    }
  }
  std::printf("%s\n", ok ? "every replica holds the serial sum" : "MISMATCH");
  return ok ? 0 : 1;
}
