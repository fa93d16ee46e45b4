// Passing twin of reduce_axis0_device_leaf.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test reduce_axis0_device_leaf: the batch-axis reduce runs on the host and must not read device memory.
// reduce_axis0_device_leaf.fail.cpp must not compile; reduce_axis0_device_leaf.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <cstddef>
#include <span>
#include <vector>
#include "tests/support/fake_device_vector.hpp"
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  auto values = strategy.run([] { return FakeDeviceVector{{1, 2}}; });
  auto host_values = strategy.run([] { return std::vector<float>{1, 2}; });
  (void)strategy.reduce(mirror::ReduceOp::sum, host_values, mirror::axis0);  // <- under test
}
