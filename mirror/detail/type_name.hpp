// SPDX-License-Identifier: Apache-2.0
#pragma once
// Readable type names for error messages.

#include <cstdlib>
#include <cstring>
#include <string>
#include <typeinfo>
#include <mirror/detail/format.hpp>
#include <mirror/detail/separate_compilation.hpp>
#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#define MIRROR_HAS_CXXABI 1
#endif

namespace mirror::detail {

/// The demangled name of a mangled type name (`typeid(T).name()`), or the name itself where it
/// does not demangle. A detail::message, so that the error paths that name types need no
/// std::string (detail/format.hpp says why).
[[gnu::cold]] MIRROR_DETAIL_INLINE message demangle(const char* mangled);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE message demangle(const char* mangled) {
#ifdef MIRROR_HAS_CXXABI
  int status = 0;
  char* readable = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);  // std::malloc'd
  if (status == 0 && readable != nullptr) return message(readable);
  std::free(readable);
#endif
  const std::size_t n = std::strlen(mangled) + 1;
  char* copy = static_cast<char*>(std::malloc(n));
  if (copy != nullptr) std::memcpy(copy, mangled, n);
  return message(copy);
}
#endif

template <class T>
std::string type_name() {
  return demangle(typeid(T).name()).c_str();
}

}  // namespace mirror::detail
