// expected-error: pass a variable as a non-const lvalue
// Compile-fail test variable_passed_const: a const variable passed to run cannot be updated through its handle.
// variable_passed_const.fail.cpp must not compile; variable_passed_const.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  auto counter = strategy.make_variable(0, mirror::VariableAggregation::sum);
  const auto& v = counter;  // <- under test
  strategy.run([](auto&, auto& c) { c.assign_add(1); }, v);
}
