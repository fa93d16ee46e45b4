// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::save` and `mirror::restore`: variables to and from one file, written by the chief
/// alone, atomically; collective on multi-worker strategies.

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <mirror/detail/checksum.hpp>
#include <mirror/detail/cross_worker.hpp>
#include <mirror/detail/element_kind.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/nest_walk.hpp>
#include <mirror/detail/worker_group.hpp>
#include <mirror/error.hpp>
#include <mirror/leaf_traits.hpp>
#include <mirror/mirrored_variable.hpp>
#include <mirror/sync_on_read_variable.hpp>
#include <mirror/variable_aggregation.hpp>
#if __has_include(<unistd.h>)
#include <fcntl.h>
#include <unistd.h>
#define MIRROR_CHECKPOINT_FSYNC 1
#endif

namespace mirror {
namespace detail {

// The file, version 2 (mirror::save writes it; restore also reads version 1):
//   header   32 bytes: "MIRRORC2", u32 version (2), u32 flags (0), u64 payload bytes, u64 variables
//   payload  per variable, per leaf: u64 element kind, u64 element count, the elements' bytes
//   trailer  u32 CRC-32 (zlib's) of every byte before it
// Integers in the machine's byte order (little-endian on every platform mirror builds for).
// Version 1 was "MIRRORC1", u64 variables, the payload, and nothing after it.
inline constexpr char checkpoint_magic_v1[8] = {'M', 'I', 'R', 'R', 'O', 'R', 'C', '1'};
inline constexpr char checkpoint_magic[8] = {'M', 'I', 'R', 'R', 'O', 'R', 'C', '2'};
inline constexpr std::uint32_t checkpoint_version = 2;

struct checkpoint_header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t flags;
  std::uint64_t payload_bytes;
  std::uint64_t variables;
};
static_assert(sizeof(checkpoint_header) == 32);
inline constexpr std::size_t checkpoint_trailer_bytes = sizeof(std::uint32_t);

/// What a checkpoint holds once its header (and, from version 2, its checksum) checked out.
struct checkpoint_contents {
  std::string_view payload;  // the variables' leaves
  std::uint64_t variables;
};

/// Writes the header into the 32 bytes reserved at the front of `bytes` and appends the checksum.
/// (Templates, these and open_checkpoint, only so that a program that never checkpoints never
/// instantiates them, nor detail::crc32.)
template <class Bytes>
void seal_checkpoint(Bytes& bytes, std::uint64_t variables) {
  checkpoint_header h{};
  std::memcpy(h.magic, checkpoint_magic, sizeof h.magic);
  h.version = checkpoint_version;
  h.payload_bytes = bytes.size() - sizeof h;
  h.variables = variables;
  std::memcpy(bytes.data(), &h, sizeof h);
  const std::uint32_t crc = crc32(0, bytes.data(), bytes.size());
  bytes.insert(bytes.end(), reinterpret_cast<const char*>(&crc), reinterpret_cast<const char*>(&crc) + sizeof crc);
}

/// Whether the first 8 bytes are version 2's magic, or so close to it (the prefix with another
/// version byte, or one flipped bit) that the file is a damaged checkpoint, not another file.
inline bool looks_like_checkpoint_v2(const char* first8) noexcept {
  if (std::memcmp(first8, checkpoint_magic, 7) == 0) return true;
  int differing_bits = 0;
  for (int i = 0; i < 8; ++i) {
    differing_bits += std::popcount(static_cast<unsigned char>(first8[i] ^ checkpoint_magic[i]));
  }
  return differing_bits <= 1;
}

/// Checks a checkpoint's header and checksum; returns its payload and variable count.
/// **Errors**: shape_error naming `path`: "checksum mismatch" for a damaged or truncated
/// version-2 file, otherwise not a checkpoint, or one of a format this build does not read.
template <class Path>
checkpoint_contents open_checkpoint(std::string_view file, const Path& path) {
  auto fail = [&](const char* why) { throw shape_error(format("mirror::restore(%s): %s", path.c_str(), why)); };
  if (file.size() >= 16 && std::memcmp(file.data(), checkpoint_magic_v1, 8) == 0) {
    // Version 1 (before checksums): read as it always was, unverified.
    std::uint64_t variables = 0;
    std::memcpy(&variables, file.data() + 8, sizeof variables);
    return {file.substr(16), variables};
  }
  if (file.size() < 8 || !looks_like_checkpoint_v2(file.data())) {
    fail("not a mirror checkpoint (written by mirror::save)");
  }
  checkpoint_header h{};
  const std::size_t body = file.size() >= sizeof h + checkpoint_trailer_bytes ? file.size() - checkpoint_trailer_bytes : 0;
  std::uint32_t recorded = 0, computed = 0;
  if (body > 0) {
    std::memcpy(&recorded, file.data() + body, sizeof recorded);
    computed = crc32(0, file.data(), body);
  }
  if (body == 0 || computed != recorded) {
    const message why =
        body == 0 ? format("checksum mismatch: the file is damaged or truncated (%zu bytes, shorter than a "
                           "checkpoint's header); restore an intact copy",
                           file.size())
                  : format("checksum mismatch: the file is damaged or truncated (%zu bytes, CRC-32 0x%08x, the file "
                           "records 0x%08x); restore an intact copy",
                           file.size(), static_cast<unsigned>(computed), static_cast<unsigned>(recorded));
    fail(why.c_str());
  }
  std::memcpy(&h, file.data(), sizeof h);
  if (std::memcmp(h.magic, checkpoint_magic, 7) != 0 || h.version < 2 || h.magic[7] - '0' != static_cast<int>(h.version)) {
    fail("the header is malformed (magic and version disagree)");
  }
  if (h.version > checkpoint_version || h.flags != 0) {
    fail(format("written in checkpoint format version %u (flags %u); this build of mirror reads versions 1 and 2: "
                "restore it with the mirror that wrote it",
                static_cast<unsigned>(h.version), static_cast<unsigned>(h.flags))
             .c_str());
  }
  if (h.payload_bytes != body - sizeof h) fail("the header's payload size disagrees with the file's size");
  return {file.substr(sizeof h, body - sizeof h), h.variables};
}

/// The value a checkpoint stores for a variable: the mirrored value, or the aggregated read of a
/// sync-on-read variable (collective on multi-worker strategies; `none` stores replica 0's copy).
template <class T>
const T& checkpoint_value(const MirroredVariable<T>& v, T&) {
  return v.value();
}
template <class T>
const T& checkpoint_value(const SyncOnReadVariable<T>& v, T& scratch) {
  if (v.aggregation() == VariableAggregation::none) return v[0];
  scratch = v.value();
  return scratch;
}

/// Appends a nest's leaves: per leaf {element kind, count} then the bytes.
template <class T>
void serialise(std::vector<char>& out, const T& value) {
  for_each_leaf(
      [&](const auto& l) {
        using L = std::remove_cvref_t<decltype(l)>;
        using E = leaf_element_t<L>;
        const auto e = leaf_traits<L>::elements(l);
        const element_kind k = element_kind_of<E>();
        const std::uint64_t head[2] = {k.code(), e.size()};
        out.insert(out.end(), reinterpret_cast<const char*>(head), reinterpret_cast<const char*>(head) + sizeof head);
        out.insert(out.end(), reinterpret_cast<const char*>(e.data()),
                   reinterpret_cast<const char*>(e.data()) + e.size_bytes());
      },
      value);
}

template <class V>
void serialise_variable(std::vector<char>& out, const V& var) {
  typename V::value_type scratch{};
  serialise(out, checkpoint_value(var, scratch));
}

/// Reads a nest's leaves back into `value` (shaped like the variable); a different element type
/// or leaf size is a shape_error naming the variable and leaf.
template <class T>
void deserialise(std::string_view& in, T& value, std::size_t var, const std::string& path) {
  std::size_t k = 0;
  for_each_leaf(
      [&](auto& l) {
        using L = std::remove_cvref_t<decltype(l)>;
        using E = leaf_element_t<L>;
        const auto e = leaf_traits<L>::elements(l);
        const element_kind want = element_kind_of<E>();
        std::uint64_t head[2];
        auto fail = [&](const char* why) {
          throw shape_error(format("mirror::restore(%s): variable %zu, leaf %zu (%s): %s; restore into variables "
                                   "made like the saved ones, in the same order",
                                   path.c_str(), var, k, type_name<L>().c_str(), why));
        };
        if (in.size() < sizeof head) fail("the checkpoint ends early");
        std::memcpy(head, in.data(), sizeof head);
        in.remove_prefix(sizeof head);
        if (head[0] != want.code()) {
          fail(format("the checkpoint holds %s elements, the variable %s",
                      kind_name(element_kind::from_code(head[0])).c_str(), kind_name(want).c_str())
                   .c_str());
        }
        if (head[1] != e.size()) {
          fail(format("the checkpoint holds %llu elements, the variable %zu", static_cast<unsigned long long>(head[1]),
                      e.size())
                   .c_str());
        }
        if (in.size() < e.size_bytes()) fail("the checkpoint ends early");
        if (!e.empty()) std::memcpy(e.data(), in.data(), e.size_bytes());  // an empty leaf may have no address
        in.remove_prefix(e.size_bytes());
        ++k;
      },
      value);
}

/// Writes `bytes` to `path` atomically: `path.tmp`, fsync, rename, fsync of the folder. Returns
/// an error text, empty on success. Plain C and POSIX calls, not `<filesystem>`
/// (docs/design.md\#compile-time).
inline std::string write_atomically(const std::string& path, const std::vector<char>& bytes) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return "cannot create " + tmp + ": " + std::strerror(errno);
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0;
#ifdef MIRROR_CHECKPOINT_FSYNC
  ok = ok && ::fsync(::fileno(f)) == 0;
#endif
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return "cannot write " + tmp + ": " + std::strerror(err);
  }
  // POSIX rename replaces `path` atomically.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    std::remove(tmp.c_str());
    return "cannot rename " + tmp + " to " + path + ": " + std::strerror(rename_err);
  }
