// expected-error: reduce_scatter\(op, value\): every leaf must be 1-D.*a std::span<E, Extent> of a fixed\s+extent cannot view a cut of another length
// Compile-fail test reduce_scatter_fixed_extent_span: ctx.reduce_scatter of a std::span<float, 8>: the returned span views
// the replica's cut, whose length is not 8. reduce_scatter_fixed_extent_span.fail.cpp must not compile;
// reduce_scatter_fixed_extent_span.pass.cpp, which differs only in the line marked "under test", must.
#include <mirror/mirror.hpp>
#include <array>
#include <span>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    std::array<float, 8> grads{};
    auto mine = ctx.reduce_scatter(mirror::ReduceOp::sum, std::span<float, 8>(grads));  // <- under test
    (void)mine;
  });
}
