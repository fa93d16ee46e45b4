// expected-error: Ops must model mirror::cross_device_ops<Ops, Device>
// Compile-fail test ops_not_cross_device_ops: Strategy<Threads, Ops> with an Ops type that has no all_reduce.
// ops_not_cross_device_ops.fail.cpp must not compile; ops_not_cross_device_ops.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
struct NotOps {
  friend bool operator==(NotOps, NotOps) = default;
};

int main() {
  using Ops = NotOps;  // <- under test
  mirror::Strategy<mirror::devices::Threads, Ops> strategy{{.replicas = 2}};
  return strategy.num_replicas_in_sync() == 2 ? 0 : 1;
}
