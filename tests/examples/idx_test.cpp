// SPDX-License-Identifier: Apache-2.0
// examples/fashion_mnist/idx.hpp and dataset.hpp: the IDX reader and the Fashion-MNIST loader,
// against small files this test writes to a temporary folder, and their errors (missing file,
// bad magic, unsupported type, truncated or trailing data, files that disagree).
//
// Built twice: in catch_tests (tests/meson.build, standard library only), and by
// examples/meson.build with zlib and FASHION_MNIST_TEST_GZIP=1, which adds the gzip cases
// (the Debian package ships .gz files).

#include <catch2/catch.hpp>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <unistd.h>
#include <vector>
#include "examples/fashion_mnist/dataset.hpp"
#include "examples/fashion_mnist/idx.hpp"
#if FASHION_MNIST_TEST_GZIP
#include <zlib.h>
#include "examples/fashion_mnist/gunzip.hpp"
#endif

namespace fs = std::filesystem;
using fashion_mnist::idx_error;
using bytes = std::vector<std::uint8_t>;

namespace {

/// A fresh folder under the system's temporary directory, removed with its contents.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("mirror_idx_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const bytes& content) const {
    const fs::path p = path / name;
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
    return p;
  }
};

/// An IDX file of unsigned bytes with the given dimensions and data.
bytes idx_bytes(std::initializer_list<std::uint32_t> dims, const bytes& data) {
  bytes b{0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) {
    b.push_back(static_cast<std::uint8_t>(d >> 24));
    b.push_back(static_cast<std::uint8_t>(d >> 16));
    b.push_back(static_cast<std::uint8_t>(d >> 8));
    b.push_back(static_cast<std::uint8_t>(d));
  }
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

bytes iota_bytes(std::size_t n, std::uint8_t start = 0) {
  bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(start + i);
  return b;
}

/// The message of the idx_error that `f` throws; fails the test when it throws nothing.
template <class F>
std::string idx_error_of(F&& f, const fs::path& expected_file) {
  try {
    f();
  } catch (const idx_error& e) {
    CHECK(e.file() == expected_file);
    return e.what();
  }
  FAIL("no idx_error thrown");
  return {};
}

}  // namespace

TEST_CASE("read_idx reads dimensions (big-endian) and data", "[examples][idx]") {
  temp_dir dir;
  SECTION("1-D labels") {
    const auto file = dir.write("labels", idx_bytes({5}, {3, 1, 4, 1, 5}));
    const auto a = fashion_mnist::read_idx(file);
    CHECK(a.dims == std::vector<std::uint32_t>{5});
    CHECK(a.data == bytes{3, 1, 4, 1, 5});
  }
  SECTION("3-D images, a dimension above 255") {
    const auto file = dir.write("images", idx_bytes({2, 300, 3}, iota_bytes(2 * 300 * 3)));
    const auto a = fashion_mnist::read_idx(file);
    CHECK(a.dims == std::vector<std::uint32_t>{2, 300, 3});
    REQUIRE(a.data.size() == 1800);
    CHECK(a.data[0] == 0);
    CHECK(a.data[1799] == static_cast<std::uint8_t>(1799));
  }
  SECTION("an empty array") {
    const auto a = fashion_mnist::read_idx(dir.write("empty", idx_bytes({0, 28, 28}, {})));
    CHECK(a.dims == std::vector<std::uint32_t>{0, 28, 28});
    CHECK(a.data.empty());
  }
}

TEST_CASE("read_idx errors name the file and the package to install", "[examples][idx]") {
  temp_dir dir;
  const std::string hint = "apt-get install dataset-fashion-mnist";

  SECTION("missing file") {
    const auto file = dir.path / "train-images-idx3-ubyte.gz";
    const std::string msg = idx_error_of([&] { fashion_mnist::read_idx(file); }, file);
    CHECK_THAT(msg, Catch::Contains(file.string()) && Catch::Contains("no such file") && Catch::Contains(hint));
  }
  SECTION("bad magic") {
    const auto file = dir.write("bad", bytes{0x01, 0x02, 0x08, 0x01, 0, 0, 0, 1, 7});
    const std::string msg = idx_error_of([&] { fashion_mnist::read_idx(file); }, file);
    CHECK_THAT(msg, Catch::Contains(file.string()) && Catch::Contains("bad magic") &&
                        Catch::Contains("0x01 0x02") && Catch::Contains(hint));
  }
  SECTION("unsupported element type") {
    const auto file = dir.write("floats", bytes{0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0});
    CHECK_THAT(idx_error_of([&] { fashion_mnist::read_idx(file); }, file),
               Catch::Contains("0x0d") && Catch::Contains("not supported"));
  }
  SECTION("shorter than the magic") {
    const auto file = dir.write("tiny", bytes{0, 0});
    CHECK_THAT(idx_error_of([&] { fashion_mnist::read_idx(file); }, file), Catch::Contains("truncated"));
  }
  SECTION("truncated header") {
    const auto file = dir.write("header", bytes{0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0});
    CHECK_THAT(idx_error_of([&] { fashion_mnist::read_idx(file); }, file),
               Catch::Contains("truncated") && Catch::Contains("3 dimensions"));
  }
  SECTION("truncated data") {
    bytes b = idx_bytes({4, 28, 28}, iota_bytes(4 * 784));
    b.resize(b.size() - 100);
    const auto file = dir.write("short", b);
    CHECK_THAT(idx_error_of([&] { fashion_mnist::read_idx(file); }, file),
               Catch::Contains("truncated") && Catch::Contains("3136 bytes") && Catch::Contains("3036"));
  }
  SECTION("trailing data") {
    bytes b = idx_bytes({3}, {1, 2, 3});
    b.push_back(9);
    const auto file = dir.write("long", b);
    CHECK_THAT(idx_error_of([&] { fashion_mnist::read_idx(file); }, file),
               Catch::Contains("corrupt") && Catch::Contains("1 bytes after the data"));
  }
  SECTION("gzip data without a decompressor") {
    const auto file = dir.write("compressed.gz", bytes{0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 3});
    CHECK_THAT(idx_error_of([&] { fashion_mnist::read_idx(file); }, file), Catch::Contains("gzip-compressed"));
  }
  SECTION("a directory") {
    const auto sub = dir.path / "folder";
    fs::create_directories(sub);
    CHECK_THROWS_AS(fashion_mnist::read_idx(sub), idx_error);
  }
}

