// SPDX-License-Identifier: Apache-2.0
// Host arguments of run on a device whose memory the replicas' threads cannot read
// (docs/cuda.md#host-arguments-of-run, mirror/detail/staged_argument.hpp): mirror::test::FakeDevice
// keeps each replica's buffers in its own arena, so a view into the wrong arena, a missed copy or a
// stale buffer shows up here, without a GPU. devices::Cuda runs the same code with cudaMemcpyAsync.

#include <boost/hana/define_struct.hpp>
#include <boost/hana/string.hpp>
#include <boost/hana/tuple.hpp>
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#include <mirror/mirror.hpp>
#include "support/fake_device.hpp"
#include "support/fake_device_vector.hpp"

namespace {

using mirror::test::FakeDevice;
using Strategy = mirror::Strategy<FakeDevice, mirror::ops::ReductionToOneDevice>;
template <class E>
using view = mirror::test::fake_view<E>;

struct Batch {
  BOOST_HANA_DEFINE_STRUCT(Batch, (std::vector<float>, images), (std::vector<int>, labels), (float, scale));
};

struct Settings {  // scalars only: nothing to copy
  BOOST_HANA_DEFINE_STRUCT(Settings, (float, lr), (int, step));
};

constexpr int replicas = 3;

enum class Mode { train, eval };

// A Hana struct with an enum and a pointer beside its arrays: both pass as scalars.
struct Step {
  BOOST_HANA_DEFINE_STRUCT(Step, (std::vector<float>, weights), (Mode, mode), (const int*, counter));
};

// The elements behind a staged view, read while fn runs: the views are valid only during the
// call (the next run reuses the buffers).
template <class E>
std::vector<std::remove_const_t<E>> elements_of(Strategy& s, const view<E>& v) {
  const auto e = s.runtime().read(v);
  return {e.begin(), e.end()};
}

}  // namespace

TEST_CASE("a shared std::vector reaches every replica as a view of its own device copy", "[staged]") {
  Strategy s{FakeDevice{.replicas = replicas}};
  const std::vector<float> table{1.5f, -2.0f, 3.25f, 4.0f};
  std::vector<int> on_replica(replicas, -1);
  std::vector<std::vector<float>> got(replicas);
  const long copies_before = s.runtime().copies();
  s.run(
      [&](auto& ctx, const auto& t) {
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(t)>, view<const float>>);
        const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
        on_replica[r] = t.data.replica;
        got[r] = elements_of(s, t);
      },
      table);
  CHECK(s.runtime().copies() - copies_before == replicas);  // once per replica per call
  for (int r = 0; r < replicas; ++r) {
    CHECK(on_replica[static_cast<std::size_t>(r)] == r);  // on that replica's device
    CHECK(got[static_cast<std::size_t>(r)] == table);
  }
}

