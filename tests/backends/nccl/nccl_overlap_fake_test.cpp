// SPDX-License-Identifier: Apache-2.0
// ctx.all_reduce_async on Strategy<devices::Cuda, ops::NcclAllReduce> without a GPU: the real
// cuda_runtime.cpp and nccl_comms.cpp against the scripted CUDA runtime and NCCL of
// tests/support/fake_nccl.cpp, three "GPUs" of host memory. Two things are checked:
// - results: the non-blocking form against the serial reference (tests/support/reference.hpp;
//   the fake folds ranks in order, so every op is exact) and against the blocking form's bits;
// - stream order, from the fake's log of what was enqueued on which stream and the events
//   between them: NCCL's work goes on the replica's communication stream, after the work fn
//   enqueued before the start; work fn enqueues between the start and wait() is ordered neither
//   way with it (it may run beside NCCL: the point of the communication stream); work after
//   wait() comes after all of it. A GPU runs what the log allows, so these are the guarantees.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <span>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>
#include "support/fake_nccl.hpp"
#include "support/reference.hpp"

using mirror::ReduceOp;

namespace {

constexpr int replicas = 3;
using nccl_strategy = mirror::Strategy<mirror::devices::Cuda, mirror::ops::NcclAllReduce>;

void require_rules_kept() {
  const auto r = fake_nccl::snapshot();
  for (const auto& v : r.violations) FAIL_CHECK(v);
  REQUIRE(r.violations.empty());
}

// Device memory of replica r's GPU holding `v` (the fake's device memory is host memory).
template <class T>
mirror::cuda::device_buffer<T> on_gpu(int r, const std::vector<T>& v) {
  mirror::cuda::device_buffer<T> b(r, v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b.data()[i] = v[i];
  return b;
}
template <class T>
std::vector<T> read(const mirror::cuda::device_buffer<T>& b) {
  return {b.data(), b.data() + b.size()};
}
template <class T>
mirror::cuda::device_span<T> span_of(mirror::cuda::device_buffer<T>& b) {
  return {b.data(), b.size()};
}

// The entries of the stream log on `stream` that say `what`.
std::vector<std::size_t> entries(const void* stream, const std::string& what) {
  const auto log = fake_nccl::stream_log();
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < log.size(); ++i) {
    if (log[i].stream == stream && log[i].what == what) out.push_back(i);
  }
  return out;
}

}  // namespace

TEST_CASE("nccl (fake GPUs): all_reduce_async gives the serial reference and the blocking form's bits; device and "
          "host leaves, one leaf and several, every op and pack count, three outstanding waited out of order",
          "[cuda][nccl][fake][async]") {
  fake_nccl::reset({.devices = replicas});
  for (const int packs : {1, 0, 2}) {
    nccl_strategy s{{.gpus = {0, 1, 2}}, mirror::ops::NcclAllReduce{.num_packs = packs}};
    for (const auto op : mirror::test::all_ops) {
      CAPTURE(packs, mirror::to_string(op));
      const std::size_t n = 7, m = 5;
      const auto want_a = mirror::test::nccl_reference<float>(op, replicas, n);
      const auto want_b = mirror::test::nccl_reference<std::int64_t>(op, replicas, m);
      const auto want_h = mirror::test::nccl_reference<double>(op, replicas, m + 1);
      std::array<std::vector<float>, replicas> got_a, blocking_a;
      std::array<std::vector<std::int64_t>, replicas> got_b;
      std::array<std::vector<double>, replicas> got_h;
      s.run([&](auto& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        const auto u = static_cast<std::size_t>(r);
        auto a = on_gpu(r, mirror::test::input_vector<float>(op, r, n));
        auto b = on_gpu(r, mirror::test::input_vector<std::int64_t>(op, r, m));
        auto a2 = on_gpu(r, mirror::test::input_vector<float>(op, r, n));
        // Two element types (two parts, each its own NCCL group), a staged host leaf, one leaf.
        auto p1 = ctx.all_reduce_async(op, std::tuple{span_of(a), span_of(b)});
        auto p2 = ctx.all_reduce_async(op, mirror::test::input_vector<double>(op, r, m + 1));
        auto p3 = ctx.all_reduce_async(op, span_of(a2));
        (void)p3.wait();
        got_h[u] = p2.wait().get();
        (void)p1.wait();
        got_a[u] = read(a);
        got_b[u] = read(b);
        auto c = on_gpu(r, mirror::test::input_vector<float>(op, r, n));
        (void)ctx.all_reduce(op, span_of(c));
        blocking_a[u] = read(c);
        REQUIRE(read(a2) == blocking_a[u]);
      });
      for (int r = 0; r < replicas; ++r) {
        CAPTURE(r);
        const auto u = static_cast<std::size_t>(r);
        CHECK(got_a[u] == want_a);
        CHECK(got_a[u] == blocking_a[u]);
        CHECK(got_b[u] == want_b);
        CHECK(got_h[u] == want_h);
      }
    }
  }
  CHECK(fake_nccl::snapshot().all_reduce_calls > 0);
  require_rules_kept();
}

