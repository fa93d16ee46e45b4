// SPDX-License-Identifier: Apache-2.0
#pragma once
// <mpi.h> without Open MPI's and MPICH's deprecated C++ bindings: mirror uses the C API only,
// so programs need not link libmpi_cxx.

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
