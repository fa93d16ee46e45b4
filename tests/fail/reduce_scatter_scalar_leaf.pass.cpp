// Passing twin of reduce_scatter_scalar_leaf.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test reduce_scatter_scalar_leaf: ctx.reduce_scatter of a scalar leaf: a scalar has nothing to cut.
// reduce_scatter_scalar_leaf.fail.cpp must not compile; reduce_scatter_scalar_leaf.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    auto mine = ctx.reduce_scatter(mirror::ReduceOp::sum, std::vector<float>{1.0f});  // <- under test
    (void)mine;
  });
}
