// Passing twin of run_not_callable.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test run_not_callable: strategy.run(fn, args...) with an fn that cannot take the arguments.
// run_not_callable.fail.cpp must not compile; run_not_callable.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <string>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](int x) { (void)x; }, 5);  // <- under test
}
