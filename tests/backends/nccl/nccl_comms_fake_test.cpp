// SPDX-License-Identifier: Apache-2.0
// backends/nccl/nccl_comms.cpp without a GPU: linked against the scripted CUDA runtime and NCCL of
// tests/support/fake_nccl.cpp, whose ranks are this test's threads. Each case is one of the
// failures issue 28 found by reading the code: readiness taken for success, a thread left inside
// a group, an abort racing another thread's NCCL call, a stale cudaErrorNotReady reported by the
// next launch, a replica still draining counted as having enqueued, one GPU never reaching NCCL.
#include <catch2/catch.hpp>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <backends/nccl/nccl_comms.hpp>
#include <mirror/error.hpp>
#include "support/fake_nccl.hpp"

namespace nccl = mirror::nccl::impl;
using mirror::ReduceOp;
using mirror::cuda::element_type;
using namespace std::chrono_literals;

namespace {

struct comms_ptr {
  nccl::comms* c;
  explicit comms_ptr(std::vector<int> devices, std::chrono::milliseconds timeout = 5s)
      : c(nccl::create_comms(std::span<const int>(devices.data(), devices.size()), timeout)) {}
  comms_ptr(const comms_ptr&) = delete;
  comms_ptr& operator=(const comms_ptr&) = delete;
  ~comms_ptr() { nccl::destroy_comms(c); }
  nccl::comms& operator*() const { return *c; }
};

// One rank's all-reduce of `values` in place (floats), on its stream.
void all_reduce(nccl::comms& c, int rank, fake_nccl::stream& s, std::vector<float>& values,
                std::chrono::milliseconds timeout = 5s) {
  void* buffers[] = {values.data()};
  const std::size_t counts[] = {values.size()};
  nccl::all_reduce(c, rank, &s, ReduceOp::sum, element_type::f32, buffers, counts, timeout);
}

void require_rules_kept() {
  const auto r = fake_nccl::snapshot();
  for (const auto& v : r.violations) FAIL_CHECK(v);
  REQUIRE(r.violations.empty());
}

}  // namespace

TEST_CASE("nccl: classify: in progress is pending, success is done, anything else a failure", "[nccl][fake]") {
  using nccl::classify;
  using nccl::progress;
  REQUIRE(classify(ncclSuccess, ncclSuccess) == progress::done);
  REQUIRE(classify(ncclSuccess, ncclInProgress) == progress::pending);
  REQUIRE(classify(ncclInProgress, ncclSuccess) == progress::pending);
  // ncclCommGetAsyncError succeeds and reports the error in its out-parameter: not "done".
  REQUIRE(classify(ncclSuccess, ncclSystemError) == progress::failed);
  REQUIRE(classify(ncclSuccess, ncclRemoteError) == progress::failed);
  REQUIRE(classify(ncclInvalidArgument, ncclSuccess) == progress::failed);
  REQUIRE(classify(ncclUnhandledCudaError, ncclInProgress) == progress::failed);
}

TEST_CASE("nccl: one rank runs the real path: group, non-blocking enqueue, event ring", "[nccl][fake]") {
  fake_nccl::reset();
  {
    comms_ptr c({0});
    REQUIRE(nccl::num_ranks(*c) == 1);
    fake_nccl::stream s{0};
    std::vector<float> v(5, 2.0f);
    for (int i = 0; i < 20; ++i) all_reduce(*c, 0, s, v);  // more than the ring's 16: it retires as it goes
    REQUIRE(v == std::vector<float>(5, 2.0f));
    REQUIRE(nccl::enqueued(*c, 0) == 20);
    REQUIRE(fake_nccl::snapshot().all_reduce_calls == 20);
    REQUIRE(fake_nccl::group_depth() == 0);
  }
  REQUIRE(fake_nccl::snapshot().destroys == 1);
  require_rules_kept();
}

TEST_CASE("nccl: two ranks on two threads sum their buffers; the caller's device is left alone", "[nccl][fake]") {
  fake_nccl::reset();
  REQUIRE(cudaSetDevice(3) == cudaSuccess);
  comms_ptr c({0, 1});
  REQUIRE(fake_nccl::current_device() == 3);
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  fake_nccl::stream sa{0}, sb{1};
  std::thread t([&] { all_reduce(*c, 1, sb, b); });
  all_reduce(*c, 0, sa, a);
  t.join();
  REQUIRE(a == std::vector<float>(4, 3.0f));
  REQUIRE(b == std::vector<float>(4, 3.0f));
  require_rules_kept();
}

TEST_CASE("nccl: a communicator whose initialisation fails is an error, not a ready communicator",
          "[nccl][fake]") {
  fake_nccl::reset({.init_async = ncclSystemError});
  REQUIRE(cudaSetDevice(5) == cudaSuccess);
  try {
    comms_ptr c({0, 1});
    FAIL("create_comms returned");
  } catch (const mirror::backend_error& e) {
    REQUIRE(e.code() == ncclSystemError);
    REQUIRE_THAT(e.what(), Catch::Contains("ncclCommInitRankConfig"));
  }
  REQUIRE(fake_nccl::snapshot().aborts == 2);  // both freed
  REQUIRE(fake_nccl::current_device() == 5);
  require_rules_kept();
}

