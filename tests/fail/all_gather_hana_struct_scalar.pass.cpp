// Passing twin of all_gather_hana_struct_scalar.fail.cpp (tests/fail/check_fail.py).
// Compile-fail test all_gather_hana_struct_scalar: ctx.all_gather of a Hana struct with a scalar member: the gathered member would need another type.
// all_gather_hana_struct_scalar.fail.cpp must not compile; all_gather_hana_struct_scalar.pass.cpp, which differs only in the line marked
// "under test", must.
#include <boost/hana/define_struct.hpp>
#include <mirror/mirror.hpp>
#include <vector>

struct Stats {
  BOOST_HANA_DEFINE_STRUCT(Stats, (std::vector<float>, losses), (std::vector<float>, count));  // <- under test
};

int main() {
  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 2}};
  strategy.run([](auto& ctx) {
    auto all = ctx.all_gather(Stats{}, mirror::axis0);
    (void)all;
  });
}