TEST_CASE("nccl (fake GPUs): a started all-reduce runs on the communication stream, after fn's earlier work, beside "
          "fn's later kernels, and before anything fn enqueues after wait()",
          "[cuda][nccl][fake][async]") {
  fake_nccl::reset({.devices = replicas});
  nccl_strategy s{{.gpus = {0, 1, 2}}, mirror::ops::NcclAllReduce{}};
  std::array<std::size_t, replicas> before{}, between{}, after{}, after_blocking{};
  std::array<const void*, replicas> compute{};
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    const auto u = static_cast<std::size_t>(r);
    const void* stream = mirror::cuda::current_stream();
    compute[u] = stream;
    auto a = on_gpu(r, std::vector<float>(64, 1.0f));
    auto b = on_gpu(r, std::vector<float>(32, 2.0f));
    auto c = on_gpu(r, std::vector<float>(16, 3.0f));
    before[u] = fake_nccl::enqueue_marker(stream, "backward of the last layer");
    auto first = ctx.all_reduce_async(ReduceOp::sum, std::tuple{span_of(a), span_of(b)});  // packed
    between[u] = fake_nccl::enqueue_marker(stream, "backward of the next layer");
    auto second = ctx.all_reduce_async(ReduceOp::sum, span_of(c));
    // A blocking collective of the same communicator while two are outstanding: the fake checks
    // that each NCCL call is ordered after the communicator's previous one.
    auto d = on_gpu(r, std::vector<float>(12, 1.0f));
    (void)ctx.reduce_scatter(ReduceOp::sum, span_of(d));
    (void)second.wait();  // completes `first` too (in start order)
    after[u] = fake_nccl::enqueue_marker(stream, "optimizer step");
    (void)first.wait();
    (void)ctx.all_reduce(ReduceOp::sum, span_of(c));
    after_blocking[u] = fake_nccl::enqueue_marker(stream, "after the blocking all-reduce");
    REQUIRE(read(a) == std::vector<float>(64, 3.0f));
    REQUIRE(read(b) == std::vector<float>(32, 6.0f));
    REQUIRE(read(c) == std::vector<float>(16, 27.0f));
  });
  const void* comm[replicas];
  for (int r = 0; r < replicas; ++r) comm[r] = s.runtime().comm_stream_of(r);
  for (int r = 0; r < replicas; ++r) {
    CAPTURE(r);
    const auto u = static_cast<std::size_t>(r);
    CHECK(comm[r] != compute[u]);
    CHECK(entries(compute[u], "ncclAllReduce").empty());  // nothing of NCCL's on the replica's stream
    const auto nccl = entries(comm[r], "ncclAllReduce");
    const auto copies = entries(comm[r], "cudaMemcpyAsync");  // the pack of a and b, and its unpack
    REQUIRE(nccl.size() == 3);
    REQUIRE(copies.size() == 4);
    const std::size_t first = nccl[0], second = nccl[1], blocking = nccl[2];
    // After the work before the start; the pack first, the unpack after NCCL.
    CHECK(fake_nccl::happens_before(before[u], copies[0]));
    CHECK(fake_nccl::happens_before(before[u], first));
    CHECK(fake_nccl::happens_before(copies[1], first));
    CHECK(fake_nccl::happens_before(first, copies[2]));
    // Beside the kernels enqueued between start and wait: ordered neither way.
    for (const std::size_t x : {first, copies[3]}) {
      CHECK_FALSE(fake_nccl::happens_before(x, between[u]));
      CHECK_FALSE(fake_nccl::happens_before(between[u], x));
    }
    // The second started collective comes after the first (one stream), and after the work
    // enqueued before it started.
    CHECK(fake_nccl::happens_before(copies[3], second));
    CHECK(fake_nccl::happens_before(between[u], second));
    // Everything before what fn enqueues after wait().
    for (const std::size_t x : {first, copies[3], second}) CHECK(fake_nccl::happens_before(x, after[u]));
    // The blocking form: after what came before, before what comes after.
    CHECK(fake_nccl::happens_before(after[u], blocking));
    CHECK(fake_nccl::happens_before(blocking, after_blocking[u]));
  }
  require_rules_kept();
}

