// Passing twin of reduce_axis0_device_leaf.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test reduce_axis0_device_leaf: the batch-axis reduce runs on the host and must not read device memory.
// reduce_axis0_device_leaf.fail.cpp must not compile; reduce_axis0_device_leaf.pass.cpp, which differs only in the line marked
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
  auto values = strategy.run([] { return FakeDeviceVector{{1, 2}}; });
  auto host_values = strategy.run([] { return std::vector<float>{1, 2}; });
  (void)strategy.reduce(mirror::ReduceOp::sum, host_values, mirror::axis0);  // <- under test
}
