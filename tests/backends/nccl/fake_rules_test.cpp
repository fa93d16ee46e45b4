// SPDX-License-Identifier: Apache-2.0
// The rules of NCCL and CUDA that tests/support/fake_nccl.cpp models, one case each: what the
// fake must refuse or compute as the real libraries do, so that the suites linked against it
// (nccl_comms_fake, nccl_overlap_fake, cuda_gather_scatter_fake, mpi_cluster_cuda_fake) fail where
// a GPU would. Where a rule is NCCL's own arithmetic, the expected values are worked out here from
// NCCL's definition, independently of the fake.
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <mirror/backends/cuda/kernels.hpp>
#include <mirror/backends/nccl/nccl_comms.hpp>
#include <mirror/error.hpp>
#include <mirror/mirror.hpp>
#include "support/comms_ptr.hpp"
#include "support/fake_nccl.hpp"

namespace nccl = mirror::nccl::impl;
using mirror::ReduceOp;
using mirror::cuda::kernel_kind_of;
using namespace std::chrono_literals;

namespace {

using mirror::test::comms_ptr;

// One stream per rank, for every call (NCCL needs a communicator's calls ordered).
fake_nccl::stream rank_streams[] = {{0}, {1}, {2}, {3}};

// Every rank r of `c` all-reduces values[r] in place with `op`, each on its own thread.
template <class T>
void all_reduce_on_every_rank(nccl::comms& c, ReduceOp op, std::vector<std::vector<T>>& values) {
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < values.size(); ++r) {
    threads.emplace_back([&, r] {
      fake_nccl::stream& s = rank_streams[r];
      void* buffers[] = {values[r].data()};
      const std::size_t counts[] = {values[r].size()};
      nccl::all_reduce(c, static_cast<int>(r), &s, op, kernel_kind_of<T>(), buffers, counts, 5s);
    });
  }
  for (auto& t : threads) t.join();
}

std::vector<std::string> violations() { return fake_nccl::snapshot().violations; }

bool mentions(const std::vector<std::string>& all, const std::string& what) {
  for (const auto& v : all) {
    if (v.find(what) != std::string::npos) return true;
  }
  return false;
}

void require_rules_kept() {
  for (const auto& v : violations()) FAIL_CHECK(v);
  REQUIRE(violations().empty());
}

// What a case makes with the fake runtime (device memory, streams, events), freed when it ends.
struct made {
  std::vector<void*> memory;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> events;
  made() = default;
  made(const made&) = delete;
  made& operator=(const made&) = delete;
  ~made() {
    for (void* p : memory) (void)cudaFree(p);
    for (cudaStream_t st : streams) (void)cudaStreamDestroy(st);
    for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
  }
  // n elements of T on the current fake GPU.
  template <class T>
  T* device_alloc(std::size_t n) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
    memory.push_back(p);
    return static_cast<T*>(p);
  }
  cudaStream_t stream(bool blocking = true) {
    cudaStream_t st = nullptr;
    REQUIRE((blocking ? cudaStreamCreate(&st) : cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) == cudaSuccess);
    streams.push_back(st);
    return st;
  }
  cudaEvent_t event() {
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    events.push_back(e);
    return e;
  }
};

// Replica r of `s` (on GPU devices[r]) all-reduces a device leaf of n floats, all r + 1, in
// place: every replica's leaf must hold the sum.
template <class Strategy>
void check_in_place_sum(Strategy& s, const std::vector<int>& devices, std::size_t n) {
  std::vector<mirror::cuda::device_buffer<float>> buffers;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    buffers.emplace_back(devices[r], n);
    buffers.back().upload(std::vector<float>(n, float(r + 1)));
  }
  s.run([&](auto& ctx) {
    ctx.all_reduce(ReduceOp::sum, buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
  });
  const auto R = static_cast<float>(devices.size());
  for (auto& b : buffers) {
    std::vector<float> got(n);
    b.download(got);
    CHECK(got == std::vector<float>(n, R * (R + 1) / 2));
  }
}