TEST_CASE("later runs reuse the staging buffers and see the new host values", "[staged]") {
  Strategy s{FakeDevice{.replicas = replicas}};
  std::vector<int> values{1, 2, 3};
  std::vector<std::vector<int>> got(replicas);
  auto grab = [&](auto& ctx, const view<const int>& v) {
    got[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = elements_of(s, v);
  };
  s.run(grab, values);
  for (const auto& c : got) CHECK(c == values);
  const long buffers = s.runtime().argument_buffers();
  CHECK(buffers == replicas);
  values = {7, 8, 9};
  s.run(grab, values);
  CHECK(s.runtime().argument_buffers() == buffers);  // same size: no new buffer
  for (const auto& c : got) CHECK(c == values);
  values.assign(1000, 5);
  s.run(grab, values);
  CHECK(s.runtime().argument_buffers() == 2 * buffers);  // grown once per replica
  for (const auto& c : got) CHECK(c == values);
  values.clear();
  s.run(grab, values);
  for (const auto& c : got) CHECK(c.empty());
}

TEST_CASE("matrices and matrix views arrive flat; enums and pointers pass as scalars", "[staged]") {
  Strategy s{FakeDevice{.replicas = replicas}};
  const mirror::matrix<float> m{{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}, 3};
  const mirror::matrix_view<const float> rows = m.view().subrows(1, 1);  // {4, 5, 6}: not a leaf, still staged
  const int counter = 42;
  const Step step{{0.5f, -0.5f}, Mode::eval, &counter};
  std::mutex mu;
  std::vector<std::vector<float>> whole, second_row, weights;
  std::vector<int> modes_ok, pointers_ok;
  s.run(
      [&](auto& ctx, const auto& mat, const auto& row, const auto& st) {
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(mat)>, view<const float>>);
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(row)>, view<const float>>);
        const auto& w = st[BOOST_HANA_STRING("weights")];
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(w)>, view<const float>>);
        const int r = ctx.replica_id_in_sync_group();
        std::lock_guard lock(mu);
        whole.push_back(elements_of(s, mat));
        second_row.push_back(elements_of(s, row));
        weights.push_back(elements_of(s, w));
        modes_ok.push_back(st[BOOST_HANA_STRING("mode")] == Mode::eval && mat.data.replica == r && w.data.replica == r);
        pointers_ok.push_back(st[BOOST_HANA_STRING("counter")] == &counter);
      },
      m, rows, step);
  REQUIRE(whole.size() == replicas);
  for (std::size_t i = 0; i < replicas; ++i) {
    CHECK(whole[i] == m.data);  // rows * cols, row-major
    CHECK(second_row[i] == std::vector<float>{4.0f, 5.0f, 6.0f});
    CHECK(weights[i] == step.weights);
    CHECK(modes_ok[i] == 1);
    CHECK(pointers_ok[i] == 1);
  }
  // What decides staging, at compile time.
  static_assert(mirror::detail::staged_on_device<mirror::matrix_view<const float>>);
  static_assert(mirror::detail::staged_on_device<Step>);
  static_assert(mirror::detail::staging_refused<std::tuple<std::vector<float>, std::string>>);
  static_assert(!mirror::detail::staged_on_device<std::tuple<Mode, int>>);  // scalars only: as is
  static_assert(!mirror::detail::staged_on_device<std::string>);
  // An owning device container keeps its nest as it is (nothing refused, nothing copied).
  using with_device_owner = std::tuple<FakeDeviceVector, std::vector<float>>;
  static_assert(!mirror::detail::staged_on_device<with_device_owner> &&
                !mirror::detail::staging_refused<with_device_owner>);
}

