// expected-error: value holds std::span \(view\) leaves, so the result would alias
// Compile-fail test reduce_span_leaves: strategy.reduce of a PerReplica of std::span leaves: the result would alias replica 0's buffer.
// reduce_span_leaves.fail.cpp must not compile; reduce_span_leaves.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <span>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  mirror::PerReplica<std::span<float>> grads(std::vector<std::span<float>>{a, b});  // <- under test
  auto total = strategy.reduce(mirror::ReduceOp::sum, grads);
  (void)total;
}