#ifdef MIRROR_CHECKPOINT_FSYNC
  // The rename itself is durable only once the folder is synced.
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (const int fd = ::open(dir.c_str(), O_RDONLY); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
#endif
  return {};
}

/// Appends the contents of `path` to `bytes` (a std::vector<char>). Returns an error text, empty
/// on success. (A template only so that its body, which instantiates vector<char>'s range
/// insert, is compiled where restore is used rather than in every file including
/// <mirror/mirror.hpp>; docs/design.md\#compile-time.)
template <class Bytes>
std::string read_all(const std::string& path, Bytes& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return "cannot open " + path + ": " + std::strerror(errno);
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return "cannot read " + path;
  return {};
}

/// Gives every worker the chief's status text (empty = success); throws the same
/// backend_error on every worker when it is not empty.
inline void agree_on_status(worker_group* g, std::string status, const char* api) {
  if (g != nullptr) {
    std::uint64_t n = status.size();
    g->broadcast(&n, sizeof n, 0, api);
    status.resize(n);
    if (n > 0) g->broadcast(status.data(), n, 0, api);
  }
  if (!status.empty()) throw backend_error(std::string(api) + ": " + status + " (on the chief, worker 0)", -1);
}

template <class S>
worker_group* group_of(S& strategy) {
  if constexpr (S::multi_worker) {
    return strategy.runtime().workers();
  } else {
    (void)strategy;
    return nullptr;
  }
}