TEST_CASE("nccl (fake GPUs): reduce_scatter and all_gather run on the communication stream, ordered like a blocking "
          "call",
          "[cuda][nccl][fake][async]") {
  fake_nccl::reset({.devices = replicas});
  nccl_strategy s{{.gpus = {0, 1, 2}}, mirror::ops::NcclAllReduce{}};
  std::array<std::size_t, replicas> m0{}, m1{}, m2{};
  std::array<const void*, replicas> compute{};
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    const auto u = static_cast<std::size_t>(r);
    compute[u] = mirror::cuda::current_stream();
    auto a = on_gpu(r, std::vector<float>(7, 1.0f));  // ragged: through the communication scratch
    m0[u] = fake_nccl::enqueue_marker(compute[u], "before");
    (void)ctx.reduce_scatter_async(ReduceOp::sum, span_of(a)).wait();
    m1[u] = fake_nccl::enqueue_marker(compute[u], "between");
    (void)ctx.all_gather(std::vector<float>(2, static_cast<float>(r)), mirror::axis0);
    m2[u] = fake_nccl::enqueue_marker(compute[u], "after");
  });
  for (int r = 0; r < replicas; ++r) {
    CAPTURE(r);
    const auto u = static_cast<std::size_t>(r);
    const void* comm = s.runtime().comm_stream_of(r);
    const auto rs = entries(comm, "ncclReduceScatter");
    const auto ag = entries(comm, "ncclAllGather");
    REQUIRE(rs.size() == 1);
    REQUIRE(ag.size() == 1);
    CHECK(fake_nccl::happens_before(m0[u], rs[0]));
    CHECK(fake_nccl::happens_before(rs[0], m1[u]));
    CHECK(fake_nccl::happens_before(m1[u], ag[0]));
    CHECK(fake_nccl::happens_before(ag[0], m2[u]));
  }
  require_rules_kept();
}

