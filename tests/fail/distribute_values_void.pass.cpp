// Passing twin of distribute_values_void.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test distribute_values_void: strategy.distribute_values_from_function with a fn that returns nothing: there is no value to distribute.
// distribute_values_void.fail.cpp must not compile; distribute_values_void.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  auto values = strategy.distribute_values_from_function([](const mirror::ValueContext& c) {
    return c.replica_id_in_sync_group;  // <- under test
  });
  (void)values;
}
