// Passing twin of reduce_axis0_hana_struct.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test reduce_axis0_hana_struct: strategy.reduce(op, PerReplica<hana::tuple<...>>, axis0): axis0 does not walk Hana nests.
// reduce_axis0_hana_struct.fail.cpp must not compile; reduce_axis0_hana_struct.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <tuple>
#include <vector>

int main() {
  using V = std::vector<float>;
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  using Nest = std::tuple<V, V>;  // <- under test
  mirror::PerReplica<Nest> batch(std::vector<Nest>{Nest{V{1.0f}, V{2.0f}}, Nest{V{3.0f}, V{4.0f}}});
  auto total = strategy.reduce(mirror::ReduceOp::sum, batch, mirror::axis0);
  (void)total;
}
