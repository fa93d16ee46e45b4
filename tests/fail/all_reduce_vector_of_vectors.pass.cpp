// Passing twin of all_reduce_vector_of_vectors.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test all_reduce_vector_of_vectors: ctx.all_reduce of a std::vector<std::vector<float>>:
// one static_assert sentence, not the constraint's notes.
// all_reduce_vector_of_vectors.fail.cpp must not compile; all_reduce_vector_of_vectors.pass.cpp, which differs
// only in the line marked "under test", must.
#include <mirror/mirror.hpp>
#include <array>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    std::array<std::vector<float>, 2> value{std::vector<float>(3, 1.0f), std::vector<float>(3, 1.0f)};  // <- under test
    return ctx.all_reduce(mirror::ReduceOp::sum, value);
  });
}
