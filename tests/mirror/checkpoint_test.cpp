// SPDX-License-Identifier: Apache-2.0
// mirror/checkpoint.hpp in one process: save writes one file atomically, restore brings the
// values back (TF values_test testSaveAndRestoreOnRead: a SUM variable read 7 restores to 7).

#include <zlib.h>  // first: its crc32 and mirror's declaration of it must agree (mirror/detail/checksum.hpp)
#include <catch2/catch.hpp>
#include "support/matchers.hpp"
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>
#include <stdlib.h>  // mkdtemp
#include <mirror/mirror.hpp>

using mirror::VariableAggregation;
using S = mirror::Strategy<mirror::devices::Threads>;

namespace {
std::filesystem::path temp_dir() {
  char tmpl[] = "/tmp/mirror_checkpoint_test_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}
std::vector<char> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
void write_file(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
template <class T>
void append(std::vector<char>& out, const T& x) {
  out.insert(out.end(), reinterpret_cast<const char*>(&x), reinterpret_cast<const char*>(&x) + sizeof x);
}
// A leaf's record as both formats store it: {element kind, count} then the elements. The kind is
// (category << 8) | bytes, category 0 floating, 1 signed, 2 unsigned (detail::element_kind).
void append_leaf(std::vector<char>& out, std::uint64_t kind, const void* data, std::uint64_t count, std::size_t bytes) {
  append(out, kind);
  append(out, count);
  out.insert(out.end(), static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
}
}  // namespace

TEST_CASE("save then restore gives back every variable; sync-on-read sums restore to their read", "[checkpoint]") {
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  auto w = s.make_variable(std::vector<float>{1.f, 2.f}, VariableAggregation::sum);
  auto sum = s.make_sync_on_read_variable(0.0, VariableAggregation::sum);
  s.run([](auto& ctx, auto& a) { a.assign(ctx.replica_id_in_sync_group() == 0 ? 4.0 : 3.0); }, sum);
  REQUIRE(sum.value() == 7.0);
  mirror::save(s, path, w, sum);
  CHECK(std::filesystem::exists(path));
  CHECK(!std::filesystem::exists(path.string() + ".tmp"));
  w.assign(std::vector<float>{0.f, 0.f});
  sum.assign(0.0);
  mirror::restore(s, path, w, sum);
  for (const auto& c : S::local_results(w)) CHECK(c == std::vector<float>{1.f, 2.f});
  CHECK(sum.value() == 7.0);
  // TF's rule for an ON_READ SUM restore: each copy holds value / N.
  for (const double c : S::local_results(sum)) CHECK(c == 3.5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("save and restore report what went wrong and change nothing", "[checkpoint]") {
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  auto w = s.make_variable(std::vector<float>{1.f, 2.f}, VariableAggregation::sum);
  CHECK_THROWS_AS(mirror::save(s, dir / "missing" / "ckpt", w), mirror::backend_error);
  CHECK_THROWS_AS(mirror::restore(s, dir / "nothing_here", w), mirror::backend_error);
  {
    std::ofstream junk(dir / "junk");
    junk << "not a checkpoint";
  }
  CHECK_THROWS_AS(mirror::restore(s, dir / "junk", w), mirror::shape_error);
  mirror::save(s, dir / "ckpt", w);
  auto three = s.make_variable(std::vector<float>{0.f, 0.f, 0.f}, VariableAggregation::sum);
  try {
    mirror::restore(s, dir / "ckpt", three);
    FAIL("no shape_error");
  } catch (const mirror::shape_error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("the checkpoint holds 2 elements, the variable 3"));
  }
  CHECK(three.value() == std::vector<float>{0.f, 0.f, 0.f});
  auto ints = s.make_variable(std::vector<std::int32_t>{0, 0}, VariableAggregation::sum);
  CHECK_THROWS_MATCHES(mirror::restore(s, dir / "ckpt", ints), mirror::shape_error,
                       mirror::test::what(Catch::Contains("the checkpoint holds float32 elements, the variable int32")));
  CHECK(ints.value() == std::vector<std::int32_t>{0, 0});
  std::filesystem::remove_all(dir);
}

TEST_CASE("restore rejects a checkpoint with more data than the variables take", "[checkpoint][errors]") {
  // Issue 33: a tuple of two 5-float vectors restored into one 5-float vector succeeded and took
  // the first leaf. A checkpoint must match the variables exactly.
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  using Pair = std::tuple<std::vector<float>, std::vector<float>>;
  auto pair = s.make_variable(Pair{std::vector<float>(5, 1.5f), std::vector<float>(5, 2.5f)}, VariableAggregation::sum);
  mirror::save(s, path, pair);
  auto one = s.make_variable(std::vector<float>(5, 0.0f), VariableAggregation::sum);
  REQUIRE_THROWS_AS(mirror::restore(s, path, one), mirror::shape_error);
  REQUIRE_THROWS_MATCHES(mirror::restore(s, path, one), mirror::shape_error, mirror::test::what(Catch::Contains(path.string()) && Catch::Contains("more")));
  CHECK(one.value() == std::vector<float>(5, 0.0f));  // unchanged
  std::filesystem::remove_all(dir);
}

TEST_CASE("mirror's crc32 is zlib's", "[checkpoint][checksum]") {
  const char check[] = "123456789";  // CRC-32/ISO-HDLC's check value
  REQUIRE(mirror::detail::crc32(0, check, 9) == 0xCBF43926u);
  std::vector<unsigned char> bytes(100003);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + (i >> 7));
  const auto zlibs = ::crc32(0L, bytes.data(), static_cast<uInt>(bytes.size()));
  REQUIRE(mirror::detail::crc32(0, bytes.data(), bytes.size()) == zlibs);
  // in pieces: continued from the running value
  REQUIRE(mirror::detail::crc32(mirror::detail::crc32(0, bytes.data(), 4000), bytes.data() + 4000, bytes.size() - 4000) ==
          zlibs);
}

TEST_CASE("a checkpoint is version 2: a versioned header, the leaves, and a CRC-32 of every byte before it",
          "[checkpoint][format]") {
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  auto v = s.make_variable(std::vector<float>{1.5f, -2.0f, 3.25f}, VariableAggregation::sum);
  auto i = s.make_variable(std::int16_t{-7}, VariableAggregation::sum);
  mirror::save(s, path, v, i);
  // An independent writer of the documented layout gives the same bytes.
  std::vector<char> expected;
  expected.insert(expected.end(), {'M', 'I', 'R', 'R', 'O', 'R', 'C', '2'});
  append(expected, std::uint32_t{2});   // version
  append(expected, std::uint32_t{0});   // flags
  const std::uint64_t payload = (16 + 3 * 4) + (16 + 2);
  append(expected, payload);
  append(expected, std::uint64_t{2});   // variables
  const float floats[] = {1.5f, -2.0f, 3.25f};
  const std::int16_t value = -7;
  append_leaf(expected, 0 << 8 | 4, floats, 3, sizeof floats);
  append_leaf(expected, 1 << 8 | 2, &value, 1, sizeof value);
  append(expected, static_cast<std::uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(expected.data()),
                                                       static_cast<uInt>(expected.size()))));
  REQUIRE(read_file(path) == expected);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a flipped bit in a saved value is a shape_error, not a wrong value", "[checkpoint][checksum][errors]") {
  // Issue 33 #5: 1.5 came back as 1.50778198. Flip that bit of the saved 1.5f.
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  auto v = s.make_variable(std::vector<float>{0.0f, 1.5f}, VariableAggregation::sum);
  mirror::save(s, path, v);
  std::vector<char> bytes = read_file(path);
  const float x = 1.5f;
  const auto at = std::search(bytes.begin(), bytes.end(), reinterpret_cast<const char*>(&x),
                              reinterpret_cast<const char*>(&x) + sizeof x);
  REQUIRE(at != bytes.end());
  at[1] = static_cast<char>(at[1] ^ 0x20);  // 1.5f -> 1.50390625f
  write_file(path, bytes);
  auto back = s.make_variable(std::vector<float>{0.0f, 0.0f}, VariableAggregation::sum);
  REQUIRE_THROWS_AS(mirror::restore(s, path, back), mirror::shape_error);
  REQUIRE_THROWS_MATCHES(mirror::restore(s, path, back), mirror::shape_error, mirror::test::what(Catch::Contains("checksum mismatch") && Catch::Contains(path.string())));
  REQUIRE(back.value() == std::vector<float>{0.0f, 0.0f});
  std::filesystem::remove_all(dir);
}

TEST_CASE("a flipped bit anywhere in a checkpoint is a shape_error that says checksum mismatch and names the file",
          "[checkpoint][checksum][errors]") {
  // Issue 33 #5: a flipped bit in a payload restored a wrong value silently (1.5 came back as
  // 1.50778198). Every bit of a small checkpoint, one at a time: header, leaves and checksum.
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  const auto damaged = dir / "damaged";
  auto v = s.make_variable(std::vector<float>{1.5f, 2.5f}, VariableAggregation::sum);
  auto n = s.make_sync_on_read_variable(std::int32_t{0}, VariableAggregation::sum);
  s.run([](auto& ctx, auto& c) { c.assign(2 * (ctx.replica_id_in_sync_group() + 1)); }, n);  // reads 6
  mirror::save(s, path, v, n);
  const std::vector<char> good = read_file(path);
  auto v2 = s.make_variable(std::vector<float>{0.0f, 0.0f}, VariableAggregation::sum);
  auto n2 = s.make_sync_on_read_variable(std::int32_t{0}, VariableAggregation::sum);
  std::size_t checked = 0;
  for (std::size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      CAPTURE(byte, bit);
      std::vector<char> bad = good;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      write_file(damaged, bad);
      try {
        mirror::restore(s, damaged, v2, n2);
        FAIL("restored a damaged checkpoint");
      } catch (const mirror::shape_error& e) {
        REQUIRE_THAT(e.what(), Catch::Contains("checksum mismatch") && Catch::Contains(damaged.string()));
      }
      ++checked;
    }
  }
  REQUIRE(checked == 8 * good.size());
  REQUIRE(good.size() == 32 + (16 + 8) + (16 + 4) + 4);  // header, the two leaves, the CRC: all flipped
  REQUIRE(v2.value() == std::vector<float>{0.0f, 0.0f});  // nothing changed
  REQUIRE(n2.value() == 0);
  // Truncated anywhere: the same error.
  for (const std::size_t keep : {std::size_t{8}, std::size_t{31}, good.size() / 2, good.size() - 1}) {
    CAPTURE(keep);
    write_file(damaged, std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep)));
    REQUIRE_THROWS_AS(mirror::restore(s, damaged, v2, n2), mirror::shape_error);
    REQUIRE_THROWS_MATCHES(mirror::restore(s, damaged, v2, n2), mirror::shape_error, mirror::test::what(Catch::Contains("checksum mismatch")));
  }
  mirror::restore(s, path, v2, n2);  // the intact file still restores
  REQUIRE(v2.value() == std::vector<float>{1.5f, 2.5f});
  REQUIRE(n2.value() == 6);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a version-1 checkpoint (no checksum) still restores; a newer version is refused", "[checkpoint][format]") {
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "v1";
  // Version 1: "MIRRORC1", u64 variables, the leaves, nothing after them.
  std::vector<char> v1 = {'M', 'I', 'R', 'R', 'O', 'R', 'C', '1'};
  append(v1, std::uint64_t{2});
  const double weights[] = {0.25, -4.0};
  const std::int64_t steps = 1234;
  append_leaf(v1, 0 << 8 | 8, weights, 2, sizeof weights);
  append_leaf(v1, 1 << 8 | 8, &steps, 1, sizeof steps);
  write_file(path, v1);
  auto w = s.make_variable(std::vector<double>(2), VariableAggregation::mean);
  auto k = s.make_sync_on_read_variable(std::int64_t{0}, VariableAggregation::sum);
  mirror::restore(s, path, w, k);
  REQUIRE(w.value() == std::vector<double>{0.25, -4.0});
  REQUIRE(k.value() == 1234);
  for (const std::int64_t c : S::local_results(k)) REQUIRE(c == 617);  // a sum variable holds value / N
  // A version-1 file with bytes after its last variable is refused like any mismatch.
  std::vector<char> longer = v1;
  append(longer, std::uint32_t{0});
  write_file(path, longer);
  REQUIRE_THROWS_MATCHES(mirror::restore(s, path, w, k), mirror::shape_error, mirror::test::what(Catch::Contains("4 more bytes")));
  // Version 3 (a later mirror), with a valid checksum: refused, and said so.
  mirror::save(s, path, w, k);
  std::vector<char> v3 = read_file(path);
  v3[7] = '3';
  const std::uint32_t three = 3;
  std::memcpy(v3.data() + 8, &three, sizeof three);
  const auto crc = static_cast<std::uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(v3.data()),
                                                      static_cast<uInt>(v3.size() - 4)));
  std::memcpy(v3.data() + v3.size() - 4, &crc, sizeof crc);
  write_file(path, v3);
  REQUIRE_THROWS_AS(mirror::restore(s, path, w, k), mirror::shape_error);
  REQUIRE_THROWS_MATCHES(mirror::restore(s, path, w, k), mirror::shape_error, mirror::test::what(Catch::Contains("format version 3")));
  std::filesystem::remove_all(dir);
}

