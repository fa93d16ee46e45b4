// expected-error: a shared argument holds host arrays beside members that cannot be
// Compile-fail test staged_mixed_argument: on a device whose memory the replicas' threads cannot read, run copies a
// shared host argument to every device, so a nest with host arrays beside members it cannot copy (a std::string)
// is refused rather than left silently in host memory.
// staged_mixed_argument.fail.cpp must not compile; staged_mixed_argument.pass.cpp, which differs only in the line
// marked "under test", must.
#include <mirror/mirror.hpp>
#include <string>
#include <tuple>
#include <vector>
#include "tests/support/fake_device.hpp"
int main() {
  mirror::Strategy<mirror::test::FakeDevice, mirror::ops::ReductionToOneDevice> strategy{{.replicas = 2}};
  strategy.run([](const auto&) {}, std::tuple<std::vector<float>, std::string>{{1.0f}, "lr"});  // <- under test
}
