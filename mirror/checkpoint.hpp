// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::save` and `mirror::restore`: variables to and from one file, written by the chief
/// alone, atomically; collective on multi-worker strategies.

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
#include <mirror/detail/cross_worker.hpp>
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

inline constexpr char checkpoint_magic[8] = {'M', 'I', 'R', 'R', 'O', 'R', 'C', '1'};

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
        const std::uint64_t head[2] = {static_cast<std::uint64_t>(k.cat) << 8 | k.bytes, e.size()};
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
        auto fail = [&](const std::string& why) {
          throw shape_error("mirror::restore(" + path + "): variable " + std::to_string(var) + ", leaf " +
                            std::to_string(k) + " (" + type_name<L>() + "): " + why +
                            "; restore into variables made like the saved ones, in the same order");
        };
        if (in.size() < sizeof head) fail("the checkpoint ends early");
        std::memcpy(head, in.data(), sizeof head);
        in.remove_prefix(sizeof head);
        if (head[0] != (static_cast<std::uint64_t>(want.cat) << 8 | want.bytes)) fail("the saved element type differs");
        if (head[1] != e.size()) {
          fail("the checkpoint holds " + std::to_string(head[1]) + " elements, the variable " + std::to_string(e.size()));
        }
        if (in.size() < e.size_bytes()) fail("the checkpoint ends early");
        std::memcpy(e.data(), in.data(), e.size_bytes());
        in.remove_prefix(e.size_bytes());
        ++k;
      },
      value);
}

/// Writes `bytes` to `path` atomically: `path.tmp`, fsync, rename, fsync of the folder. Returns
/// an error text, empty on success. Plain C and POSIX calls: `<filesystem>` (with the iostreams
/// and locales it brings) was 7 % of the compile time of every file including <mirror/mirror.hpp>.
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
/// <mirror/mirror.hpp>: 0.03 G compiler instructions each.)
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

}  // namespace detail

/// Saves `vars` (`MirroredVariable` / `SyncOnReadVariable`s, in this order) to `path` (a
/// `std::string`; a `std::filesystem::path` converts to it).
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
  std::vector<char> bytes(std::begin(detail::checkpoint_magic), std::end(detail::checkpoint_magic));
  const std::uint64_t count = sizeof...(Vars);
  bytes.insert(bytes.end(), reinterpret_cast<const char*>(&count), reinterpret_cast<const char*>(&count) + sizeof count);
  (detail::serialise_variable(bytes, vars), ...);  // collective for sync-on-read variables
  std::string status;
  if (strategy.is_chief()) status = detail::write_atomically(path, bytes);
  detail::agree_on_status(g, std::move(status), "mirror::save");
}

/// Restores `vars` from a checkpoint written by `save` with variables of the same types and
/// shapes, in the same order. Collective on a multi-worker strategy: the chief alone reads the
/// file and broadcasts its bytes, so workers need no shared file system and cannot diverge.
/// Mirrored variables take the saved value on every copy; sync-on-read variables are assigned
/// it (a `sum` variable stores value / N in each copy, so its read gives the saved value).
///
/// **Errors**: `backend_error` (on every worker) when the chief cannot read the file;
/// `shape_error` when the checkpoint does not match the variables.
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
  std::string_view in(bytes.data(), bytes.size());
  std::uint64_t count = 0;
  if (in.size() < sizeof detail::checkpoint_magic + sizeof count ||
      std::memcmp(in.data(), detail::checkpoint_magic, sizeof detail::checkpoint_magic) != 0) {
    throw shape_error("mirror::restore(" + path + "): not a mirror checkpoint (written by mirror::save)");
  }
  in.remove_prefix(sizeof detail::checkpoint_magic);
  std::memcpy(&count, in.data(), sizeof count);
  in.remove_prefix(sizeof count);
  if (count != sizeof...(Vars)) {
    throw shape_error("mirror::restore(" + path + "): the checkpoint holds " + std::to_string(count) +
                      " variables but " + std::to_string(sizeof...(Vars)) + " were passed");
  }
  // Every value is read (and checked) before any variable changes.
  std::tuple<typename Vars::value_type...> values{vars[0]...};  // the variables' shapes
  std::apply(
      [&](auto&... value) {
        std::size_t index = 0;
        (detail::deserialise(in, value, index++, path), ...);
      },
      values);
  if (!in.empty()) {
    throw shape_error("mirror::restore(" + path + "): the checkpoint holds " + std::to_string(in.size()) +
                      " more bytes after the last variable's leaves (its variables have more or larger leaves); "
                      "restore into variables made like the saved ones, in the same order");
  }
  std::apply([&](const auto&... value) { (vars.assign(value), ...); }, values);
}

}  // namespace mirror
