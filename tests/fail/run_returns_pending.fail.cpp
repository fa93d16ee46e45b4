// expected-error: fn returns a mirror::Pending, which is valid only inside fn
// Compile-fail test run_returns_pending: fn returns a started collective's handle, which would
// outlive the replica context that completes it.
// run_returns_pending.fail.cpp must not compile; run_returns_pending.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    auto p = ctx.all_reduce_async(mirror::ReduceOp::sum, std::vector<float>(3, 1.0f));
    return p;  // <- under test
  });
}
