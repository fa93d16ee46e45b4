// SPDX-License-Identifier: Apache-2.0
#pragma once
// printf-style formatting of error messages, into a C string on the heap: one out-of-line call
// per message instead of a chain of std::string temporaries inlined into every function that
// can throw, and no std::string (mirror::error takes a detail::message). Why:
// docs/design.md#compile-time.

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
