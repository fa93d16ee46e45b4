// SPDX-License-Identifier: Apache-2.0
// libmirror_threads: the parts of mirror a program built with MIRROR_SEPARATE_COMPILATION
// takes from a library instead of compiling them in every translation unit
// (mirror/detail/separate_compilation.hpp says which and why). Header-only programs do not
// need it. This file only instantiates: every definition is in the headers, where
// MIRROR_DETAIL_BUILDING_LIBRARY makes the non-template ones ordinary (non-inline) functions,
// and every element-type instantiation is listed there (MIRROR_DETAIL_*_INSTANCES).

#define MIRROR_DETAIL_BUILDING_LIBRARY 1

// Everything <mirror/mirror.hpp> brings, so that no MIRROR_DETAIL_INLINE definition is left out
// (a program in separate mode would not link). Backends' own code (CUDA, MPI) is not compiled
// here: their headers declare functions of their own libraries, and nothing here calls them.
#include <mirror/mirror.hpp>

namespace mirror::detail {
const int link_libmirror_threads_for_MIRROR_SEPARATE_COMPILATION = 1;

MIRROR_DETAIL_FOR_EACH_HOST_ELEMENT(MIRROR_DETAIL_ELEMENT_OPS_INSTANCES, template)
}  // namespace mirror::detail

namespace mirror::ops {
MIRROR_DETAIL_CHUNK_OWNER_INSTANCES(template)
}  // namespace mirror::ops
