// expected-error: local_results\(value\): value must be a PerReplica<T>, Mirrored<T> or a variable
// Compile-fail test local_results_not_distributed: strategy.local_results of a plain value.
// local_results_not_distributed.fail.cpp must not compile; local_results_not_distributed.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  mirror::PerReplica<int> ids = strategy.run([](auto& ctx) { return ctx.replica_id_in_sync_group(); });
  std::vector<int> plain{0, 1};
  auto parts = strategy.local_results(plain);  // <- under test
  (void)plain;
  return parts.size() == 2 ? 0 : 1;
}
