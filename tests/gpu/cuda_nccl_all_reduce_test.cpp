// SPDX-License-Identifier: Apache-2.0
// The conformance suite (tests/conformance/all_reduce_suite.hpp) for mirror::devices::Cuda with mirror::ops::NcclAllReduce{.num_packs = 2}.
#include "gpu/cuda_support.hpp"
// NCCL needs one GPU per replica: counts above the GPU count are skipped.
#define CONFORMANCE_SUPPORTS(R) ((R) <= mirror::cuda::device_count())
// mean on floats is ncclAvg, which NCCL computes as a sum of inputs pre-multiplied by 1/R: the
// suite checks it against that formula's rounding, not bit for bit (CONFORMANCE_MEAN_IS_PREMUL_SUM).
#define CONFORMANCE_MEAN_IS_PREMUL_SUM 1
#define CONFORMANCE_DEVICE mirror::devices::Cuda
#define CONFORMANCE_OPS mirror::ops::NcclAllReduce{.num_packs = 2}
#define CONFORMANCE_TAG "[cuda][nccl_all_reduce]"

#include "conformance/all_reduce_suite.hpp"