/// restore's reading of a checkpoint's bytes (`file`; `path` names it in errors): checks them
/// and, when they match `vars` exactly, assigns the variables (nothing changes otherwise).
/// Separate from the file's reading and broadcast so that tests/fuzz/restore_fuzz.cpp can feed
/// it arbitrary bytes.
template <class... Vars>
void restore_from(std::string_view file, const std::string& path, Vars&... vars) {
  const checkpoint_contents contents = open_checkpoint(file, path);
  std::string_view in = contents.payload;
  if (contents.variables != sizeof...(Vars)) {
    throw shape_error(format("mirror::restore(%s): the checkpoint holds %llu variables but %zu were passed",
                             path.c_str(), static_cast<unsigned long long>(contents.variables), sizeof...(Vars)));
  }
  // Every value is read (and checked) before any variable changes.
  std::tuple<typename Vars::value_type...> values{vars[0]...};  // the variables' shapes
  std::apply(
      [&](auto&... value) {
        std::size_t index = 0;
        (deserialise(in, value, index++, path), ...);
      },
      values);
  if (!in.empty()) {
    throw shape_error(format("mirror::restore(%s): the checkpoint holds %zu more bytes after the last variable's "
                             "leaves (its variables have more or larger leaves); restore into variables made like the "
                             "saved ones, in the same order",
                             path.c_str(), in.size()));
  }
  std::apply([&](const auto&... value) { (vars.assign(value), ...); }, values);
}

}  // namespace detail