TEST_CASE("nests keep their shape: arrays become views, scalars stay values", "[staged]") {
  Strategy s{FakeDevice{.replicas = replicas}};
  const std::tuple<std::vector<int>, double, std::array<float, 3>> tup{{4, 5}, 0.25, {1.0f, 2.0f, 3.0f}};
  const Batch batch{{0.5f, 0.25f}, {3, 1, 4}, 2.0f};
  const boost::hana::tuple<std::vector<double>, int> htup{{9.0, 8.0}, 7};
  const std::vector<double> backing{1.0, 2.0, 3.0};
  const std::span<const double> ro{backing};  // not a leaf (const), still staged
  // With an empty std::array of nests beside it (nothing to stage there, but it keeps its type).
  const std::tuple<std::array<std::pair<std::vector<float>, int>, 2>, std::array<std::tuple<std::vector<int>>, 0>> arr_and_empty{
      {{{{1.0f}, 1}, {{2.0f, 2.0f}, 2}}}, {}};
  const auto& arr = std::get<0>(arr_and_empty);

  std::mutex m;
  std::vector<std::vector<int>> tup_ints, batch_labels;
  std::vector<std::vector<float>> tup_floats, batch_images, arr1;
  std::vector<std::vector<double>> htup_doubles, ro_doubles, scalars;
  std::vector<bool> on_own_device;
  s.run(
      [&](auto& ctx, const auto& t, const auto& b, const auto& h, const auto& sp, const auto& ae) {
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(t)>,
                                     std::tuple<view<const int>, double, view<const float>>>);
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(h)>, boost::hana::tuple<view<const double>, int>>);
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(sp)>, view<const double>>);
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(ae)>,
                                     std::tuple<std::array<std::pair<view<const float>, int>, 2>,
                                                std::array<std::tuple<view<const int>>, 0>>>);
        const auto& a = std::get<0>(ae);
        const auto& images = b[BOOST_HANA_STRING("images")];
        const auto& labels = b[BOOST_HANA_STRING("labels")];
        const float scale = b[BOOST_HANA_STRING("scale")];
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(images)>, view<const float>>);
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(labels)>, view<const int>>);
        const int r = ctx.replica_id_in_sync_group();
        const bool own = std::get<0>(t).data.replica == r && std::get<2>(t).data.replica == r &&
                         images.data.replica == r && labels.data.replica == r &&
                         boost::hana::at_c<0>(h).data.replica == r && sp.data.replica == r &&
                         a[0].first.data.replica == r && a[1].first.data.replica == r;
        // Catch2's assertions are not thread-safe: record here, check after run.
        std::lock_guard lock(m);
        on_own_device.push_back(own);
        scalars.push_back({std::get<1>(t), scale, double(boost::hana::at_c<1>(h)), double(a[1].second)});
        auto to_vec = [&](auto v) {
          const auto e = s.runtime().read(v);
          return std::vector<std::remove_const_t<typename decltype(e)::element_type>>(e.begin(), e.end());
        };
        tup_ints.push_back(to_vec(std::get<0>(t)));
        tup_floats.push_back(to_vec(std::get<2>(t)));
        batch_images.push_back(to_vec(images));
        batch_labels.push_back(to_vec(labels));
        htup_doubles.push_back(to_vec(boost::hana::at_c<0>(h)));
        ro_doubles.push_back(to_vec(sp));
        arr1.push_back(to_vec(a[1].first));
      },
      tup, batch, htup, ro, arr_and_empty);
  REQUIRE(tup_ints.size() == replicas);
  for (int r = 0; r < replicas; ++r) {
    const auto i = static_cast<std::size_t>(r);
    CHECK(on_own_device[i]);
    CHECK(scalars[i] == std::vector<double>{0.25, 2.0, 7.0, 2.0});
    CHECK(tup_ints[i] == std::get<0>(tup));
    CHECK(tup_floats[i] == std::vector<float>(std::get<2>(tup).begin(), std::get<2>(tup).end()));
    CHECK(batch_images[i] == batch.images);
    CHECK(batch_labels[i] == batch.labels);
    CHECK(htup_doubles[i] == boost::hana::at_c<0>(htup));
    CHECK(ro_doubles[i] == backing);
    CHECK(arr1[i] == arr[1].first);
  }
}

TEST_CASE("what is not a host array nest reaches fn unchanged", "[staged]") {
  Strategy s{FakeDevice{.replicas = replicas}};
  const Settings settings{0.1f, 3};
  const std::string name = "not a nest";
  const long copies_before = s.runtime().copies();
  std::atomic<int> same{0};
  s.run(
      [&](const Settings& st, const std::string& n) {
        // scalars only: nothing to copy, the host object itself
        if (&st == &settings && &n == &name) ++same;
      },
      settings, name);
  CHECK(same == replicas);
  CHECK(s.runtime().copies() == copies_before);

  // PerReplica and Mirrored components stay host values (fn reads them on the host); only
  // shared arguments are staged.
  mirror::PerReplica<std::vector<float>> per(std::vector<std::vector<float>>(replicas, std::vector<float>{1.0f}));
  s.run([&](std::vector<float>& mine) { mine[0] += 1.0f; }, per);
  for (const auto& c : s.local_results(per)) CHECK(c[0] == 2.0f);
}

TEST_CASE("on host devices nothing is staged", "[staged]") {
  mirror::Strategy<mirror::devices::Threads> s{mirror::devices::Threads{.replicas = 2}};
  const std::vector<float> table{1.0f, 2.0f};
  std::atomic<int> same{0};
  s.run([&](const std::vector<float>& t) { same += &t == &table; }, table);
  CHECK(same == 2);
}