TEST_CASE("nccl (fake GPUs): a started reduce-scatter runs on the communication stream beside fn's work until "
          "wait(), and gives each replica its cut of the serial reference",
          "[cuda][nccl][fake][async]") {
  fake_nccl::reset({.devices = replicas});
  nccl_strategy s{{.gpus = {0, 1, 2}}, mirror::ops::NcclAllReduce{}};
  constexpr std::size_t n = 7;  // ragged: through the communication scratch and its copies
  const auto want = mirror::test::nccl_reference<float>(ReduceOp::sum, replicas, n);
  std::array<std::size_t, replicas> before{}, between{}, after{};
  std::array<std::vector<float>, replicas> got;
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    const auto u = static_cast<std::size_t>(r);
    const void* stream = mirror::cuda::current_stream();
    auto a = on_gpu(r, mirror::test::input_vector<float>(ReduceOp::sum, r, n));
    before[u] = fake_nccl::enqueue_marker(stream, "backward of the last layer");
    auto p = ctx.reduce_scatter_async(ReduceOp::sum, span_of(a));
    between[u] = fake_nccl::enqueue_marker(stream, "backward of the next layer");
    const auto cut = p.wait();
    after[u] = fake_nccl::enqueue_marker(stream, "optimizer step on the cut");
    got[u].assign(cut.data, cut.data + cut.size);  // (the fake GPU's memory is host memory)
  });
  for (int r = 0; r < replicas; ++r) {
    CAPTURE(r);
    const auto u = static_cast<std::size_t>(r);
    const auto rs = entries(s.runtime().comm_stream_of(r), "ncclReduceScatter");
    REQUIRE(rs.size() == 1);
    CHECK(fake_nccl::happens_before(before[u], rs[0]));
    CHECK_FALSE(fake_nccl::happens_before(rs[0], between[u]));
    CHECK_FALSE(fake_nccl::happens_before(between[u], rs[0]));
    CHECK(fake_nccl::happens_before(rs[0], after[u]));
    const auto cut = mirror::backend::cut_of(n, replicas, r);
    CHECK(got[u] == std::vector<float>(want.begin() + static_cast<std::ptrdiff_t>(cut.first),
                                       want.begin() + static_cast<std::ptrdiff_t>(cut.first + cut.second)));
  }
  require_rules_kept();
}

TEST_CASE("nccl (fake GPUs): sharded gradient buckets of GPU leaves reduce-scatter each leaf in place, one NCCL "
          "call each, no copy of a divisible leaf, and leave each replica its cuts of the serial reference",
          "[cuda][nccl][fake][async]") {
  fake_nccl::reset({.devices = replicas});
  nccl_strategy s{{.gpus = {0, 1, 2}}, mirror::ops::NcclAllReduce{}};
  // One flat buffer cut into layers of 6, 3 and 12 floats (multiples of 3: no padding copies).
  const std::size_t sizes[] = {6, 3, 12}, offsets[] = {0, 6, 9}, flat = 21;
  const auto want = mirror::test::nccl_reference<float>(ReduceOp::sum, replicas, flat);
  std::array<std::vector<float>, replicas> got;
  std::array<std::size_t, replicas> buckets{};
  const int calls_before = fake_nccl::snapshot().reduce_scatter_calls;
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    const auto u = static_cast<std::size_t>(r);
    auto a = on_gpu(r, mirror::test::input_vector<float>(ReduceOp::sum, r, flat));
    using view = mirror::cuda::device_span<float>;
    std::tuple<view, view, view> grads{view{a.data(), sizes[0]}, view{a.data() + 6, sizes[1]},
                                       view{a.data() + 9, sizes[2]}};
    auto g = ctx.gradient_buckets(ReduceOp::sum, grads, std::size_t{1} << 20, mirror::sharded);
    buckets[u] = g.num_buckets();
    for (const std::size_t leaf : {2, 1, 0}) g.ready(leaf);
    (void)g.finish();
    got[u] = read(a);
  });
  for (int r = 0; r < replicas; ++r) {
    CAPTURE(r);
    const auto u = static_cast<std::size_t>(r);
    CHECK(buckets[u] == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      const auto cut = mirror::backend::cut_of(sizes[k], replicas, r);
      for (std::size_t i = cut.first; i < cut.first + cut.second; ++i) {
        CHECK(got[u][offsets[k] + i] == want[offsets[k] + i]);
      }
    }
  }
  CHECK(fake_nccl::snapshot().reduce_scatter_calls - calls_before == 3 * replicas);
  for (const auto& e : fake_nccl::stream_log()) CHECK(e.what != "cudaMemcpyAsync");
  require_rules_kept();
}

