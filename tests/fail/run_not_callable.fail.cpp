// expected-error: fn must be callable as fn\(ctx, args\.\.\.\) or fn\(args\.\.\.\)
// Compile-fail test run_not_callable: strategy.run(fn, args...) with an fn that cannot take the arguments.
// run_not_callable.fail.cpp must not compile; run_not_callable.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <string>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](const std::string& s) { (void)s; }, 5);  // <- under test
}
