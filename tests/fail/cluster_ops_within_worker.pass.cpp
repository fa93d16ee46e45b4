// Passing twin of cluster_ops_within_worker.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test cluster_ops_within_worker: a multi-worker device (here a fake one, so no MPI
// is needed) with ops that reduce only among one worker's replicas would silently skip the
// other workers; Strategy refuses ops that do not declare crosses_workers.
// cluster_ops_within_worker.fail.cpp must not compile; cluster_ops_within_worker.pass.cpp, which
// differs only in the line marked "under test", must.
#include <mirror/mirror.hpp>

struct FakeCluster {
  mirror::devices::Threads local{};
  friend bool operator==(const FakeCluster&, const FakeCluster&) = default;
  struct runtime : mirror::runtime_t<mirror::devices::Threads> {
    explicit runtime(const FakeCluster& c) : mirror::runtime_t<mirror::devices::Threads>(c.local) {}
    mirror::detail::worker_group* workers() const noexcept { return nullptr; }
  };
};
struct CrossingOps : mirror::ops::ReductionToOneDevice {
  static constexpr bool crosses_workers = true;
  friend bool operator==(const CrossingOps&, const CrossingOps&) = default;
};

int main() {
  using Ops = CrossingOps;  // <- under test
  static_assert(sizeof(mirror::Strategy<FakeCluster, Ops>) > 0);
}
