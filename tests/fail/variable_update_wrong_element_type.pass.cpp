// Passing twin of variable_update_wrong_element_type.fail.cpp (tests/fail/check_fail.py).
#include <mirror/mirror.hpp>
#include <span>
#include <vector>
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  auto w = strategy.make_variable(std::vector<float>{1, 2});
  strategy.run(
      [](auto& ctx, auto& var) {
        std::vector<float> grad{1, 1};
        auto g = ctx.all_reduce(mirror::ReduceOp::sum, grad);
        var.update([](std::vector<float>& x, const std::vector<float>& d) { x[0] -= d[0]; }, g);  // <- under test
      },
      w);
}
