// SPDX-License-Identifier: Apache-2.0
// devices::Cluster<devices::Cuda> as a consumer sees it, built outside the tree with
// `pkg-config --cflags --libs mirror` (run_consumer.sh): in MPI + NCCL builds it instantiates
// Strategy<Cluster<Cuda>> and odr-uses its constructor, run, reduce and variables, so it links
// only when mirror.pc names libmirror_nccl, libmirror_mpi, NCCL and MPI. It runs the strategy
// (a singleton MPI process: one worker, an NCCL communicator of size 1) only where a GPU is;
// elsewhere compiling and linking is the check. tests/mpi/cluster_cuda_test.cpp covers W > 1.
#include <mirror/mirror.hpp>

#include <cstdio>
#include <type_traits>
#include <vector>

int main() {
#if MIRROR_HAS_MPI && MIRROR_HAS_NCCL
  using Cluster = mirror::devices::Cluster<mirror::devices::Cuda>;
  using S = mirror::Strategy<Cluster>;
  static_assert(std::is_same_v<S::ops_type, mirror::ops::NcclAllReduce>, "Cluster<Cuda> reduces with NCCL");
  static_assert(S::multi_worker);
  if (mirror::cuda::device_count() == 0) {
    std::printf("contract_cluster_cuda: no GPU here; Strategy<Cluster<Cuda>> compiled and linked, not run\n");
    return 0;
  }
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      ++failures;
      std::printf("FAIL: %s\n", what);
    }
  };
  {
    S s{Cluster{.local = {.gpus = {0}}}};
    check(s.num_workers() == 1 && s.num_replicas_in_sync() == 1, "one worker, one GPU");
    const auto sums = s.run([](auto& ctx) { return ctx.all_reduce(mirror::ReduceOp::sum, ctx.replica_id_in_sync_group() + 1); });
    check(sums.primary() == 1, "all_reduce over the cluster");
    const auto host = s.run([](auto& ctx) { return std::vector<float>{float(ctx.replica_id_in_sync_group() + 2)}; });
    check(s.reduce(mirror::ReduceOp::sum, host) == std::vector<float>{2.f}, "Strategy::reduce of host values");
    auto v = s.make_variable(std::vector<float>{1.f, 2.f}, mirror::VariableAggregation::mean);
    check(v.value() == std::vector<float>{1.f, 2.f}, "make_variable");
  }
  if (failures == 0) std::printf("contract_cluster_cuda: all checks held\n");
  return failures == 0 ? 0 : 1;
#else
  std::printf("contract_cluster_cuda: this mirror was built without MPI or NCCL; nothing to check\n");
  return 0;
#endif
}
