// expected-error: device-resident leaves \(GPU memory\) but this strategy.s device reads
// Compile-fail test device_leaf_on_host_device: devices::Threads combines leaves with CPU loads, so a device-resident leaf there is rejected.
// device_leaf_on_host_device.fail.cpp must not compile; device_leaf_on_host_device.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <cstddef>
#include <span>
#include <vector>
#include "tests/support/fake_device_vector.hpp"
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) { (void)ctx.all_reduce(mirror::ReduceOp::sum, FakeDeviceVector{{1, 2}}); });  // <- under test
}
