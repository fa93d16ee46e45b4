// Passing twin of gather_span_leaves.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test gather_span_leaves: strategy.gather of a PerReplica of std::span leaves: the result would alias the replicas' buffers.
// gather_span_leaves.fail.cpp must not compile; gather_span_leaves.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <span>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  mirror::PerReplica<std::vector<float>> parts(std::vector<std::vector<float>>{a, b});  // <- under test
  auto all = strategy.gather(parts, mirror::axis0);
  (void)all;
}
