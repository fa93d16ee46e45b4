// expected-error: (?s)\A(?!.*(cannot convert|invalid initialization|no match for call)).*fn must be callable as fn\(T& copy, const U&\.\.\. values\)
// Compile-fail test variable_update_wrong_element_type: handle.update(fn, synced) whose fn takes another element type
// than the variable's: one static_assert naming the rule, not a conversion error deep in the call.
// variable_update_wrong_element_type.fail.cpp must not compile; variable_update_wrong_element_type.pass.cpp, which
// differs only in the line marked "under test", must.
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
        var.update([](std::vector<double>& x, const std::vector<float>& d) { x[0] -= d[0]; }, g);  // <- under test
      },
      w);
}
