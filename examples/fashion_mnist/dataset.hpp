// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Loads a Fashion-MNIST split (`train` or `t10k`) from a folder of IDX files into row-major
/// images (one row of 784 bytes per image, 0..255, as in the file) and int32 labels, checking
/// that the two files agree. Standard library only; gzip goes through the `decompress_fn`
/// passed in. The trainer scales pixels to [0, 1] floats per batch, on the replica: the
/// per-epoch shuffle then moves 47 MB instead of 188 MB.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>
#include "idx.hpp"

namespace fashion_mnist {

inline constexpr std::size_t image_side = 28;
inline constexpr std::size_t pixels = image_side * image_side;  // 784 features per row
inline constexpr int classes = 10;

/// One split: `rows` images of `pixels` bytes, row-major, and their labels 0..9.
struct split {
  std::vector<std::uint8_t> images;
  std::vector<std::int32_t> labels;
  std::size_t rows = 0;
};

/// `dir/name.gz` when it exists, else `dir/name` when that exists, else `dir/name.gz` (what the
/// Debian package ships, so that the "cannot open" error names the file to install).
inline std::filesystem::path find_idx_file(const std::filesystem::path& dir, const std::string& name) {
  std::error_code ec;
  const auto gz = dir / (name + ".gz");
  if (std::filesystem::exists(gz, ec)) return gz;
  const auto raw = dir / name;
  if (std::filesystem::exists(raw, ec)) return raw;
  return gz;
}

/// Loads `prefix` ("train" or "t10k") from `dir`: `prefix-images-idx3-ubyte[.gz]` and
/// `prefix-labels-idx1-ubyte[.gz]`. `limit` > 0 keeps only the first `limit` images.
/// Throws `idx_error` for a missing or corrupt file, or files that disagree.
inline split load_split(const std::filesystem::path& dir, const std::string& prefix, std::size_t limit,
                        const decompress_fn& gunzip) {
  const auto images_file = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const auto labels_file = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  const idx_array images = read_idx(images_file, gunzip);
  const idx_array labels = read_idx(labels_file, gunzip);
  if (images.dims.size() != 3 || images.dims[1] != image_side || images.dims[2] != image_side) {
    std::string shape;
    for (auto d : images.dims) shape += (shape.empty() ? "" : " x ") + std::to_string(d);
    throw idx_error(images_file, "expected images of shape N x 28 x 28, found " + shape);
  }
  if (labels.dims.size() != 1) throw idx_error(labels_file, "expected a 1-D array of labels");
  if (labels.dims[0] != images.dims[0]) {
    throw idx_error(labels_file, std::to_string(labels.dims[0]) + " labels for " + std::to_string(images.dims[0]) +
                                     " images in " + images_file.string());
  }
  split out;
  out.rows = images.dims[0];
  if (limit > 0 && limit < out.rows) out.rows = limit;
  out.images.assign(images.data.begin(), images.data.begin() + static_cast<std::ptrdiff_t>(out.rows * pixels));
  out.labels.resize(out.rows);
  for (std::size_t i = 0; i < out.rows; ++i) {
    if (labels.data[i] >= classes) {
      throw idx_error(labels_file, "label " + std::to_string(labels.data[i]) + " at index " + std::to_string(i) +
                                       " is not a class 0..9");
    }
    out.labels[i] = labels.data[i];
  }
  return out;
}

}  // namespace fashion_mnist
