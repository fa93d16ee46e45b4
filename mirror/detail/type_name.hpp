// SPDX-License-Identifier: Apache-2.0
#pragma once
// Readable type names for error messages.

#include <cstdlib>
#include <mirror/detail/lean_std.hpp>  // <algorithm>, <chrono>, <memory>: the parts used
#include <string>
#include <typeinfo>
#include <mirror/detail/separate_compilation.hpp>
#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#define MIRROR_HAS_CXXABI 1
#endif

namespace mirror::detail {

MIRROR_DETAIL_INLINE std::string demangle(const char* mangled);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE std::string demangle(const char* mangled) {
#ifdef MIRROR_HAS_CXXABI
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> p(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                           std::free);
  if (status == 0 && p) return p.get();
#endif
  return mangled;
}
#endif

template <class T>
std::string type_name() {
  return demangle(typeid(T).name());
}

}  // namespace mirror::detail
