// Passing twin of reduce_axis0_scalar.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test reduce_axis0_scalar: strategy.reduce(op, PerReplica<float>, axis0): a scalar has no leading axis.
// reduce_axis0_scalar.fail.cpp must not compile; reduce_axis0_scalar.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  mirror::PerReplica<std::vector<float>> batch(std::vector<std::vector<float>>{{1.0f}, {2.0f}});  // <- under test
  float total = strategy.reduce(mirror::ReduceOp::sum, batch, mirror::axis0);
  return total == 3.0f ? 0 : 1;
}
