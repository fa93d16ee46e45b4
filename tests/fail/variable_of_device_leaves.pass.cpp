// Passing twin of variable_of_device_leaves.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test variable_of_device_leaves: a variable is read and updated on the host, so GPU memory in it would be a host read of device memory.
// variable_of_device_leaves.fail.cpp must not compile; variable_of_device_leaves.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <cstddef>
#include <span>
#include <vector>
#include "tests/support/fake_device_vector.hpp"
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  auto w = strategy.make_variable(std::vector<float>{1, 2}, mirror::VariableAggregation::sum);  // <- under test
  (void)w;
}