/// Saves `vars` (`MirroredVariable` / `SyncOnReadVariable`s, in this order) to `path` (a
/// `std::string`; a `std::filesystem::path` converts to it).
///
/// The file (format version 2) is a versioned header, every leaf's element type, count and
/// bytes, and a CRC-32 of all of it (zlib's; a program that saves or restores links zlib).
///
/// Collective on a multi-worker strategy: every worker calls it with the same variables.
/// Sync-on-read variables are read aggregated (on every worker); then the chief (worker 0)
/// alone writes `path.tmp`, fsyncs it and renames it to `path`, so a crash never leaves a
/// half-written checkpoint and workers never race on one file. Other workers write nothing (their
/// `path` is not used).
///
/// **Errors**: the same `backend_error` on every worker when the chief cannot write (the text
/// names the file and the system's reason).
template <class S, class... Vars>
void save(S& strategy, const std::string& path, const Vars&... vars) {
  detail::worker_group* g = detail::group_of(strategy);
  // Every worker agrees that this is a save before the chief writes anything (a worker making
  // another call instead is a shape_error on every worker, with no file written).
  if (g != nullptr) g->check_broadcast(nullptr, 0, 0, "mirror::save");
  std::vector<char> bytes(sizeof(detail::checkpoint_header));  // written by seal_checkpoint
  (detail::serialise_variable(bytes, vars), ...);  // collective for sync-on-read variables
  std::string status;
  if (strategy.is_chief()) {
    detail::seal_checkpoint(bytes, sizeof...(Vars));
    status = detail::write_atomically(path, bytes);
  }
  detail::agree_on_status(g, std::move(status), "mirror::save");
}

/// Restores `vars` from a checkpoint written by `save` with variables of the same types and
/// shapes, in the same order. Collective on a multi-worker strategy: the chief alone reads the
/// file and broadcasts its bytes, so workers need no shared file system and cannot diverge.
/// Mirrored variables take the saved value on every copy; sync-on-read variables are assigned
/// it (a `sum` variable stores value / N in each copy, so its read gives the saved value).
///
/// Version-1 files (written before checkpoints had a checksum) restore too, unverified; saving
/// again writes version 2.
///
/// **Errors**: `backend_error` (on every worker) when the chief cannot read the file;
/// `shape_error` (nothing changes) when the file is damaged or truncated (its message says
/// "checksum mismatch" and names the file), is not a checkpoint, or does not match the
/// variables exactly: their number, order, element types and sizes.
template <class S, class... Vars>
void restore(S& strategy, const std::string& path, Vars&... vars) {
  detail::worker_group* g = detail::group_of(strategy);
  std::vector<char> bytes;
  std::string status;
  if (strategy.is_chief()) status = detail::read_all(path, bytes);
  detail::agree_on_status(g, std::move(status), "mirror::restore");
  if (g != nullptr) {
    std::uint64_t n = bytes.size();
    g->broadcast(&n, sizeof n, 0, "mirror::restore");
    bytes.resize(n);
    g->broadcast(bytes.data(), n, 0, "mirror::restore");
  }
  detail::restore_from(std::string_view(bytes.data(), bytes.size()), path, vars...);
}

}  // namespace mirror
