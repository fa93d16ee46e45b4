// SPDX-License-Identifier: Apache-2.0
#pragma once
// The checkpoint checksum: CRC-32 (ISO-HDLC, zlib's crc32), computed by zlib.
//
// zlib's function is declared here, in a namespace of mirror's, rather than through <zlib.h>:
// every file that includes <mirror/mirror.hpp> reads this header, and <zlib.h> would give each
// of them FAR and OF macros and the global typedefs Byte, uInt, uLong, ... (a user's own `Byte`
// or `enum { NEAR, FAR }` would then break), and its parse. A C function declared in any
// namespace is the same function as zlib's ::crc32 ([dcl.link]), with zlib's prototype on every
// platform whose uLong, Bytef and uInt are unsigned long, unsigned char and unsigned int
// (tests/mirror/checkpoint_test.cpp includes both and compares them). Only a program that calls
// mirror::save or mirror::restore refers to it, so only such a program links zlib (-lz; Meson's
// mirror dependency and pkg-config's mirror.pc carry it, and the linker drops it elsewhere).

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mirror::detail {

namespace zlib {
extern "C" unsigned long crc32(unsigned long crc, const unsigned char* buf, unsigned int len);
}  // namespace zlib

#if __has_include(<zlib.h>)
inline constexpr bool have_zlib = true;
#else
inline constexpr bool have_zlib = false;
#endif

/// The CRC-32 of `n` bytes at `data` continuing `crc` (0 to start): zlib's crc32, in pieces its
/// `unsigned int` length can hold. A template only so that a program that never checkpoints
/// never instantiates it (and never needs zlib).
template <class Unused = void>
std::uint32_t crc32(std::uint32_t crc, const void* data, std::size_t n) noexcept {
  static_assert(have_zlib && std::is_void_v<Unused>,
                "mirror::save and mirror::restore checksum checkpoints with zlib's crc32: install zlib's "
                "development files (Debian: apt-get install zlib1g-dev) and link -lz");
  const auto* p = static_cast<const unsigned char*>(data);
  unsigned long c = crc;
  while (n > 0) {
    const std::size_t piece = n < (std::size_t{1} << 30) ? n : (std::size_t{1} << 30);
    c = zlib::crc32(c, p, static_cast<unsigned int>(piece));
    p += piece;
    n -= piece;
  }
  return static_cast<std::uint32_t>(c);
}

}  // namespace mirror::detail
