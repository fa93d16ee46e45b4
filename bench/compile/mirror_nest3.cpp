// SPDX-License-Identifier: Apache-2.0
// Compile-time benchmark (bench/compile_time.sh), the mirror side: run, reduce and all_reduce on
// a 3-level nest. compile/std_thread_nest3.cpp is the same program written with std::thread.
#include <array>
#include <cstdio>
#include <tuple>
#include <utility>
#include <vector>
#include <boost/hana/define_struct.hpp>
#include <mirror/mirror.hpp>

struct Layer {
  BOOST_HANA_DEFINE_STRUCT(Layer, (std::vector<float>, w), (std::vector<float>, b));
};
// Grads -> (Layer | pair) -> (vector | array -> vector)
struct Grads {
  BOOST_HANA_DEFINE_STRUCT(Grads, (Layer, layer), (std::pair<std::array<std::vector<double>, 2>, float>, head));
};

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy({.replicas = 2});
  auto synced = strategy.run([](auto& ctx) {
    const float id = static_cast<float>(ctx.replica_id_in_sync_group());
    Grads g{Layer{std::vector<float>(8, id), std::vector<float>(2, id)},
            {{std::vector<double>(4, id), std::vector<double>(3, id)}, id}};
    return ctx.all_reduce(mirror::ReduceOp::sum, g);
  });
  auto local = strategy.run([](auto& ctx) {
    const float id = static_cast<float>(ctx.replica_id_in_sync_group());
    return Grads{Layer{std::vector<float>(8, id), std::vector<float>(2, id)},
                 {{std::vector<double>(4, id), std::vector<double>(3, id)}, id}};
  });
  const Grads total = strategy.reduce(mirror::ReduceOp::mean, local);
  std::printf("%g %g %g\n", synced.primary().layer.w[0], total.layer.b[1], total.head.second);
}
