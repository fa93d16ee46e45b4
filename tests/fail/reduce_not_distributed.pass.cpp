// Passing twin of reduce_not_distributed.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test reduce_not_distributed: strategy.reduce(op, 5): the value is not a PerReplica or Mirrored.
// reduce_not_distributed.fail.cpp must not compile; reduce_not_distributed.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  mirror::PerReplica<int> ids = strategy.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); });
  int total = strategy.reduce(mirror::ReduceOp::sum, ids);  // <- under test
  (void)ids;
  return total == 1 ? 0 : 1;
}