// Two communicators of one NCCL world, made directly: rank r on device r.
std::vector<ncclComm_t> two_ranks() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(2);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    (void)ncclCommInitRankConfig(&comms[static_cast<std::size_t>(r)], 2, id, r, &config);
  }
  (void)ncclGroupEnd();
  for (ncclComm_t c : comms) {
    ncclResult_t state = ncclInProgress;
    for (int polls = 0; state == ncclInProgress && polls < 100; ++polls) REQUIRE(ncclCommGetAsyncError(c, &state) == ncclSuccess);
    REQUIRE(state == ncclSuccess);
  }
  return comms;
}

}  // namespace

TEST_CASE("fake rules: a communicator's buffer or stream of another device is a violation", "[nccl][fake]") {
  fake_nccl::reset({.devices = 2});
  const auto comms = two_ranks();
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  made m;
  float* on_1 = m.device_alloc<float>(4);
  cudaStream_t stream_1 = m.stream();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  float* on_0 = m.device_alloc<float>(4);
  cudaStream_t stream_0 = m.stream();

  // Rank 0 (device 0) with its own buffer and stream: no violation.
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(on_0, on_0, 4, ncclFloat32, ncclSum, comms[0], stream_0) == ncclSuccess);
  REQUIRE(violations().empty());
  // ... then device 1's buffer, and device 1's stream.
  REQUIRE(ncclAllReduce(on_1, on_1, 4, ncclFloat32, ncclSum, comms[0], stream_0) == ncclSuccess);
  CHECK(mentions(violations(), "with a buffer of device 1 on a communicator of device 0"));
  REQUIRE(ncclAllReduce(on_0, on_0, 4, ncclFloat32, ncclSum, comms[0], stream_1) == ncclSuccess);
  CHECK(mentions(violations(), "on a stream of device 1 for a communicator of device 0"));
  (void)ncclGroupEnd();
}

TEST_CASE("fake rules: two ranks of one communicator on one GPU fail init, and mirror reports NCCL's error",
          "[nccl][fake]") {
  fake_nccl::reset({.devices = 2});
  try {
    comms_ptr c({1, 1});
    FAIL("no error");
  } catch (const mirror::backend_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("ncclCommInitRankConfig"));
    CHECK(e.code() == ncclInvalidUsage);
  }
}

TEST_CASE("fake rules: init completes only once every rank joined; one rank's failure fails mirror's creation at "
          "once, not at the timeout",
          "[nccl][fake]") {
  SECTION("the fake: rank 0 alone stays in progress") {
    fake_nccl::reset({.init_polls = 0, .devices = 2});
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c0 = nullptr, c1 = nullptr;
    REQUIRE(ncclGroupStart() == ncclSuccess);
    (void)ncclCommInitRankConfig(&c0, 2, id, 0, &config);
    (void)ncclGroupEnd();
    ncclResult_t state = ncclSuccess;
    for (int i = 0; i < 10; ++i) {
      REQUIRE(ncclCommGetAsyncError(c0, &state) == ncclSuccess);
      REQUIRE(state == ncclInProgress);
    }
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    (void)ncclCommInitRankConfig(&c1, 2, id, 1, &config);
    (void)ncclGroupEnd();
    REQUIRE(ncclCommGetAsyncError(c0, &state) == ncclSuccess);
    CHECK(state == ncclSuccess);
    REQUIRE(ncclCommGetAsyncError(c1, &state) == ncclSuccess);
    CHECK(state == ncclSuccess);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
  }
  SECTION("mirror: rank 2's init fails while ranks 0 and 1 wait for it") {
    fake_nccl::reset({.devices = 3, .fail_init_rank = 2});
    const auto start = std::chrono::steady_clock::now();
    try {
      comms_ptr c({0, 1, 2}, 20s);
      FAIL("no error");
    } catch (const mirror::backend_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("ncclCommInitRankConfig (rank 2)"));
    }
    CHECK(std::chrono::steady_clock::now() - start < 5s);  // polled in rounds: not after the 20 s
    CHECK(fake_nccl::snapshot().aborts == 3);              // every communicator, the waiting ones too
  }
}

