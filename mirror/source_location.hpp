// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::source_location`: the call site a collective takes as a defaulted last argument
/// (docs/errors.md\#call-sites). `std::source_location` where the standard library has it; else
/// (Clang 14 with libstdc++, which lacks the builtin libstdc++'s needs) a type with the same
/// members used here, filled by the compilers' `__builtin_FILE` and `__builtin_LINE`, so that a
/// program compiles and names call sites the same way with either.

#if __has_include(<source_location>)
#include <source_location>
#endif
#include <cstdint>

namespace mirror {

#if defined(__cpp_lib_source_location)
using source_location = std::source_location;
#else
/// A call site: file and line (this standard library has no `std::source_location`).
class source_location {
 public:
  /// The call site of the expression that calls it as a default argument.
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           std::uint_least32_t line = __builtin_LINE()) noexcept {
    source_location here;
    here.file_ = file;
    here.line_ = line;
    return here;
  }
  constexpr source_location() noexcept = default;
  /// The file, as the compiler was given it ("" when unknown).
  constexpr const char* file_name() const noexcept { return file_; }
  /// The function (not recorded here: "").
  constexpr const char* function_name() const noexcept { return ""; }
  /// The line (0 when unknown).
  constexpr std::uint_least32_t line() const noexcept { return line_; }
  /// The column (not recorded here: 0).
  constexpr std::uint_least32_t column() const noexcept { return 0; }

 private:
  const char* file_ = "";
  std::uint_least32_t line_ = 0;
};
#endif

}  // namespace mirror
