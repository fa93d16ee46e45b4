// SPDX-License-Identifier: Apache-2.0
#pragma once
// printf-style formatting of error messages. A message built with a chain of std::string
// operator+ is a dozen temporaries, each with its own exception cleanup, inlined into every
// function that can throw: most of the object code of a translation unit that uses run and
// all_reduce, and a good part of its compile time. One out-of-line call formats it instead,
// and the formatting itself is the C library's.

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <string>
#include <mirror/detail/separate_compilation.hpp>

#if defined(__GNUC__)
#define MIRROR_DETAIL_FORMAT_ATTRIBUTES __attribute__((cold, noinline, format(printf, 1, 2)))
#else
#define MIRROR_DETAIL_FORMAT_ATTRIBUTES
#endif

namespace mirror::detail {

/// std::vsnprintf into a std::string: `format("replica %d", r)`. Use %s with .c_str() for
/// strings, %zu for std::size_t, %llu (with a cast) for 64-bit counters.
/// (Declared and defined in one: GCC warns of an inline definition after a noinline declaration.)
#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_FORMAT_ATTRIBUTES MIRROR_DETAIL_INLINE std::string format(const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, again);
  va_end(again);
  std::string out;
  if (n > 0) {
    out.resize(static_cast<std::size_t>(n));
    std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  }
  va_end(args);
  return out;
}
#else
MIRROR_DETAIL_FORMAT_ATTRIBUTES std::string format(const char* fmt, ...);
#endif

}  // namespace mirror::detail

#undef MIRROR_DETAIL_FORMAT_ATTRIBUTES
