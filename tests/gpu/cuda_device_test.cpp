// SPDX-License-Identifier: Apache-2.0
// devices::Cuda on a real GPU: device leaves reduced in place, errors, NCCL's refusal, and
// thrust::device_vector leaves from a file nvcc compiled with mirror (gpu/thrust_leaves.cu).
#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include "support/serial_fold.hpp"
#include <cuda_runtime_api.h>  // pinned and device memory for the staging cases
#include <atomic>
#include <cstdint>
#include <cstring>
#include <span>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>
#include "gpu/thrust_leaves.hpp"

using mirror::ReduceOp;

namespace {
// A copyable owning device leaf (what thrust::device_vector is, without needing nvcc here).
// Copies round-trip through the host: slow, but this file is compiled by g++.
struct gpu_vector {
  mirror::cuda::device_buffer<float> buffer;
  gpu_vector(int device, const std::vector<float>& host) : buffer(device, host.size()) { buffer.upload(host); }
  gpu_vector(const gpu_vector& o) : gpu_vector(o.buffer.device(), o.host()) {}
  gpu_vector& operator=(const gpu_vector& o) {
    if (this != &o) *this = gpu_vector(o);
    return *this;
  }
  gpu_vector(gpu_vector&&) noexcept = default;
  gpu_vector& operator=(gpu_vector&&) noexcept = default;
  std::vector<float> host() const {
    std::vector<float> h(buffer.size());
    buffer.download(h);
    return h;
  }
};
}  // namespace

template <>
struct mirror::leaf_traits<gpu_vector> {
  static constexpr bool is_leaf = true;
  using element_type = float;
  static constexpr int rank = 1;
  static constexpr bool is_view = false;
  static constexpr bool resizable = false;
  static constexpr bool device_resident = true;
  static std::span<float> elements(const gpu_vector& x) noexcept { return {x.buffer.data(), x.buffer.size()}; }
};

TEST_CASE("cuda: reduce of device-resident leaves runs on the devices and returns the result", "[cuda][device]") {
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = 3}};
  constexpr std::size_t n = 100003;
  const auto values = s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    return gpu_vector(s.runtime().device_of(r), std::vector<float>(n, float(r + 1)));
  });
  REQUIRE(s.reduce(ReduceOp::sum, values).host() == std::vector<float>(n, 6.0f));
  REQUIRE(s.reduce(ReduceOp::mean, values).host() == std::vector<float>(n, 2.0f));
  REQUIRE(s.reduce(ReduceOp::max, values).host() == std::vector<float>(n, 3.0f));
  // The components themselves are untouched (the reduction works in copies).
  for (int r = 0; r < 3; ++r) REQUIRE(values[static_cast<std::size_t>(r)].host() == std::vector<float>(n, float(r + 1)));
  // Inside a replica function a device reduce cannot start: ctx.all_reduce is the way.
  REQUIRE_THROWS_AS(s.run([&](auto& ctx) { (void)ctx.merge_call([&](auto& strategy, const auto&) {
                      return strategy.reduce(ReduceOp::sum, values).buffer.size(); }, 0); }),
                    mirror::error);
}

TEST_CASE("cuda: device_span leaves are reduced in place on logical devices sharing one GPU", "[cuda][device]") {
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = 4}};
  REQUIRE(s.num_replicas_in_sync() == 4);
  constexpr std::size_t n = (std::size_t{1} << 20) + 3;
  std::vector<mirror::cuda::device_buffer<float>> buffers;
  for (int r = 0; r < 4; ++r) {
    buffers.emplace_back(s.runtime().device_of(r), n);
    buffers.back().upload(std::vector<float>(n, float(r + 1)));
  }
  s.run([&](auto& ctx) {
    ctx.all_reduce(ReduceOp::sum, buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
  });
  for (auto& b : buffers) {
    std::vector<float> host(n);
    b.download(host);
    REQUIRE(host == std::vector<float>(n, 10.0f));
  }
}

