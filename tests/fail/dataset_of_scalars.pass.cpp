// Passing twin of dataset_of_scalars.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test dataset_of_scalars: distribute_dataset over scalars: a global batch needs a leading batch dimension.
// dataset_of_scalars.fail.cpp must not compile; dataset_of_scalars.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <vector>
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  std::vector<std::vector<float>> batches{{1, 2, 3}};  // <- under test
  for (const auto& per_replica : strategy.distribute_dataset(batches)) (void)per_replica;
}
