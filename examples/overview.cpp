// The README's first code block: four CPU replicas each compute a struct of gradients, then
// all-reduce it inside run (every replica gets the sum) and reduce it outside run.
#include <mirror/mirror.hpp>
#include <boost/hana/define_struct.hpp>
#include <cstdio>
#include <tuple>
#include <vector>

struct Grads {                                   // any Hana struct is a nest
  BOOST_HANA_DEFINE_STRUCT(Grads, (std::vector<float>, weights), (float, bias));
};

int main() {
  using Strategy = mirror::Strategy<mirror::devices::Threads, mirror::ops::ReductionToOneDevice>;
  // Another algorithm is a one-word change of that line:
  //   using Strategy = mirror::Strategy<mirror::devices::Threads, mirror::ops::HierarchicalCopy>;
  Strategy strategy{mirror::devices::Threads{.replicas = 4}};

  auto [grads, total] = strategy.run([](auto& ctx) {
    Grads g{std::vector<float>(1024, 1.0f), float(ctx.replica_id_in_sync_group())};
    return std::tuple{g, ctx.all_reduce(mirror::ReduceOp::sum, g)};
  });                                            // PerReplica<Grads>, Mirrored<Grads>
  Grads sum = strategy.reduce(mirror::ReduceOp::sum, grads);

  const bool ok = sum.bias == 0 + 1 + 2 + 3 && sum.weights[1023] == 4.0f &&
                  total.primary().bias == sum.bias && total[3].weights == sum.weights;
  std::printf("%d replicas: bias %g, weights[i] %g; all_reduce and reduce %s\n",
              strategy.num_replicas_in_sync(), sum.bias, sum.weights[0], ok ? "agree" : "DISAGREE");
  return ok ? 0 : 1;
}
// GPUs: change only the alias:
//   using Strategy = mirror::Strategy<mirror::devices::Cuda, mirror::ops::NcclAllReduce>;
