// Passing twin of all_gather_span_leaf.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test all_gather_span_leaf: ctx.all_gather(nest, axis0) of a std::span leaf: a view cannot hold every replica's elements (the span form takes an out span).
// all_gather_span_leaf.fail.cpp must not compile; all_gather_span_leaf.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <span>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    std::vector<float> mine(3, 1.0f);
    auto all = ctx.all_gather(std::vector<float>(mine), mirror::axis0);  // <- under test
    (void)all;
  });
}
