// SPDX-License-Identifier: Apache-2.0
// A multi-worker program written only against the public contract (docs/multi-worker.md), built
// outside the tree with `pkg-config --cflags --libs mirror` (run_consumer.sh): in MPI builds it
// odr-uses devices::Cluster, whose communication thread lives in the installed libmirror_mpi, so it
// links only when mirror.pc names that library and MPI. It runs as a singleton MPI process (no
// mpirun: one worker), so every number below is for W = 1; tests/mpi covers W > 1. In builds
// without MPI it checks nothing and passes. Exit code 0 means every check held.
#include <mirror/mirror.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

int main() {
#if MIRROR_HAS_MPI
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      ++failures;
      std::printf("FAIL: %s\n", what);
    }
  };
  using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
  {
    mirror::Strategy<Cluster> s{Cluster{.local = {.replicas = 2}}};  // mirror initialises MPI itself
    check(s.num_workers() == 1 && s.worker_index() == 0 && s.is_chief(), "one worker, the chief");
    check(s.num_replicas_in_sync() == 2, "W * R replicas");
    const auto sums = s.run([](auto& ctx) { return ctx.all_reduce(mirror::ReduceOp::sum, ctx.replica_id_in_sync_group() + 1); });
    check(sums.primary() == 3, "all_reduce over the cluster");
    auto v = s.make_variable(std::vector<float>{1.f, 2.f}, mirror::VariableAggregation::mean);
    const auto path = std::filesystem::temp_directory_path() / "mirror_contract_cluster.ckpt";
    mirror::save(s, path, v);
    v.assign(std::vector<float>{0.f, 0.f});
    mirror::restore(s, path, v);
    check(v.value() == std::vector<float>{1.f, 2.f}, "save / restore");
    std::filesystem::remove(path);
  }
  if (failures == 0) std::printf("contract_cluster: all checks held\n");
  return failures == 0 ? 0 : 1;
#else
  std::printf("contract_cluster: this mirror was built without MPI; nothing to check\n");
  return 0;
#endif
}
