// SPDX-License-Identifier: Apache-2.0
// The call sites and the flight recorder allocate nothing per collective, on or off: this
// program counts every operator new (its own replacement of the global one) and compares runs
// that make 10 and 1000 collectives (docs/debugging.md#what-it-costs).

#include <catch2/catch.hpp>
#include <atomic>
#include <cstdlib>
#include <new>
#include <span>
#include <vector>
#include <mirror/mirror.hpp>

namespace {
std::atomic<long> allocations{0};
}  // namespace

// (GCC cannot see that this new and this delete pair malloc with free.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

using mirror::ReduceOp;
using S = mirror::Strategy<mirror::devices::Threads>;

namespace {
// Allocations made by one run of `calls` span all-reduces and scalar all-reduces per replica
// (after a first run that sizes every buffer).
long allocations_of_run(S& s, int calls, std::vector<std::vector<float>>& buffers) {
  const auto body = [&](auto& ctx) {
    const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
    for (int k = 0; k < calls; ++k) {
      (void)ctx.all_reduce(ReduceOp::sum, std::span<float>(buffers[r]));
      (void)ctx.all_reduce(ReduceOp::max, 1.0f);
    }
  };
  s.run(body);
  const long before = allocations.load();
  s.run(body);
  return allocations.load() - before;
}
}  // namespace

TEST_CASE("no allocation per collective, with the flight recorder off and on", "[flight_recorder][allocation]") {
  S s{{.replicas = 2}};
  std::vector<std::vector<float>> buffers(2, std::vector<float>(256, 1.0f));
  for (const std::size_t kept : {std::size_t{0}, std::size_t{16}}) {
    CAPTURE(kept);
    s.set_flight_recorder(kept);
    const long few = allocations_of_run(s, 10, buffers);
    const long many = allocations_of_run(s, 1000, buffers);
    CHECK(many == few);
  }
}