TEST_CASE("nccl (fake GPUs): a started all-reduce dropped without wait() is still joined before fn's later work "
          "reaches the end of run",
          "[cuda][nccl][fake][async]") {
  fake_nccl::reset({.devices = replicas});
  nccl_strategy s{{.gpus = {0, 1, 2}}, mirror::ops::NcclAllReduce{}};
  std::array<std::size_t, replicas> after{};
  std::array<std::vector<float>, replicas> got;
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    const auto u = static_cast<std::size_t>(r);
    auto a = on_gpu(r, std::vector<float>(8, 1.0f));
    { auto dropped = ctx.all_reduce_async(ReduceOp::sum, span_of(a)); }
    after[u] = fake_nccl::enqueue_marker(mirror::cuda::current_stream(), "after the handle went");
    got[u] = read(a);
  });
  for (int r = 0; r < replicas; ++r) {
    CAPTURE(r);
    const auto nccl = entries(s.runtime().comm_stream_of(r), "ncclAllReduce");
    REQUIRE(nccl.size() == 1);
    CHECK(fake_nccl::happens_before(nccl[0], after[static_cast<std::size_t>(r)]));
    CHECK(got[static_cast<std::size_t>(r)] == std::vector<float>(8, 3.0f));
  }
  require_rules_kept();
}

TEST_CASE("nccl (fake GPUs): gradient buckets of GPU leaves reduce runs of adjacent leaves in place, one NCCL "
          "all-reduce each, cut where a leaf lies elsewhere, and equal the serial reference",
          "[cuda][nccl][fake][async]") {
  fake_nccl::reset({.devices = replicas});
  nccl_strategy s{{.gpus = {0, 1, 2}}, mirror::ops::NcclAllReduce{}};
  // Leaves 0-3 are one flat buffer cut into layers of 6, 2, 10 and 4 floats; leaf 4 is a buffer
  // of its own. With 40-byte buckets (10 floats), backwards: {3, 2} is 14 floats, but leaf 4 lies
  // elsewhere, so it is a bucket alone; then {3, 2}, then {1, 0}.
  const std::size_t sizes[] = {6, 2, 10, 4};
  const std::size_t flat = 22, other = 5;
  const auto want_flat = mirror::test::nccl_reference<float>(ReduceOp::sum, replicas, flat);
  const auto want_other = mirror::test::nccl_reference<float>(ReduceOp::sum, replicas, other);
  std::array<std::vector<float>, replicas> got_flat, got_other;
  std::array<std::size_t, replicas> buckets{};
  const int before = fake_nccl::snapshot().all_reduce_calls;
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    const auto u = static_cast<std::size_t>(r);
    auto a = on_gpu(r, mirror::test::input_vector<float>(ReduceOp::sum, r, flat));
    auto b = on_gpu(r, mirror::test::input_vector<float>(ReduceOp::sum, r, other));
    using view = mirror::cuda::device_span<float>;
    std::tuple<view, view, view, view, view> grads{view{a.data(), sizes[0]}, view{a.data() + 6, sizes[1]},
                                                   view{a.data() + 8, sizes[2]}, view{a.data() + 18, sizes[3]},
                                                   view{b.data(), other}};
    auto g = ctx.gradient_buckets(ReduceOp::sum, grads, 10 * sizeof(float));
    buckets[u] = g.num_buckets();
    REQUIRE(g.bucket_of(4) == 0);
    REQUIRE(g.bucket_of(3) == 1);
    REQUIRE(g.bucket_of(2) == 1);
    REQUIRE(g.bucket_of(1) == 2);
    REQUIRE(g.bucket_of(0) == 2);
    for (const std::size_t leaf : {4, 3, 2, 1, 0}) g.ready(leaf);
    (void)g.finish();
    got_flat[u] = read(a);
    got_other[u] = read(b);
  });
  for (int r = 0; r < replicas; ++r) {
    CAPTURE(r);
    const auto u = static_cast<std::size_t>(r);
    CHECK(buckets[u] == 3);
    CHECK(got_flat[u] == want_flat);
    CHECK(got_other[u] == want_other);
  }
  // One NCCL all-reduce per bucket and replica, and no copy on any stream: nothing was packed.
  CHECK(fake_nccl::snapshot().all_reduce_calls - before == 3 * replicas);
  for (const auto& e : fake_nccl::stream_log()) CHECK(e.what != "cudaMemcpyAsync");
  require_rules_kept();
}
