// expected-error: 'mirror::Synced<T>::Synced\(T\) \[with T = int\]' is private within this context
// Compile-fail test synced_ctor_private: constructing mirror::Synced<int> in user code: only collectives make one.
// synced_ctor_private.fail.cpp must not compile; synced_ctor_private.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  mirror::Mirrored<int> total = strategy.run([](auto& ctx) {
    mirror::Synced<int> s(ctx.replica_id_in_sync_group());  // <- under test
    return s;
  });
  return total.primary() == 1 ? 0 : 1;
}