TEST_CASE("cuda: logical replicas of one GPU fold in replica order, bitwise a serial loop's, for every op",
          "[cuda][device][fold]") {
  // ReductionToOneDevice folds each slice in one kernel when the replicas share a GPU. Floats of
  // mixed magnitudes: a sum in another order, or rounded otherwise, gives other bits.
  constexpr std::size_t n = (std::size_t{1} << 20) + 5;
  for (const int replicas : {2, 3, 5}) {
    mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{
        {.gpus = {0}, .replicas_per_gpu = replicas}};
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
      INFO("op " << static_cast<int>(op) << ", " << replicas << " replicas");
      std::vector<mirror::cuda::device_buffer<float>> buffers;
      for (int r = 0; r < replicas; ++r) {
        std::vector<float> host(n);
        for (std::size_t i = 0; i < n; ++i) host[i] = mirror::test::mixed_magnitude(r, i);
        buffers.emplace_back(s.runtime().device_of(r), n);
        buffers.back().upload(host);
      }
      s.run([&](auto& ctx) {
        ctx.all_reduce(op, buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
      });
      std::vector<float> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = mirror::test::serial_fold(op, replicas, i);
      for (auto& b : buffers) {
        std::vector<float> host(n);
        b.download(host);
        REQUIRE(std::memcmp(host.data(), want.data(), n * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("cuda: a replica that skips a collective is named in a timeout_error", "[cuda][device]") {
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{
      {.gpus = {0}, .replicas_per_gpu = 2, .timeout = std::chrono::seconds(2)}};
  try {
    s.run([](auto& ctx) {
      if (ctx.replica_id_in_sync_group() == 1) return;
      ctx.all_reduce(ReduceOp::sum, 1.0f);
    });
    FAIL("no timeout_error");
  } catch (const mirror::timeout_error& e) {
    REQUIRE(e.missing() == std::vector<int>{1});
  }
  const auto ok = s.run([](auto& ctx) { return ctx.all_reduce(ReduceOp::sum, 2); });
  REQUIRE(ok.primary() == 4);
}

TEST_CASE("cuda: a GPU that does not exist is an invalid_argument naming it", "[cuda][device]") {
  REQUIRE_THROWS_MATCHES((mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice>{{.gpus = {4096}}}), std::invalid_argument, mirror::test::what(Catch::Contains("GPU 4096 does not exist")));
}

#if MIRROR_HAS_NCCL
TEST_CASE("cuda: NcclAllReduce refuses several replicas on one GPU and names the policies that work",
          "[cuda][nccl_all_reduce]") {
  using S = mirror::Strategy<mirror::devices::Cuda, mirror::ops::NcclAllReduce>;
  REQUIRE_THROWS_MATCHES((S{{.gpus = {0}, .replicas_per_gpu = 2}}), std::invalid_argument, mirror::test::what(Catch::Contains("ReductionToOneDevice") && Catch::Contains("HierarchicalCopy")));
}

TEST_CASE("cuda: NcclAllReduce on every GPU reduces device leaves in place", "[cuda][nccl_all_reduce]") {
  // One rank per GPU: on a one-GPU machine a single-rank communicator, which runs the same NCCL
  // path (group, non-blocking enqueue, completion ring). A one-rank all-reduce returns its input,
  // so there the values alone cannot tell; NcclAllReduce::enqueued shows NCCL was handed both.
  using Nccl = mirror::ops::NcclAllReduce;
  mirror::Strategy<mirror::devices::Cuda, Nccl> s{};
  const int R = s.num_replicas_in_sync();
  constexpr std::size_t n = 4099;
  std::vector<mirror::cuda::device_buffer<double>> buffers;
  for (int r = 0; r < R; ++r) buffers.emplace_back(s.runtime().device_of(r), n);
  for (const auto op : {ReduceOp::sum, ReduceOp::max}) {
    for (int r = 0; r < R; ++r) buffers[static_cast<std::size_t>(r)].upload(std::vector<double>(n, double(r + 1)));
    s.run([&](auto& ctx) {
      ctx.all_reduce(op, buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
    });
    const double want = op == ReduceOp::sum ? double(R * (R + 1) / 2) : double(R);
    for (auto& b : buffers) {
      std::vector<double> host(n);
      b.download(host);
      REQUIRE(host == std::vector<double>(n, want));
    }
  }
  for (int r = 0; r < R; ++r) REQUIRE(Nccl::enqueued(s.runtime(), r) == 2);
  // Several leaves of two element types, packed: a mean of integers divides after NCCL's sum.
  std::vector<mirror::cuda::device_buffer<std::int32_t>> ints;
  for (int r = 0; r < R; ++r) {
    ints.emplace_back(s.runtime().device_of(r), 3);
    ints.back().upload(std::vector<std::int32_t>{10 * (r + 1), 7, -5});
  }
  s.run([&](auto& ctx) {
    const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
    ctx.all_reduce(ReduceOp::mean, std::tuple{ints[r].span(), buffers[r].span()});
  });
  std::vector<std::int32_t> got(3);
  ints[0].download(got);
  REQUIRE(got == std::vector<std::int32_t>{5 * (R + 1), 7, -5});
  for (int r = 0; r < R; ++r) REQUIRE(Nccl::enqueued(s.runtime(), r) == 4);  // one group per element type
}
#endif

TEST_CASE("cuda: half and bfloat16 device spans are reduced by the kernels", "[cuda][device]") {
  using mirror::cuda::bfloat16;
  using mirror::cuda::half;
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = 4}};
  constexpr std::size_t n = 4099;
  // IEEE half 1, 2, 3, 4 and their sum 10; bfloat16 (a float's top 16 bits) 1..4 and mean 2.5.
  const std::uint16_t half_bits[] = {0x3C00, 0x4000, 0x4200, 0x4400};
  const std::uint16_t bf16_bits[] = {0x3F80, 0x4000, 0x4040, 0x4080};
  std::vector<mirror::cuda::device_buffer<half>> h;
  std::vector<mirror::cuda::device_buffer<bfloat16>> b;
  for (int r = 0; r < 4; ++r) {
    h.emplace_back(s.runtime().device_of(r), n);
    h.back().upload(std::vector<half>(n, half{half_bits[r]}));
    b.emplace_back(s.runtime().device_of(r), n);
    b.back().upload(std::vector<bfloat16>(n, bfloat16{bf16_bits[r]}));
  }
  s.run([&](auto& ctx) {
    const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
    ctx.all_reduce(ReduceOp::sum, h[r].span());
    ctx.all_reduce(ReduceOp::mean, b[r].span());
  });
  for (int r = 0; r < 4; ++r) {
    std::vector<half> hh(n);
    std::vector<bfloat16> bb(n);
    h[static_cast<std::size_t>(r)].download(hh);
    b[static_cast<std::size_t>(r)].download(bb);
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(hh[i].bits == 0x4900);  // 10.0
      REQUIRE(bb[i].bits == 0x4020);  // 2.5
    }
  }
}

TEST_CASE("cuda: a shared host argument of run reaches each replica as a view of its own device copy",
          "[cuda][device][staged]") {
  // docs/cuda.md#host-arguments-of-run: copied once per call, into a buffer per replica; the views
  // are read back inside fn with a synchronous device-to-host copy (which waits for the replica's
  // stream).
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = 2}};
  std::vector<float> table(1000);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = float(i) * 0.5f;
  const std::tuple<std::vector<int>, float> pair{{1, 2, 3}, 4.0f};
  // Round 2 grows the table: the buffers are freed and reallocated (grow waits for the stream).
  for (int round = 0; round < 3; ++round) {
    if (round == 2) {
      table.resize(50000);
      for (std::size_t i = 0; i < table.size(); ++i) table[i] = float(i % 977) - 3.0f;
    }
    std::vector<std::vector<float>> seen(2);
    std::vector<std::vector<int>> seen_ints(2);
    std::vector<const void*> where(2);
    std::vector<float> scalars(2);
    s.run(
        [&](auto& ctx, mirror::cuda::device_span<const float> t, const std::tuple<mirror::cuda::device_span<const int>, float>& p) {
          // Catch2's assertions are not thread-safe: record here, check after run.
          const int r = ctx.replica_id_in_sync_group();
          auto& mine = seen[static_cast<std::size_t>(r)];
          mine.resize(t.size);
          where[static_cast<std::size_t>(r)] = t.data;
          mirror::cuda::impl::buffer_download(s.runtime().device_of(r), mine.data(), t.data, t.size * sizeof(float));
          auto& ints = seen_ints[static_cast<std::size_t>(r)];
          ints.resize(std::get<0>(p).size);
          scalars[static_cast<std::size_t>(r)] = std::get<1>(p);
          mirror::cuda::impl::buffer_download(s.runtime().device_of(r), ints.data(), std::get<0>(p).data,
                                              ints.size() * sizeof(int));
        },
        table, pair);
    REQUIRE(where[0] != where[1]);  // one copy per replica, even on the same GPU
    for (const auto& v : seen) REQUIRE(v == table);
    for (const auto& v : seen_ints) REQUIRE(v == std::get<0>(pair));
    REQUIRE(scalars == std::vector<float>{4.0f, 4.0f});
    for (float& x : table) x += 1.0f;  // the next run sees the new values
  }
}

TEST_CASE("cuda: staging from pinned memory is complete when run returns; device memory is viewed in place",
          "[cuda][device][staged]") {
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = 2}};
  constexpr std::size_t n = 1 << 22;  // 16 MiB: long enough for an unawaited copy to still be running
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)) == cudaSuccess);
  for (std::size_t i = 0; i < n; ++i) pinned[i] = float(i % 1021);
  std::vector<const float*> where(2);
  s.run([&](auto& ctx, mirror::cuda::device_span<const float> t) { where[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = t.data; },
        std::span<const float>(pinned, n));
  // run has returned: the program may overwrite its pinned data at once. (The buffers stay
  // intact until the strategy's next run, so the copies can be read back here.)
  for (std::size_t i = 0; i < n; ++i) pinned[i] = -1.0f;
  for (int r = 0; r < 2; ++r) {
    std::vector<float> back(n);
    mirror::cuda::impl::buffer_download(s.runtime().device_of(r), back.data(), where[static_cast<std::size_t>(r)],
                                        n * sizeof(float));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += back[i] != float(i % 1021);
    REQUIRE(wrong == 0);
  }
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);

  // A std::span over device memory is already readable by the device: no copy.
  float* device = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), 64 * sizeof(float)) == cudaSuccess);
  std::vector<const float*> seen(2);
  s.run([&](auto& ctx, mirror::cuda::device_span<const float> t) { seen[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = t.data; },
        std::span<const float>(device, 64));
  REQUIRE(seen[0] == device);
  REQUIRE(seen[1] == device);
  REQUIRE(cudaFree(device) == cudaSuccess);

  // Device views beside host arrays pass through unchanged (the host arrays are copied).
  static_assert(mirror::detail::staged_on_device<std::tuple<mirror::cuda::device_span<float>, std::vector<int>>>);
  static_assert(mirror::detail::staged_on_device<std::tuple<mirror::cuda::device_span<const float>, std::vector<int>>>);
  static_assert(!mirror::detail::staged_on_device<mirror::cuda::device_span<const float>>);
}

