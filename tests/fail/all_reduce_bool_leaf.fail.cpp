// expected-error: cannot be reduced; supported element types are float, double
// Compile-fail test all_reduce_bool_leaf: ctx.all_reduce of a nest with a bool leaf: bool is not a reducible element type.
// all_reduce_bool_leaf.fail.cpp must not compile; all_reduce_bool_leaf.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <tuple>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    std::tuple<float, bool> grads{1.0f, true};  // <- under test
    return ctx.all_reduce(mirror::ReduceOp::sum, grads);
  });
}