TEST_CASE("load_split reads images and labels and checks that the two files agree", "[examples][idx]") {
  temp_dir dir;
  bytes pixels(3 * 784);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>((i * 7) % 256);
  dir.write("train-images-idx3-ubyte", idx_bytes({3, 28, 28}, pixels));

  SECTION("good files") {
    dir.write("train-labels-idx1-ubyte", idx_bytes({3}, {9, 0, 4}));
    const auto s = fashion_mnist::load_split(dir.path, "train", 0, {});
    REQUIRE(s.rows == 3);
    CHECK(s.images == pixels);
    CHECK(s.labels == std::vector<std::int32_t>{9, 0, 4});

    const auto two = fashion_mnist::load_split(dir.path, "train", 2, {});
    CHECK(two.rows == 2);
    CHECK(two.images == bytes(pixels.begin(), pixels.begin() + 2 * 784));
    CHECK(two.labels == std::vector<std::int32_t>{9, 0});
  }
  SECTION("the error for a missing split names the .gz file the package ships") {
    const auto file = dir.path / "t10k-images-idx3-ubyte.gz";
    CHECK_THAT(idx_error_of([&] { fashion_mnist::load_split(dir.path, "t10k", 0, {}); }, file),
               Catch::Contains("apt-get install dataset-fashion-mnist"));
  }
  SECTION("label count differs from image count") {
    const auto labels = dir.write("train-labels-idx1-ubyte", idx_bytes({2}, {1, 2}));
    CHECK_THAT(idx_error_of([&] { fashion_mnist::load_split(dir.path, "train", 0, {}); }, labels),
               Catch::Contains("2 labels for 3 images"));
  }
  SECTION("a label that is not a class") {
    const auto labels = dir.write("train-labels-idx1-ubyte", idx_bytes({3}, {1, 10, 2}));
    CHECK_THAT(idx_error_of([&] { fashion_mnist::load_split(dir.path, "train", 0, {}); }, labels),
               Catch::Contains("label 10 at index 1"));
  }
  SECTION("images of the wrong shape") {
    const auto images = dir.write("train-images-idx3-ubyte", idx_bytes({2, 28, 27}, bytes(2 * 28 * 27)));
    dir.write("train-labels-idx1-ubyte", idx_bytes({2}, {1, 2}));
    CHECK_THAT(idx_error_of([&] { fashion_mnist::load_split(dir.path, "train", 0, {}); }, images),
               Catch::Contains("N x 28 x 28") && Catch::Contains("2 x 28 x 27"));
  }
}

#if FASHION_MNIST_TEST_GZIP
namespace {
bytes gzip_bytes(const bytes& raw) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  bytes out(deflateBound(&zs, static_cast<uLong>(raw.size())) + 64);
  zs.next_in = const_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}
}  // namespace

TEST_CASE("read_idx with gunzip reads .gz files and reports corrupt ones", "[examples][idx][gzip]") {
  temp_dir dir;
  const bytes raw = idx_bytes({5, 28, 28}, iota_bytes(5 * 784));
  const bytes gz = gzip_bytes(raw);
  REQUIRE(fashion_mnist::is_gzip(gz));

  SECTION("round trip") {
    const auto a = fashion_mnist::read_idx_file(dir.write("a.gz", gz));
    CHECK(a.dims == std::vector<std::uint32_t>{5, 28, 28});
    CHECK(a.data == iota_bytes(5 * 784));
    // An uncompressed file goes through the same call.
    CHECK(fashion_mnist::read_idx_file(dir.write("a", raw)).data == a.data);
  }
  SECTION("truncated gzip") {
    const auto file = dir.write("short.gz", bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
    CHECK_THAT(idx_error_of([&] { fashion_mnist::read_idx_file(file); }, file),
               Catch::Contains("truncated") && Catch::Contains("apt-get install dataset-fashion-mnist"));
  }
  SECTION("corrupt gzip") {
    bytes bad = gz;
    for (std::size_t i = 12; i < 40 && i < bad.size(); ++i) bad[i] ^= 0x5a;
    const auto file = dir.write("bad.gz", bad);
    CHECK_THAT(idx_error_of([&] { fashion_mnist::read_idx_file(file); }, file), Catch::Contains("corrupt gzip"));
  }
  SECTION("load_split prefers the .gz files the package ships") {
    dir.write("t10k-images-idx3-ubyte.gz", gz);
    dir.write("t10k-labels-idx1-ubyte.gz", gzip_bytes(idx_bytes({5}, {0, 1, 2, 3, 4})));
    dir.write("t10k-labels-idx1-ubyte", bytes{1, 2, 3});  // garbage: never read
    const auto s = fashion_mnist::load_split(dir.path, "t10k", 0, fashion_mnist::gunzip);
    CHECK(s.rows == 5);
    CHECK(s.labels == std::vector<std::int32_t>{0, 1, 2, 3, 4});
    CHECK(s.images == iota_bytes(5 * 784));
  }
}
#endif
