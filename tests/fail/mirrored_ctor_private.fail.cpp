// expected-error: no matching function for call to 'mirror::Mirrored<int>::Mirrored\(std::vector<int>\)'
// Compile-fail test mirrored_ctor_private: constructing mirror::Mirrored<int> in user code: only run and Strategy::broadcast make one.
// mirrored_ctor_private.fail.cpp must not compile; mirrored_ctor_private.pass.cpp, which differs only in the line marked
// "under test", must.
#include <mirror/mirror.hpp>
#include <vector>

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  mirror::Mirrored<int> m(std::vector<int>{7, 7});  // <- under test
  return m.primary() == 7 ? 0 : 1;
}
