// Passing twin of merge_call_returns_synced.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test merge_call_returns_synced: ctx.merge_call whose fn returns a Synced: merge_call wraps its result itself.
// merge_call_returns_synced.fail.cpp must not compile; merge_call_returns_synced.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    auto total = ctx.all_reduce(mirror::ReduceOp::sum, 1);
    auto merged = ctx.merge_call(
        [&](auto& /*strategy*/, const mirror::PerReplica<int>& /*xs*/) {
          return *total;  // <- under test
        },
        ctx.replica_id_in_sync_group());
    return merged;
  });
}
