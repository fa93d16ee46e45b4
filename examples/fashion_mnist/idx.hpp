// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A reader for IDX files (the format of MNIST and Fashion-MNIST): a 4-byte magic
/// `0x00 0x00 TYPE NDIMS`, NDIMS big-endian uint32 dimensions, then the elements, row-major.
/// Only unsigned bytes (TYPE 0x08) are read, which is what the (Fashion-)MNIST files hold.
///
/// Standard library only. Compressed files (`.gz`, as Debian's `dataset-fashion-mnist` ships
/// them) are decompressed by a function the caller passes in (`gunzip.hpp` gives one, with zlib).
///
/// Every problem is an `idx_error` whose message names the file, says what is wrong and how to
/// get good files.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fashion_mnist {

/// What the messages tell the user to do about a missing or bad file.
inline constexpr const char* install_hint =
    "The Fashion-MNIST files come from Debian's dataset-fashion-mnist package: "
    "apt-get install dataset-fashion-mnist (they land in /usr/share/datasets/fashion-mnist); "
    "or pass --data DIR, a folder holding the four IDX files (.gz or uncompressed)";

/// A missing, unreadable or corrupt IDX file.
class idx_error : public std::runtime_error {
 public:
  idx_error(std::filesystem::path file, const std::string& problem)
      : std::runtime_error(file.string() + ": " + problem + ". " + install_hint), file_(std::move(file)) {}
  /// The file the problem is about.
  const std::filesystem::path& file() const noexcept { return file_; }

 private:
  std::filesystem::path file_;
};

/// The contents of an IDX file of unsigned bytes.
struct idx_array {
  std::vector<std::uint32_t> dims;  ///< e.g. {60000, 28, 28} for the training images
  std::vector<std::uint8_t> data;   ///< product(dims) elements, row-major
};

/// Decompresses a whole file's bytes; throws `idx_error` naming `file` on corrupt data.
using decompress_fn = std::function<std::vector<std::uint8_t>(std::span<const std::uint8_t> bytes,
                                                              const std::filesystem::path& file)>;

/// True when `bytes` start with the gzip magic (0x1f 0x8b).
inline bool is_gzip(std::span<const std::uint8_t> bytes) noexcept {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

/// Parses the bytes of an uncompressed IDX file. `file` only names it in errors.
inline idx_array parse_idx(std::span<const std::uint8_t> bytes, const std::filesystem::path& file) {
  if (bytes.size() < 4) {
    throw idx_error(file, "not an IDX file: " + std::to_string(bytes.size()) +
                              " bytes, shorter than the 4-byte magic number (truncated?)");
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    char seen[32];
    std::snprintf(seen, sizeof seen, "0x%02x 0x%02x", unsigned(bytes[0]), unsigned(bytes[1]));
    throw idx_error(file, std::string("not an IDX file: bad magic number (it starts with ") + seen +
                              ", an IDX file starts with 0x00 0x00" +
                              (is_gzip(bytes) ? "; this is gzip data, decompress it first" : "") + ")");
  }
  if (bytes[2] != 0x08) {
    char seen[8];
    std::snprintf(seen, sizeof seen, "0x%02x", unsigned(bytes[2]));
    throw idx_error(file, std::string("IDX element type ") + seen +
                              " is not supported: only unsigned bytes (0x08), as in the Fashion-MNIST files");
  }
  const std::size_t ndims = bytes[3];
  if (ndims == 0) throw idx_error(file, "corrupt IDX header: 0 dimensions");
  const std::size_t header = 4 + 4 * ndims;
  if (bytes.size() < header) {
    throw idx_error(file, "truncated: the header announces " + std::to_string(ndims) + " dimensions (" +
                              std::to_string(header) + " header bytes) but the file has " +
                              std::to_string(bytes.size()) + " bytes");
  }
  idx_array out;
  out.dims.resize(ndims);
  std::uint64_t count = 1;
  for (std::size_t d = 0; d < ndims; ++d) {
    const std::uint8_t* p = bytes.data() + 4 + 4 * d;
    out.dims[d] = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
                  std::uint32_t{p[3]};
    count *= out.dims[d];
    if (count > (std::uint64_t{1} << 40)) throw idx_error(file, "corrupt IDX header: absurd dimensions");
  }
  const std::size_t have = bytes.size() - header;
  if (have < count) {
    throw idx_error(file, "truncated: the header announces " + std::to_string(count) +
                              " bytes of data but the file holds " + std::to_string(have));
  }
  if (have > count) {
    throw idx_error(file, "corrupt: " + std::to_string(have - count) +
                              " bytes after the data that the header announces (" + std::to_string(count) + ")");
  }
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return out;
}

/// The bytes of `file`. Throws `idx_error` when it cannot be opened or read.
inline std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::error_code ec;
    const bool exists = std::filesystem::exists(file, ec);
    throw idx_error(file, std::string("cannot open: ") +
                              (exists ? std::strerror(err) : "no such file"));
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) throw idx_error(file, "cannot read: not a regular file");
  std::vector<std::uint8_t> bytes;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw idx_error(file, "cannot read: not a regular file");
  in.seekg(0, std::ios::beg);
  bytes.resize(static_cast<std::size_t>(size));
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size)) throw idx_error(file, "read error");
  return bytes;
}

/// Reads an IDX file of unsigned bytes. Gzip-compressed files (recognised by their magic, not by
/// the name) go through `gunzip`; without one they are an `idx_error` that says so.
inline idx_array read_idx(const std::filesystem::path& file, const decompress_fn& gunzip = {}) {
  std::vector<std::uint8_t> bytes = read_file_bytes(file);
  if (is_gzip(bytes)) {
    if (!gunzip) {
      throw idx_error(file, "gzip-compressed, and this reader was given no decompressor "
                            "(use fashion_mnist::read_idx(file, fashion_mnist::gunzip), gunzip.hpp)");
    }
    bytes = gunzip(bytes, file);
  }
  return parse_idx(bytes, file);
}

}  // namespace fashion_mnist