TEST_CASE("fake rules: work on two streams touching the same device memory needs an event between them; the host "
          "needs a synchronize",
          "[nccl][fake]") {
  fake_nccl::reset({.devices = 1});
  made m;
  float* buffer = m.device_alloc<float>(8);
  float* other = m.device_alloc<float>(8);
  cudaStream_t a = m.stream(), b = m.stream(false);
  cudaEvent_t written = m.event();
  const auto type = kernel_kind_of<float>();

  // A kernel on `a` writes `buffer`; a copy on `b` reads it after waiting for an event: ordered.
  REQUIRE(mirror::cuda::impl::launch_combine(a, ReduceOp::sum, type, buffer, other, 8) == 0);
  REQUIRE(cudaEventRecord(written, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, written, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(other, buffer, 8 * sizeof(float), cudaMemcpyDeviceToDevice, b) == cudaSuccess);
  REQUIRE(violations().empty());

  // The same without the wait: the kernel on `a` may still be writing while `b` copies.
  fake_nccl::reset({.devices = 1});
  buffer = m.device_alloc<float>(8);
  other = m.device_alloc<float>(8);
  REQUIRE(mirror::cuda::impl::launch_combine(a, ReduceOp::sum, type, buffer, other, 8) == 0);
  REQUIRE(cudaMemcpyAsync(other, buffer, 8 * sizeof(float), cudaMemcpyDeviceToDevice, b) == cudaSuccess);
  REQUIRE(violations().size() == 2);  // b's read of `buffer`, and its write of `other`, which a's kernel reads
  CHECK(mentions(violations(), "cudaMemcpyAsync (stream"));
  CHECK(mentions(violations(), "with no stream order or event between them"));

  // Disjoint halves of one buffer need no order.
  fake_nccl::reset({.devices = 1});
  buffer = m.device_alloc<float>(8);
  REQUIRE(mirror::cuda::impl::launch_divide(a, type, buffer + 4, 4, 2) == 0);
  REQUIRE(mirror::cuda::impl::launch_divide(b, type, buffer, 4, 2) == 0);
  CHECK(violations().empty());

  // The host: a read of memory that stream `b` writes needs a synchronize first.
  fake_nccl::reset({.devices = 1});
  float* x = m.device_alloc<float>(4);
  b = m.stream(false);
  REQUIRE(mirror::cuda::impl::launch_divide(b, type, x, 4, 2) == 0);
  std::vector<float> host(4);
  REQUIRE(cudaMemcpy(host.data(), x, sizeof(float) * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(mentions(violations(), "cudaMemcpy on the host reads device memory that kernel"));
  const std::size_t before = violations().size();
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  REQUIRE(cudaMemcpy(host.data(), x, sizeof(float) * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(violations().size() == before);
}

TEST_CASE("fake rules: ncclAvg of floats pre-multiplies each input by 1/N rounded to the type, as NCCL does",
          "[nccl][fake]") {
  fake_nccl::reset({.devices = 3});
  comms_ptr c({0, 1, 2});
  // Inputs whose pre-multiplied sum differs from the sum divided by 3 in float.
  const std::vector<float> in = {0.1f, 0.7f, 1.3f};
  const float third = 1.0f / 3.0f;
  const float premul = in[0] * third + in[1] * third + in[2] * third;  // in rank order, each step in float
  const float divided = (in[0] + in[1] + in[2]) / 3.0f;
  REQUIRE(premul != divided);  // the case tells the two apart
  std::vector<std::vector<float>> values = {{in[0]}, {in[1]}, {in[2]}};
  all_reduce_on_every_rank(*c, ReduceOp::mean, values);
  for (const auto& v : values) CHECK(v[0] == premul);
  // Integers: NCCL's sum, then mirror's division (C++'s truncation).
  std::vector<std::vector<std::int32_t>> ints = {{-7}, {1}, {2}};
  all_reduce_on_every_rank(*c, ReduceOp::mean, ints);
  for (const auto& v : ints) CHECK(v[0] == -4 / 3);
  require_rules_kept();
}

TEST_CASE("fake rules: NCCL's min and max of floats drop a NaN unless every rank's is NaN", "[nccl][fake]") {
  fake_nccl::reset({.devices = 3});
  comms_ptr c({0, 1, 2});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
    CAPTURE(mirror::to_string(op));
    std::vector<std::vector<float>> values = {{nan, 5.0f, nan}, {2.0f, nan, nan}, {3.0f, 4.0f, nan}};
    all_reduce_on_every_rank(*c, op, values);
    for (const auto& v : values) {
      CHECK(v[0] == (op == ReduceOp::min ? 2.0f : 3.0f));
      CHECK(v[1] == (op == ReduceOp::min ? 4.0f : 5.0f));
      CHECK(std::isnan(v[2]));
    }
  }
  require_rules_kept();
}

TEST_CASE("fake rules: half and bfloat16 sums round each step to the type, as NCCL's kernels do", "[nccl][fake]") {
  fake_nccl::reset({.devices = 3});
  comms_ptr c({0, 1, 2});
  // half: 2048 + 1 is 2049, between the halves 2048 and 2050 (spacing 2 above 2048): rounds to
  // the even 2048, and so does adding the third 1. A float accumulator would give 2050.
  std::vector<std::vector<mirror::cuda::half>> h = {{{0x6800}}, {{0x3c00}}, {{0x3c00}}};  // 2048, 1, 1
  all_reduce_on_every_rank(*c, ReduceOp::sum, h);
  for (const auto& v : h) CHECK(v[0].bits == 0x6800);
  // bfloat16: 256 + 1 + 1 the same way (spacing 2 above 256); 0x4380 is 256, 0x3f80 is 1.
  std::vector<std::vector<mirror::cuda::bfloat16>> b = {{{0x4380}}, {{0x3f80}}, {{0x3f80}}};
  all_reduce_on_every_rank(*c, ReduceOp::sum, b);
  for (const auto& v : b) CHECK(v[0].bits == 0x4380);
  // Max with a NaN: dropped (0x7e00 is a half NaN, 0x4000 is 2, 0x3c00 is 1).
  std::vector<std::vector<mirror::cuda::half>> m = {{{0x7e00}}, {{0x4000}}, {{0x3c00}}};
  all_reduce_on_every_rank(*c, ReduceOp::max, m);
  for (const auto& v : m) CHECK(v[0].bits == 0x4000);
  require_rules_kept();
}

TEST_CASE("fake rules: partial and one-way peer access; mirror's copying policies stay within what is enabled",
          "[cuda][fake]") {
  // Device 1 cannot reach device 0; device 0 reaches device 1; device 2 reaches no one.
  fake_nccl::reset({.devices = 3, .no_peer_access = {{1, 0}, {2, 0}, {2, 1}}});
  int can = -1;
  REQUIRE(cudaDeviceCanAccessPeer(&can, 0, 1) == cudaSuccess);
  CHECK(can == 1);
  REQUIRE(cudaDeviceCanAccessPeer(&can, 1, 0) == cudaSuccess);
  CHECK(can == 0);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaErrorPeerAccessUnsupported);
  (void)cudaGetLastError();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess);
  fake_nccl::reset({.devices = 3, .no_peer_access = {{1, 0}, {2, 0}, {2, 1}}});
  // The copying policies, whatever pairs they can enable: every replica gets the sum, and no
  // kernel touches memory its device cannot reach (the fake refuses that launch).
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0, 1, 2}}, {}};
  check_in_place_sum(s, {0, 1, 2}, 5);  // 6 everywhere
  require_rules_kept();
}

