// expected-error: mirror::axis_t<N>: only the leading \(batch\) axis, mirror::axis0, is supported
// Compile-fail test axis_t_1: mirror::axis_t<1>: only axis 0 exists.
// axis_t_1.fail.cpp must not compile; axis_t_1.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  mirror::PerReplica<std::vector<float>> batch(std::vector<std::vector<float>>{{1.0f}, {2.0f}});
  float total = strategy.reduce(mirror::ReduceOp::sum, batch, mirror::axis_t<1>{});  // <- under test
  return total == 3.0f ? 0 : 1;
}
