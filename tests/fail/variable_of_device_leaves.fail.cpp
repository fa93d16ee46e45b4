// expected-error: variables of device-resident leaves .* are not supported
// Compile-fail test variable_of_device_leaves: a variable is read and updated on the host, so GPU memory in it would be a host read of device memory.
// variable_of_device_leaves.fail.cpp must not compile; variable_of_device_leaves.pass.cpp, which differs only in the line marked
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
  auto w = strategy.make_variable(FakeDeviceVector{{1, 2}}, mirror::VariableAggregation::sum);  // <- under test
  (void)w;
}