TEST_CASE("nccl: an enqueue that ends in an asynchronous error aborts and throws", "[nccl][fake]") {
  fake_nccl::reset({.enqueue_async = ncclUnhandledCudaError});
  comms_ptr c({0});
  fake_nccl::stream s{0};
  std::vector<float> v(3, 1.0f);
  REQUIRE_THROWS_AS(all_reduce(*c, 0, s, v), mirror::backend_error);
  REQUIRE(fake_nccl::snapshot().aborts == 1);
  // The set is unusable afterwards, and says so instead of calling NCCL.
  REQUIRE_THROWS_WITH(all_reduce(*c, 0, s, v), Catch::Contains("aborted"));
  require_rules_kept();
}

TEST_CASE("nccl: an ncclGroupEnd that fails outright aborts and throws", "[nccl][fake]") {
  fake_nccl::reset({.group_end = ncclSystemError});
  comms_ptr c({0});
  fake_nccl::stream s{0};
  std::vector<float> v(3, 1.0f);
  REQUIRE_THROWS_AS(all_reduce(*c, 0, s, v), mirror::backend_error);
  REQUIRE(fake_nccl::snapshot().aborts == 1);
  REQUIRE(fake_nccl::group_depth() == 0);
  require_rules_kept();
}

TEST_CASE("nccl: a failed ncclAllReduce inside the group still ends the group", "[nccl][fake]") {
  fake_nccl::reset({.fail_all_reduce_call = 2});
  comms_ptr c({0});
  fake_nccl::stream s{0};
  std::vector<float> x(3, 1.0f), y(4, 1.0f);
  void* buffers[] = {x.data(), y.data()};
  const std::size_t counts[] = {x.size(), y.size()};
  REQUIRE_THROWS_AS(nccl::all_reduce(*c, 0, &s, ReduceOp::sum, element_type::f32, buffers, counts, 5s),
                    mirror::backend_error);
  REQUIRE(fake_nccl::group_depth() == 0);  // the thread is not left inside the group
  REQUIRE(fake_nccl::snapshot().groups_launched == 0);  // and nothing half-built was launched
  require_rules_kept();
}

TEST_CASE("nccl: an expected cudaErrorNotReady is not left for the next launch to report", "[nccl][fake]") {
  // Rank 0's collectives never complete: each later call finds the earlier ones not ready. An
  // integer mean then launches the divide kernel, whose check reads the thread's last error.
  fake_nccl::reset({.hang_rank = 0});
  comms_ptr c({0});
  fake_nccl::stream s{0};
  std::vector<std::int32_t> v(4, 6);
  void* buffers[] = {v.data()};
  const std::size_t counts[] = {v.size()};
  // (A short timeout: destroy_comms waits for the unfinished ones until then.)
  for (int i = 0; i < 3; ++i) {
    REQUIRE_NOTHROW(nccl::all_reduce(*c, 0, &s, ReduceOp::mean, element_type::i32, buffers, counts, 1s));
    REQUIRE(fake_nccl::last_error() == cudaSuccess);
  }
  REQUIRE(fake_nccl::snapshot().not_ready_queries > 0);
  REQUIRE(v == std::vector<std::int32_t>(4, 6));
  require_rules_kept();
}

TEST_CASE("nccl: a replica still draining its own ring is named missing, and the abort waits for its NCCL call",
          "[nccl][fake]") {
  // Rank 1's collectives never complete, so its ring of 16 fills; its 17th all-reduce waits there
  // (polling its communicator) for the oldest. Rank 0 meanwhile enqueues its 17th and waits for
  // rank 1 to join, with a shorter timeout: it must name rank 1, which has not enqueued it.
  fake_nccl::reset({.hang_rank = 1});
  comms_ptr c({0, 1});
  fake_nccl::stream s0{0}, s1{1};
  std::vector<float> a(2, 1.0f), b(2, 1.0f);
  for (int i = 0; i < 16; ++i) {
    std::thread t([&] { all_reduce(*c, 1, s1, b, 60s); });
    all_reduce(*c, 0, s0, a, 60s);
    t.join();
  }
  std::exception_ptr rank1_error;
  std::thread t([&] {
    try {
      all_reduce(*c, 1, s1, b, 60s);
    } catch (...) {
      rank1_error = std::current_exception();
    }
  });
  std::this_thread::sleep_for(50ms);  // rank 1 is in its ring by now
  try {
    all_reduce(*c, 0, s0, a, 300ms);
    FAIL("no timeout_error");
  } catch (const mirror::timeout_error& e) {
    REQUIRE(e.missing() == std::vector<int>{1});
    REQUIRE_THAT(e.what(), Catch::Contains("{1} had not enqueued it"));
  }
  t.join();
  // Rank 1's wait ends with the abort, as an error, not after its own 60 s.
  REQUIRE(rank1_error != nullptr);
  REQUIRE_THROWS_AS(std::rethrow_exception(rank1_error), mirror::backend_error);
  REQUIRE(fake_nccl::snapshot().aborts == 2);
  require_rules_kept();  // in particular: no abort while rank 1 was inside ncclCommGetAsyncError
}
