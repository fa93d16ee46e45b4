// Passing twin of reduce_scatter_array_leaf.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test reduce_scatter_array_leaf: ctx.reduce_scatter of a std::array leaf: the cut cannot have another length.
// reduce_scatter_array_leaf.fail.cpp must not compile; reduce_scatter_array_leaf.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <array>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    auto mine = ctx.reduce_scatter(mirror::ReduceOp::sum, std::vector<float>{1, 2, 3, 4});  // <- under test
    (void)mine;
  });
}
