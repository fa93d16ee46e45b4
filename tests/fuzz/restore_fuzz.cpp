// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: mirror::restore's reading of a checkpoint (detail::restore_from, what
// restore does with the bytes it read) on arbitrary bytes, against a few sets of variables.
//
// Input: byte 0 chooses; the rest is the file. Bit 0 set: the file's last 4 bytes are replaced
// by the CRC-32 of the rest (as save writes it), so that mutations reach the header and leaf
// checks behind the checksum instead of stopping at it. Bits 1-2: the variables.
//
// Oracle: restore either throws mirror::shape_error and changes no variable, or accepts the
// file, and then the file is exactly what save writes for the restored values (the format has
// no slack: a version-2 file byte for byte; a version-1 file, its header and payload). Anything
// else (another exception, a crash, a sanitizer report) is a finding.
//
//   tests/fuzz/run_fuzz.sh restore SECONDS   (builds this with clang++ -fsanitize=fuzzer,...)
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <array>
#include <tuple>
#include <vector>
#include <mirror/mirror.hpp>

namespace {

using S = mirror::Strategy<mirror::devices::Threads>;
using mirror::VariableAggregation;

S& strategy() {
  static S s{{.replicas = 2}};
  return s;
}

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "restore_fuzz: %s\n", what);
  std::abort();
}

/// The bytes save writes for `vars`' current values, in `version` (1 or 2).
template <class... Vars>
std::vector<char> encoded(int version, const Vars&... vars) {
  std::vector<char> bytes(version == 2 ? sizeof(mirror::detail::checkpoint_header) : 16);
  (mirror::detail::serialise_variable(bytes, vars), ...);
  if (version == 2) {
    mirror::detail::seal_checkpoint(bytes, sizeof...(Vars));
  } else {
    std::memcpy(bytes.data(), mirror::detail::checkpoint_magic_v1, 8);
    const std::uint64_t n = sizeof...(Vars);
    std::memcpy(bytes.data() + 8, &n, sizeof n);
  }
  return bytes;
}

template <class... Vars>
void check(std::string_view file, Vars&... vars) {
  const std::vector<char> before = encoded(2, vars...);
  try {
    mirror::detail::restore_from(file, "fuzz input", vars...);
  } catch (const mirror::shape_error&) {
    if (encoded(2, vars...) != before) finding("a refused checkpoint changed a variable");
    return;
  }
  const int version = file.size() >= 8 && file[7] == '1' ? 1 : 2;
  const std::vector<char> again = encoded(version, vars...);
  if (std::string_view(again.data(), again.size()) != file) finding("an accepted checkpoint is not what save writes");
  // Every copy holds the value, bit for bit (a mirrored variable's copies are equal, a
  // sync-on-read one's were each assigned it; a NaN is not equal to itself, so bytes compare).
  const auto check_copies = [](const auto& v) {
    std::vector<char> first;
    mirror::detail::serialise(first, v[0]);
    for (std::size_t r = 1; r < v.size(); ++r) {
      std::vector<char> other;
      mirror::detail::serialise(other, v[r]);
      if (other != first) finding("restored copies differ");
    }
  };
  (check_copies(vars), ...);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t choice = data[0];
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((choice & 1) != 0 && file.size() >= 4) {
    const std::uint32_t crc = mirror::detail::crc32(0, file.data(), file.size() - 4);
    std::memcpy(file.data() + file.size() - 4, &crc, sizeof crc);
  }
  S& s = strategy();
  // A set of variables per choice, made once each (restore assigns them when a file fits).
  switch ((choice >> 1) & 3) {
    case 0: {
      static auto v = s.make_variable(std::vector<float>(5), VariableAggregation::sum);
      check(file, v);
      break;
    }
    case 1: {
      using Nest = std::tuple<std::vector<double>, std::int32_t, std::array<std::int16_t, 3>>;
      static auto a = s.make_variable(Nest{std::vector<double>(2), 0, {}}, VariableAggregation::sum);
      static auto b = s.make_sync_on_read_variable(std::vector<std::uint8_t>(4), VariableAggregation::only_first_replica);
      check(file, a, b);
      break;
    }
    case 2: {
      static auto a = s.make_variable(0.0f, VariableAggregation::sum);
      static auto b = s.make_variable(std::vector<std::uint64_t>{}, VariableAggregation::sum);  // an empty leaf
      static auto c = s.make_sync_on_read_variable(std::int64_t{0}, VariableAggregation::none);
      check(file, a, b, c);
      break;
    }
    default: {
      // (No long double: its 6 padding bytes do not survive a copy, so no round trip is exact.)
      static auto v = s.make_variable(std::pair<double, std::vector<std::int8_t>>{0.0, std::vector<std::int8_t>(3)},
                                      VariableAggregation::only_first_replica);
      check(file, v);
      break;
    }
  }
  return 0;
}
