// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the Fashion-MNIST example's IDX reader (examples/fashion_mnist/idx.hpp) on
// arbitrary bytes, gzip-compressed (gunzip.hpp, zlib) when they start with gzip's magic.
//
// Oracle: the reader either throws fashion_mnist::idx_error or returns an array whose
// dimensions are the header's (big-endian, one per announced dimension, none of them making the
// element count overflow) and whose data is exactly the bytes after the header, as many as the
// dimensions' product. Anything else (another exception, a crash, a sanitizer report) is a
// finding.
//
//   tests/fuzz/run_fuzz.sh idx SECONDS
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>
#include "../../examples/fashion_mnist/gunzip.hpp"
#include "../../examples/fashion_mnist/idx.hpp"

namespace {
[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "idx_fuzz: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> input(data, size);
  std::vector<std::uint8_t> bytes;
  fashion_mnist::idx_array got;
  try {
    bytes = fashion_mnist::is_gzip(input) ? fashion_mnist::gunzip(input, "fuzz input")
                                          : std::vector<std::uint8_t>(input.begin(), input.end());
    got = fashion_mnist::parse_idx(bytes, "fuzz input");
  } catch (const fashion_mnist::idx_error&) {
    return 0;
  }
  // Accepted: the header announces what came back.
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08) finding("accepted a bad magic");
  const std::size_t ndims = bytes[3];
  if (ndims == 0 || got.dims.size() != ndims) finding("wrong number of dimensions");
  const std::size_t header = 4 + 4 * ndims;
  if (bytes.size() < header) finding("accepted a truncated header");
  std::uint64_t count = 1;
  for (std::size_t d = 0; d < ndims; ++d) {
    std::uint32_t dim = 0;
    for (int k = 0; k < 4; ++k) dim = dim << 8 | bytes[4 + 4 * d + static_cast<std::size_t>(k)];
    if (got.dims[d] != dim) finding("a dimension differs from the header's");
    count *= dim;
  }
  if (got.data.size() != count || bytes.size() - header != count) finding("data size is not the dimensions' product");
  if (!std::equal(got.data.begin(), got.data.end(), bytes.begin() + static_cast<std::ptrdiff_t>(header))) {
    finding("data differs from the file's bytes");
  }
  return 0;
}
