// SPDX-License-Identifier: Apache-2.0
// docs/multi-worker.md: a data-parallel loop on devices::Cluster, run with
//   mpirun -np 2 --bind-to none build/examples/guide_multi_worker
// (the test example_guide_multi_worker, suite mpi). The snippet between the // [name] markers
// is copied into the page (tools/check_docs.py keeps the two equal). Exits 1 on a wrong value.
#include <mirror/mirror.hpp>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

int main() {
#if MIRROR_HAS_MPI
  int failures = 0;
  const std::string path = (std::filesystem::temp_directory_path() / "mirror_guide_multi_worker.ckpt").string();
  // [cluster]
  using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
  mirror::Strategy<Cluster> s{Cluster{.local = {.replicas = 2}}};   // collective: every worker builds it
  const int n = s.num_replicas_in_sync();                            // W * 2

  // Every worker reads the same global batches; each keeps its replicas' rows.
  std::vector<std::vector<float>> global_batches(3, std::vector<float>(8));
  for (std::size_t i = 0; i < 8; ++i) global_batches[0][i] = global_batches[1][i] = global_batches[2][i] = 1.0f;

  auto w = s.make_variable(std::vector<float>{0.0f}, mirror::VariableAggregation::mean);  // the chief's value
  for (const auto& batch : s.distribute_dataset(global_batches)) {
    s.run([](auto& ctx, std::span<const float> rows, auto& weight) {   // vector rows arrive as spans
      float grad = 0;
      for (float x : rows) grad += x;                                // this replica's rows
      auto total = ctx.all_reduce(mirror::ReduceOp::sum, grad);      // over all W * R replicas
      weight.update([](std::vector<float>& p, float g) { p[0] += g; }, total);
    }, batch, w);
  }
  if (s.is_chief()) std::printf("%d replicas, weight %g\n", n, static_cast<double>(w.value()[0]));
  mirror::save(s, path, w);                                          // collective; the chief writes
  // [/cluster]
  if (w.value()[0] != 24.0f) {
    std::printf("FAILED: worker %d: weight %g, expected 24 (3 batches of 8 ones)\n", s.worker_index(),
                static_cast<double>(w.value()[0]));
    ++failures;
  }
  if (s.is_chief()) std::filesystem::remove(path);
  return failures == 0 ? 0 : 1;
#else
  std::printf("multi_worker: this mirror was built without MPI; nothing to run\n");
  return 0;
#endif
}