TEST_CASE("fake rules: a non-blocking finalize completes later; destroying before it has is a violation",
          "[nccl][fake]") {
  fake_nccl::reset({.devices = 2, .finalize_polls = 3});
  auto comms = two_ranks();
  CHECK(ncclCommFinalize(comms[0]) == ncclInProgress);
  CHECK(ncclCommDestroy(comms[0]) == ncclInProgress);
  CHECK(mentions(violations(), "ncclCommDestroy of a communicator whose ncclCommFinalize is still in progress"));
  ncclResult_t state = ncclInProgress;
  int polls = 0;
  for (; state == ncclInProgress && polls < 10; ++polls) REQUIRE(ncclCommGetAsyncError(comms[0], &state) == ncclSuccess);
  CHECK(state == ncclSuccess);
  CHECK(polls == 4);
  CHECK(ncclCommDestroy(comms[0]) == ncclSuccess);
  CHECK(ncclCommDestroy(comms[1]) == ncclSuccess);  // without a finalize: destroy finalizes itself

  // mirror's destroy waits for the finalize, then destroys (no abort, no violation).
  fake_nccl::reset({.devices = 2, .finalize_polls = 3});
  {
    comms_ptr c({0, 1});
    std::vector<std::vector<float>> values = {{1.0f}, {2.0f}};
    all_reduce_on_every_rank(*c, ReduceOp::sum, values);
  }
  CHECK(fake_nccl::snapshot().destroys == 2);
  CHECK(fake_nccl::snapshot().aborts == 0);
  require_rules_kept();
}

