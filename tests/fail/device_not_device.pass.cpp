// Passing twin of device_not_device.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test device_not_device: Strategy<Device> with a Device type that names no runtime.
// device_not_device.fail.cpp must not compile; device_not_device.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
struct NotDevice {
  int replicas = 2;
};

int main() {
  using Device = mirror::devices::Threads;  // <- under test
  mirror::Strategy<Device, mirror::ops::ReductionToOneDevice> strategy;
  return strategy.num_replicas_in_sync() >= 1 ? 0 : 1;
}