TEST_CASE("cuda: run gives the calling thread its device back and leaves no current stream",
          "[cuda][device]") {
  // The caller's thread runs replica 0 with that replica's device current; afterwards it is the
  // caller's again, and current_stream() is null, as its documentation says.
  const int gpus = mirror::cuda::device_count();
  const int last = gpus - 1;
  REQUIRE(cudaSetDevice(last) == cudaSuccess);
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = 2}};
  int device = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(device == last);  // construction too
  std::vector<void*> streams(2);
  const auto sums = s.run([&](auto& ctx) {
    streams[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = mirror::cuda::current_stream();
    // A buffer on another GPU made inside fn leaves the replica's device current for what follows.
    mirror::cuda::device_buffer<float> elsewhere(last, 16);
    elsewhere.upload(std::vector<float>(16, 1.0f));
    return ctx.all_reduce(ReduceOp::sum, 1.0f);
  });
  REQUIRE(sums.primary() == 2.0f);
  REQUIRE(streams[0] != nullptr);
  REQUIRE(streams[0] != streams[1]);
  REQUIRE(mirror::cuda::current_stream() == nullptr);
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(device == last);
  // The buffer helpers leave the caller's device alone too.
  mirror::cuda::device_buffer<float> b(0, 4);
  b.upload(std::vector<float>(4, 2.0f));
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(device == last);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("cuda: an error an earlier call left behind is not reported by the next kernel launch",
          "[cuda][device]") {
  mirror::Strategy<mirror::devices::Cuda, mirror::ops::ReductionToOneDevice> s{{.gpus = {0}, .replicas_per_gpu = 2}};
  std::vector<mirror::cuda::device_buffer<float>> buffers;
  for (int r = 0; r < 2; ++r) {
    buffers.emplace_back(0, 1000);
    buffers.back().upload(std::vector<float>(1000, float(r + 1)));
  }
  s.run([&](auto& ctx) {
    // A failed call leaves its (non-sticky) error as the thread's last error; the combine kernel's
    // launch check must not take it for its own.
    void* p = nullptr;
    (void)cudaMalloc(&p, std::size_t{1} << 62);
    ctx.all_reduce(ReduceOp::sum, buffers[static_cast<std::size_t>(ctx.replica_id_in_sync_group())].span());
  });
  std::vector<float> host(1000);
  buffers[1].download(host);
  REQUIRE(host == std::vector<float>(1000, 3.0f));
  // A thrown CUDA failure leaves nothing behind either.
  REQUIRE_THROWS_AS((mirror::cuda::device_buffer<float>(0, std::size_t{1} << 61)), mirror::backend_error);
  REQUIRE(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("cuda: thrust::device_vector leaves, from a .cu that includes mirror, are all-reduced on the GPU",
          "[cuda][thrust]") {
  for (const int R : {1, 2, 3}) {
    constexpr std::size_t n = 100003;
    const auto got = mirror::test::thrust_leaf_all_reduce(R, n);
    REQUIRE(got.ids.size() == static_cast<std::size_t>(R));
    // Replica r held 2 (r + 1) after its kernel; the sum over replicas is R (R + 1), the max 2R.
    for (int r = 0; r < R; ++r) {
      REQUIRE(got.ids[static_cast<std::size_t>(r)] == r);
      REQUIRE(got.own[static_cast<std::size_t>(r)] == std::vector<float>(n, 2.0f * float(r + 1)));
      REQUIRE(got.synced[static_cast<std::size_t>(r)] == std::vector<float>(n, float(R * (R + 1))));
    }
    REQUIRE(got.reduced == std::vector<float>(n, 2.0f * float(R)));
  }
}
