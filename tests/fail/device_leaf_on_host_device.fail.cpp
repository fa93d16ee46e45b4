// expected-error: device-resident leaves \(GPU memory\) but this strategy.s device reads
// Compile-fail test device_leaf_on_host_device: devices::Threads combines leaves with CPU loads, so a device-resident leaf there is rejected.
// device_leaf_on_host_device.fail.cpp must not compile; device_leaf_on_host_device.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <cstddef>
#include <span>
#include <vector>
// A stand-in for thrust::device_vector: an owning leaf that declares its elements
// device-resident (the host memory behind it is never read in these compile-only tests).
struct FakeDeviceVector {
  std::vector<float> storage;
};
template <>
struct mirror::leaf_traits<FakeDeviceVector> {
  static constexpr bool is_leaf = true;
  using element_type = float;
  static constexpr int rank = 1;
  static constexpr bool is_view = false;
  static constexpr bool resizable = false;
  static constexpr bool device_resident = true;
  static std::span<float> elements(FakeDeviceVector& x) noexcept { return x.storage; }
  static std::span<const float> elements(const FakeDeviceVector& x) noexcept { return x.storage; }
};
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) { (void)ctx.all_reduce(mirror::ReduceOp::sum, FakeDeviceVector{{1, 2}}); });  // <- under test
}
