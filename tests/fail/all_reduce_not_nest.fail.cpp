// expected-error: this value is not a mirror::nest: pass a leaf
// Compile-fail test all_reduce_not_nest: ctx.all_reduce of a std::string: not a mirror::nest.
// all_reduce_not_nest.fail.cpp must not compile; all_reduce_not_nest.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <string>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    std::string value = "not a nest";  // <- under test
    return ctx.all_reduce(mirror::ReduceOp::sum, value);
  });
}
