// expected-error: reduce_scatter\(op, value\): every leaf must be 1-D and hold a cut of any length
// Compile-fail test reduce_scatter_scalar_leaf: ctx.reduce_scatter of a scalar leaf: a scalar has nothing to cut.
// reduce_scatter_scalar_leaf.fail.cpp must not compile; reduce_scatter_scalar_leaf.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    auto mine = ctx.reduce_scatter(mirror::ReduceOp::sum, 1.0f);  // <- under test
    (void)mine;
  });
}