TEST_CASE("fake rules: one thread's group may span several communicators", "[nccl][fake]") {
  fake_nccl::reset({.devices = 2});
  const auto comms = two_ranks();
  std::vector<float> a = {1.0f, 2.0f}, b = {10.0f, 20.0f};
  fake_nccl::stream s0{0}, s1{1};
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(a.data(), a.data(), 2, ncclFloat32, ncclSum, comms[0], &s0) == ncclSuccess);
  REQUIRE(ncclAllReduce(b.data(), b.data(), 2, ncclFloat32, ncclSum, comms[1], &s1) == ncclSuccess);
  (void)ncclGroupEnd();
  CHECK(a == std::vector<float>{11.0f, 22.0f});
  CHECK(b == std::vector<float>{11.0f, 22.0f});
  CHECK(fake_nccl::snapshot().groups_launched == 2);  // each communicator launched its part
  require_rules_kept();
}

TEST_CASE("fake rules: NCCL 2.30's NCCL_MULTI_RANK_GPU_ENABLE=1 lets ranks share a GPU; NcclAllReduce then runs "
          "logical replicas of one GPU, and refuses them otherwise",
          "[nccl][fake]") {
  using Strategy = mirror::Strategy<mirror::devices::Cuda, mirror::ops::NcclAllReduce>;
  const mirror::devices::Cuda two_on_one{.gpus = {0}, .replicas_per_gpu = 2};
  struct unset_on_exit {
    ~unset_on_exit() { ::unsetenv("NCCL_MULTI_RANK_GPU_ENABLE"); }
  } const unset;
  for (const int version : {22809, 23007}) {
    for (const bool enabled : {false, true}) {
      CAPTURE(version, enabled);
      fake_nccl::reset({.devices = 1, .version = version});
      if (enabled) {
        ::setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
      } else {
        ::unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
      }
      if (version < 23000 || !enabled) {
        CHECK_THROWS_WITH(Strategy(two_on_one, {}), Catch::Contains("NCCL_MULTI_RANK_GPU_ENABLE=1"));
        continue;
      }
      Strategy s{two_on_one, {}};
      check_in_place_sum(s, {0, 0}, 3);  // 3 everywhere
      CHECK(fake_nccl::snapshot().all_reduce_calls == 2);
      require_rules_kept();
    }
  }
  // The fake's own check: without the setting two ranks on one GPU fail their init.
  ::unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
  fake_nccl::reset({.devices = 1, .version = 23007});
  CHECK_THROWS_AS(comms_ptr({0, 0}), mirror::backend_error);
}
