// Passing twin of variable_of_views.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test variable_of_views: a variable of std::span leaves would alias one buffer from every copy.
// variable_of_views.fail.cpp must not compile; variable_of_views.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <span>
#include <vector>
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  std::vector<float> memory(4);
  auto w = strategy.make_variable(memory);  // <- under test
  (void)w;
}
