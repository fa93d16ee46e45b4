// expected-error: (?s)\A(?!.*no match for 'operator\*').*every argument must be a Synced<U>
// Compile-fail test variable_update_not_synced: handle.update(fn, args...) with a per-replica argument: the copies would diverge.
// variable_update_not_synced.fail.cpp must not compile; variable_update_not_synced.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <span>
#include <vector>
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  auto w = strategy.make_variable(std::vector<float>{1, 2});
  strategy.run(
      [](auto& ctx, auto& var) {
        std::vector<float> grad{1, 1};
        auto g = ctx.all_reduce(mirror::ReduceOp::sum, std::span<float>(grad));
        auto step = [](std::vector<float>& x, std::span<float> d) { x[0] -= d[0]; };
        var.update(step, std::span<float>(grad));  // <- under test
      },
      w);
}
