// Passing twin of all_reduce_bool_leaf.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test all_reduce_bool_leaf: ctx.all_reduce of a nest with a bool leaf: bool is not a reducible element type.
// all_reduce_bool_leaf.fail.cpp must not compile; all_reduce_bool_leaf.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <tuple>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    std::tuple<float, int> grads{1.0f, 1};  // <- under test
    return ctx.all_reduce(mirror::ReduceOp::sum, grads);
  });
}