TEST_CASE("restore checks the number of variables, both ways", "[checkpoint][errors]") {
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  auto a = s.make_variable(1.0f, VariableAggregation::sum);
  auto b = s.make_variable(2.0f, VariableAggregation::sum);
  auto c = s.make_variable(3.0f, VariableAggregation::sum);
  mirror::save(s, path, a, b);
  REQUIRE_THROWS_AS(mirror::restore(s, path, a), mirror::shape_error);
  REQUIRE_THROWS_MATCHES(mirror::restore(s, path, a), mirror::shape_error, mirror::test::what(Catch::Contains("holds 2 variables but 1 were passed")));
  REQUIRE_THROWS_MATCHES(mirror::restore(s, path, a, b, c), mirror::shape_error, mirror::test::what(Catch::Contains("holds 2 variables but 3 were passed")));
  REQUIRE((a.value() == 1.0f && b.value() == 2.0f && c.value() == 3.0f));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a sync-on-read variable stores its aggregated read; with none, replica 0's copy", "[checkpoint][sync_on_read]") {
  // TF's rule (docs/guide.md#checkpoints): saving reads the variable in cross-replica context.
  // `none` cannot be combined, so its checkpoint holds the first replica's copy (never another
  // one's).
  S s{{.replicas = 3}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  auto none = s.make_sync_on_read_variable(0.0, VariableAggregation::none);
  auto mean = s.make_sync_on_read_variable(0.0, VariableAggregation::mean);
  auto first = s.make_sync_on_read_variable(0.0, VariableAggregation::only_first_replica);
  s.run(
      [](auto& ctx, auto& x, auto& y, auto& z) {
        const double r = ctx.replica_id_in_sync_group();
        x.assign(10 + r);
        y.assign(3 * r);   // 0, 3, 6: mean 3
        z.assign(7 - r);   // replica 0's: 7
      },
      none, mean, first);
  mirror::save(s, path, none, mean, first);
  auto as_plain = [&](double init) { return s.make_variable(init, VariableAggregation::sum); };
  auto n = as_plain(-1), m = as_plain(-1), f = as_plain(-1);
  mirror::restore(s, path, n, m, f);
  REQUIRE(n.value() == 10.0);
  REQUIRE(m.value() == 3.0);
  REQUIRE(f.value() == 7.0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a variable with an empty leaf saves and restores", "[checkpoint]") {
  // Found by tests/fuzz/restore_fuzz.cpp: restore copied an empty leaf with memcpy to its data()
  // (null for an empty std::vector), undefined behaviour that UBSan reports.
  S s{{.replicas = 2}};
  const auto dir = temp_dir();
  const auto path = dir / "ckpt";
  using Nest = std::tuple<std::vector<std::uint64_t>, float, std::vector<double>>;
  const Nest saved{std::vector<std::uint64_t>{}, 2.5f, std::vector<double>{}};
  auto v = s.make_variable(saved, VariableAggregation::sum);
  mirror::save(s, path, v);
  auto back = s.make_variable(Nest{std::vector<std::uint64_t>{}, 0.0f, std::vector<double>{}}, VariableAggregation::sum);
  mirror::restore(s, path, back);
  REQUIRE(back.value() == saved);
  std::filesystem::remove_all(dir);
}
