// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `fashion_mnist::gunzip`: decompresses a gzip file's bytes in memory with zlib (link `-lz`;
/// Meson: `dependency('zlib')`). Pass it to `read_idx(file, gunzip)`.

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <vector>
#include "idx.hpp"

namespace fashion_mnist {

/// The decompressed contents of the gzip data `bytes` (one member, as `gzip` writes it).
/// Throws `idx_error` naming `file` when the data is corrupt or truncated.
inline std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> bytes, const std::filesystem::path& file) {
  if (bytes.size() > std::numeric_limits<uInt>::max()) throw idx_error(file, "gzip file too large for zlib");
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) throw idx_error(file, "zlib: inflateInit2 failed");
  std::vector<std::uint8_t> out;
  // The gzip trailer ends with the uncompressed size mod 2^32: a good first guess, unless the
  // file is truncated or corrupt; deflate never expands more than 1032:1.
  std::size_t guess = bytes.size() * 4;
  if (bytes.size() >= 18) {
    const std::uint8_t* t = bytes.data() + bytes.size() - 4;
    guess = std::uint32_t{t[0]} | (std::uint32_t{t[1]} << 8) | (std::uint32_t{t[2]} << 16) | (std::uint32_t{t[3]} << 24);
    guess = std::min(guess, bytes.size() * 1032);
  }
  out.resize(guess + 1);  // +1: room to see the end of the stream without a second round
  zs.next_in = const_cast<Bytef*>(reinterpret_cast<const Bytef*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  int rc = Z_OK;
  std::size_t produced = 0;
  while (rc == Z_OK) {
    if (produced == out.size()) out.resize(out.size() * 2 + 1024);
    const std::size_t room = std::min<std::size_t>(out.size() - produced, std::numeric_limits<uInt>::max());
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out = static_cast<uInt>(room);
    rc = inflate(&zs, Z_NO_FLUSH);
    produced += room - zs.avail_out;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) break;  // input ran out before the end of the stream
    if (rc == Z_BUF_ERROR) rc = Z_OK;                    // only the output was full
  }
  const std::string msg = zs.msg != nullptr ? zs.msg : "";
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    throw idx_error(file, rc == Z_BUF_ERROR || rc == Z_OK
                              ? "corrupt gzip data: truncated (the compressed stream ends early)"
                              : "corrupt gzip data (zlib: " + (msg.empty() ? std::to_string(rc) : msg) + ")");
  }
  out.resize(produced);
  return out;
}

/// `read_idx(file, gunzip)`: reads an IDX file, compressed or not.
inline idx_array read_idx_file(const std::filesystem::path& file) { return read_idx(file, gunzip); }

}  // namespace fashion_mnist
