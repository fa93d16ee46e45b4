// SPDX-License-Identifier: Apache-2.0
// gpu_info: what the GPU kit found on this machine, from the libraries the kit's programs load
// themselves (the same search path run.sh sets): the driver and the CUDA runtime (linked in
// statically), NCCL (ncclGetVersion) and cuBLAS (cublasGetProperty) with the file each was
// loaded from, and every visible GPU. Exit 0 with a GPU, 77 without one (after the versions).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>
#include <nccl.h>
#include <cstdio>
#include <cstring>

namespace {

// The file a function of a shared library was loaded from.
const char* file_of(const void* function) {
  Dl_info info{};
  if (dladdr(function, &info) == 0 || info.dli_fname == nullptr) return "?";
  return info.dli_fname;
}

// The path of the loaded driver library (libcuda.so.1), which cudart opens at run time.
int find_libcuda(dl_phdr_info* info, std::size_t, void* out) {
  if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "libcuda.so") != nullptr) {
    *static_cast<const char**>(out) = info->dlpi_name;
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  int runtime = 0, driver = 0, count = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  const cudaError_t driver_error = cudaDriverGetVersion(&driver);
  const cudaError_t count_error = cudaGetDeviceCount(&count);
  std::printf("CUDA runtime %d.%d (linked statically)\n", runtime / 1000, runtime % 1000 / 10);
  if (driver_error == cudaSuccess && driver > 0) {
    std::printf("CUDA driver API %d.%d\n", driver / 1000, driver % 1000 / 10);
  } else {
    std::printf("CUDA driver: none (%s)\n",
                driver_error != cudaSuccess ? cudaGetErrorString(driver_error) : "no libcuda.so.1 could be loaded");
  }
  const char* libcuda = nullptr;
  dl_iterate_phdr(find_libcuda, &libcuda);
  std::printf("libcuda: %s\n", libcuda != nullptr ? libcuda : "not loaded");
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    std::printf("NCCL %d.%d.%d from %s\n", nccl / 10000, nccl % 10000 / 100, nccl % 100,
                file_of(reinterpret_cast<const void*>(&ncclGetVersion)));
  }
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    std::printf("cuBLAS %d.%d.%d from %s\n", major, minor, patch,
                file_of(reinterpret_cast<const void*>(&cublasGetProperty)));
  }
  if (count_error != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
                count_error != cudaSuccess ? cudaGetErrorString(count_error) : "0 devices");
    return 77;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    std::printf("GPU %d: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB\n", d, p.name, p.major, p.minor,
                p.multiProcessorCount, double(p.totalGlobalMem) / (1 << 30), p.l2CacheSize >> 20);
  }
  return 0;
}
