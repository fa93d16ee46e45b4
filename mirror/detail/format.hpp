// SPDX-License-Identifier: Apache-2.0
#pragma once
// printf-style formatting of error messages, into a C string on the heap. A message built with
// a chain of std::string operator+ is a dozen temporaries, each with its own exception cleanup,
// inlined into every function that can throw: most of the object code of a translation unit
// that uses run and all_reduce, and a good part of its compile time. One out-of-line call
// formats it instead, and the formatting itself is the C library's. The result is no
// std::string either: every header-only translation unit would compile std::string's inline
// members (growth, construction from a pointer) for the error paths alone, while an
// exception's constructor copies a `const char*` just as well (mirror::error takes a
// detail::message). Why this matters: docs/design.md#compile-time.

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <mirror/detail/separate_compilation.hpp>

#if defined(__GNUC__)
#define MIRROR_DETAIL_FORMAT_ATTRIBUTES __attribute__((cold, noinline, format(printf, 1, 2)))
#else
#define MIRROR_DETAIL_FORMAT_ATTRIBUTES
#endif

namespace mirror::detail {

/// A NUL-terminated message that owns its heap buffer (std::malloc'd; nullptr reads as ""):
/// what detail::format and detail::demangle return. Move-only.
class message {
 public:
  message() noexcept = default;
  /// Takes ownership of `text`, which std::malloc (or the C library for it) allocated.
  explicit message(char* text) noexcept : text_(text) {}
  message(message&& other) noexcept : text_(other.text_) { other.text_ = nullptr; }
  message& operator=(message&& other) noexcept {
    char* const old = text_;
    text_ = other.text_;
    other.text_ = nullptr;
    std::free(old);
    return *this;
  }
  ~message() { std::free(text_); }

  const char* c_str() const noexcept { return text_ != nullptr ? text_ : ""; }

 private:
  char* text_ = nullptr;
};

/// std::vsnprintf into a detail::message: `format("replica %d", r)`. Use %s with .c_str() for
/// strings, %zu for std::size_t, %llu (with a cast) for 64-bit counters. (Out of memory gives
/// an empty message: an error path must not throw std::bad_alloc instead of its error.)
/// (Declared and defined in one: GCC warns of an inline definition after a noinline declaration.)
#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_FORMAT_ATTRIBUTES MIRROR_DETAIL_INLINE message format(const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, again);
  va_end(again);
  char* text = n >= 0 ? static_cast<char*>(std::malloc(static_cast<std::size_t>(n) + 1)) : nullptr;
  if (text != nullptr) std::vsnprintf(text, static_cast<std::size_t>(n) + 1, fmt, args);
  va_end(args);
  return message(text);
}
#else
MIRROR_DETAIL_FORMAT_ATTRIBUTES message format(const char* fmt, ...);
#endif

}  // namespace mirror::detail

#undef MIRROR_DETAIL_FORMAT_ATTRIBUTES
