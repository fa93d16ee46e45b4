// SPDX-License-Identifier: Apache-2.0
#pragma once
// The agreement check of a collective call (same collective, same nest, same shapes): what each
// replica says it is doing, how two replicas' accounts are compared, and the message for a
// mismatch. It rides on the collective's first exchange (mirror/backend/collective.hpp), so
// checking costs no extra synchronisation.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <mirror/error.hpp>
#include <mirror/reduce_op.hpp>
#include <mirror/backend/exchanged.hpp>
#include <mirror/detail/format.hpp>
#include <mirror/detail/separate_compilation.hpp>
#include <mirror/detail/type_name.hpp>
#include <mirror/source_location.hpp>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>

namespace mirror::detail {

enum class collective_kind : std::uint32_t { all_reduce, broadcast, merge_call, all_gather, reduce_scatter };

/// How an error message names a collective call: "all_reduce(sum)", "broadcast(from = 2)".
struct call_name {
  char text[32];
};
#if MIRROR_DETAIL_HEADER_DEFINITIONS
// (Not inlined: describe_disagreement calls it twice, and its snprintf calls are cold.)
[[gnu::noinline]] MIRROR_DETAIL_INLINE call_name to_string(collective_kind k, int param) noexcept {
  call_name out{"?"};
  switch (k) {
    case collective_kind::all_reduce: {
      const std::string_view op = mirror::to_string(static_cast<ReduceOp>(param));
      std::snprintf(out.text, sizeof out.text, "all_reduce(%.*s)", static_cast<int>(op.size()), op.data());
      break;
    }
    case collective_kind::broadcast: std::snprintf(out.text, sizeof out.text, "broadcast(from = %d)", param); break;
    case collective_kind::merge_call: std::snprintf(out.text, sizeof out.text, "merge_call"); break;
    case collective_kind::all_gather: std::snprintf(out.text, sizeof out.text, "all_gather"); break;
    case collective_kind::reduce_scatter: {
      const std::string_view op = mirror::to_string(static_cast<ReduceOp>(param));
      std::snprintf(out.text, sizeof out.text, "reduce_scatter(%.*s)", static_cast<int>(op.size()), op.data());
      break;
    }
  }
  return out;
}
#else
call_name to_string(collective_kind k, int param) noexcept;
#endif

/// A call (kind, and op or root) in one word, as the flight recorder, the timeline and the
/// cross-worker agreement key keep it: kind in the high half, the parameter in the low.
constexpr std::uint64_t pack_call(collective_kind k, int param) noexcept {
  return static_cast<std::uint64_t>(k) << 32 | static_cast<std::uint32_t>(param);
}
/// pack_call's kind.
constexpr collective_kind kind_of_call(std::uint64_t call) noexcept { return static_cast<collective_kind>(call >> 32); }
/// pack_call's op or root.
constexpr int param_of_call(std::uint64_t call) noexcept { return static_cast<int>(static_cast<std::uint32_t>(call)); }
/// How messages name a packed call.
inline call_name name_of_call(std::uint64_t call) noexcept { return to_string(kind_of_call(call), param_of_call(call)); }

/// "FILE:LINE" of a call site, as the compiler gives `file_name()`; "an unknown call site" for a
/// default-constructed location (a call that could not capture one).
MIRROR_DETAIL_INLINE message site_text(const mirror::source_location& where);

/// A value with the call site of the expression it was converted from: a parameter of this type
/// captures the caller's location in a function whose trailing parameter pack leaves no room for
/// a defaulted `mirror::source_location` (MirroredVariable::handle::update_sharded's `op`).
template <class T>
struct sited {
  T value;
  mirror::source_location where;
  // NOLINTNEXTLINE(google-explicit-constructor): the conversion is the point
  sited(T v, mirror::source_location at = mirror::source_location::current()) noexcept : value(v), where(at) {}
};

/// Where a replica is in its fn: its collective number (1 for the first collective it called in
/// this run, as the user wrote them), which collective that is, and the user's call site.
/// ReplicaContext sets it on the replica's thread as each collective starts; the errors raised
/// inside a collective (timeouts, cross-worker failures), built on that thread, read it to name
/// the collective the same way the agreement check's shape_error does ("collective #3
/// (all_reduce(sum)) at train.cpp:42"). Outside fn, a cross-replica call of the strategy
/// (`Strategy::reduce`, ...) sets only `where` (at_call_site), for the cross-worker messages.
struct collective_position {
  std::uint64_t sequence = 0;  // 0: not in a collective of fn (Strategy::reduce, save, ...)
  collective_kind kind = collective_kind::all_reduce;
  int param = 0;
  mirror::source_location where{};
};
inline thread_local collective_position current_position{};

/// The call site of a cross-replica call (`Strategy::reduce`, `gather`, ...) for the duration of
/// the call, on the calling thread: outside fn it becomes current_position's `where`; inside a
/// merge_call function the position stays the merge_call's.
class at_call_site {
 public:
  explicit at_call_site(const mirror::source_location& where) noexcept : saved_(current_position.where) {
    if (current_position.sequence == 0) current_position.where = where;
  }
  at_call_site(const at_call_site&) = delete;
  at_call_site& operator=(const at_call_site&) = delete;
  ~at_call_site() { current_position.where = saved_; }

 private:
  mirror::source_location saved_;
};

/// "collective #3 (all_reduce(sum)) at train.cpp:42" for a position, or `otherwise` for one
/// outside the collectives of fn.
MIRROR_DETAIL_INLINE message describe_position(const collective_position& p, const char* otherwise);
/// The same for the calling thread's position.
MIRROR_DETAIL_INLINE message describe_position(const char* otherwise);

/// A leaf size that any size matches (resizable leaves of a broadcast take the source's size).
inline constexpr std::size_t any_size = std::numeric_limits<std::size_t>::max();

/// What one replica says it is doing, in its own frame. The fields the agreement check compares
/// travel in the exchange (collective_check); `sizes` and `leaf_types` are only read to
/// describe a mismatch, while every replica is held at a barrier.
struct collective_header {
  collective_kind kind;
  int param;                      // ReduceOp for all_reduce, the root for broadcast
  std::uint64_t sequence;         // collective number within this run
  const std::type_info* nest;     // type of the nest (or of the merge function and arguments)
  std::size_t num_leaves;
  std::uint64_t shape_hash;       // of the nest's type and the sizes that must agree (any_size entries are skipped)
  const std::size_t* sizes;       // element count per leaf, or any_size; the caller's frame
  const std::type_info* const* leaf_types;  // each leaf's type (static storage)
  bool in_place = false;          // the nest has view leaves (spans): the collective writes the caller's memory
  mirror::source_location where{};   // the user's call
};

/// A 64-bit mix of the checked sizes (splitmix64 steps), from `seed` (the nest type's
/// nest_hash for a collective's header): equal shapes give equal hashes.
MIRROR_DETAIL_INLINE std::uint64_t shape_hash(const std::size_t* sizes, std::size_t n,
                                              std::uint64_t seed = 0) noexcept;

/// A hash of the nest type N, equal in every translation unit of one program, computed once per
/// type (among one process's replicas; across processes, text_hash of the type's name).
template <class N>
std::uint64_t nest_hash() noexcept {
  static const std::uint64_t h = typeid(N).hash_code();
  return h;
}

/// A 64-bit FNV-1a hash of a text (null hashes as empty): equal texts, equal hashes, in every
/// process. What workers compare across processes: an API's name, a type's mangled name
/// (libc++'s `type_info::hash_code` may hash the name's address, which differs between them).
inline std::uint64_t text_hash(const char* text) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char* c = text; c != nullptr && *c != '\0'; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 0x100000001b3ull;
  return h;
}

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE std::uint64_t shape_hash(const std::size_t* sizes, std::size_t n, std::uint64_t seed) noexcept {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ n ^ seed;
  for (std::size_t k = 0; k < n; ++k) {
    if (sizes[k] == any_size) continue;
    h += sizes[k] + 0x9e3779b97f4a7c15ull + (static_cast<std::uint64_t>(k) << 32);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}
#endif

/// What the agreement check compares, exchanged ahead of a collective's first payload: the
/// header's inline fields, the call site, and where the rest of the header is. The nest's type
/// is compared through its hash, folded into `shape_hash`, which keeps the check at 40 bytes
/// with the call site (a one-pointer mirror::source_location, as libstdc++ and libc++ have it):
/// with the runtime's arrival number a scalar payload still shares their cache line
/// (threads::runtime's slots).
struct collective_check {
  collective_kind kind;
  int param;
  std::uint64_t sequence;
  std::uint64_t shape_hash;
  const collective_header* full;  // the replica's own header: read only to describe a mismatch
  mirror::source_location where;     // the user's call, named by every message about it
};
static_assert(sizeof(collective_check) <= 48);

inline collective_check check_of(const collective_header& h) noexcept {
  return {h.kind, h.param, h.sequence, h.shape_hash, &h, h.where};
}

/// Whether two checks name the same collective call (kind, parameter, position in the run).
inline bool same_call(const collective_check& a, const collective_check& b) noexcept {
  return a.kind == b.kind && a.param == b.param && a.sequence == b.sequence;
}

/// Whether every replica's check agrees with replica 0's, reading only inline fields. (Not a
/// template over the exchanged payload, and not inlined: one copy per program, not one per
/// collective type.)
#if MIRROR_DETAIL_HEADER_DEFINITIONS
[[gnu::noinline]] MIRROR_DETAIL_INLINE bool agree(const backend::exchanged<collective_check>& cs) noexcept {
  const collective_check& c0 = cs[0];
  for (std::size_t r = 1; r < cs.size(); ++r) {
    const collective_check& c = cs[r];
    if (!same_call(c, c0) || c.shape_hash != c0.shape_hash) return false;
  }
  return true;
}
#else
bool agree(const backend::exchanged<collective_check>& cs) noexcept;
#endif

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE message site_text(const mirror::source_location& where) {
  if (where.line() == 0) return format("an unknown call site");
  return format("%s:%u", where.file_name(), static_cast<unsigned>(where.line()));
}

MIRROR_DETAIL_INLINE message describe_position(const collective_position& p, const char* otherwise) {
  if (p.sequence == 0) return format("%s", otherwise);
  return format("collective #%llu (%s) at %s", static_cast<unsigned long long>(p.sequence),
                to_string(p.kind, p.param).text, site_text(p.where).c_str());
}

MIRROR_DETAIL_INLINE message describe_position(const char* otherwise) {
  return describe_position(current_position, otherwise);
}
#endif

/// The message for a disagreement. Reads other replicas' frames: call it only while they wait.
/// Local replica r is named `first + r` (a worker of a multi-process strategy names them globally).
[[gnu::cold]] MIRROR_DETAIL_INLINE message describe_disagreement(const backend::exchanged<collective_check>& cs,
                                                                 std::size_t first = 0);

#if MIRROR_DETAIL_HEADER_DEFINITIONS
MIRROR_DETAIL_INLINE message describe_disagreement(const backend::exchanged<collective_check>& cs, std::size_t first) {
  // Which collective and where: from the checks copied into the slots. A replica's own header
  // (`full`, in its frame) is read only once its check names the same collective as replica 0's:
  // then both are in disagree(), held at its barrier. (A slot can hold an older check, or none,
  // when a replica left a barrier early; its frame is gone by then.)
  const collective_check& c0 = cs[0];
  const auto seq0 = static_cast<unsigned long long>(c0.sequence);
  const call_name call0 = to_string(c0.kind, c0.param);
  const message at0 = site_text(c0.where);
  for (std::size_t r = 1; r < cs.size(); ++r) {
    const collective_check& c = cs[r];
    if (!same_call(c, c0)) {
      return format("mirror: replicas disagree on collective #%llu: replica %zu called %s at %s but replica %zu "
                    "called %s at %s (its collective #%llu); every replica must make the same collective calls in "
                    "the same order",
                    seq0, first, call0.text, at0.c_str(), first + r, to_string(c.kind, c.param).text,
                    site_text(c.where).c_str(), static_cast<unsigned long long>(c.sequence));
    }
    if (c.shape_hash == c0.shape_hash || c.full == nullptr || c0.full == nullptr) continue;
    const collective_header& h0 = *c0.full;
    const collective_header& h = *c.full;
    if (*h.nest != *h0.nest) {
      const message nest = demangle(h.nest->name());
      const message nest0 = demangle(h0.nest->name());
      return format("mirror: collective #%llu (%s): mismatched nests: replica %zu passed %s at %s but replica %zu "
                    "passed %s at %s; every replica must pass the same nest type",
                    seq0, call0.text, first + r, nest.c_str(), site_text(c.where).c_str(), first, nest0.c_str(),
                    at0.c_str());
    }
    for (std::size_t k = 0; k < h0.num_leaves; ++k) {
      const std::size_t a = h0.sizes[k], b = h.sizes[k];
      if (a != b && a != any_size && b != any_size) {
        const message leaf = demangle(h0.leaf_types[k]->name());
        return format("mirror: collective #%llu (%s): shape mismatch at leaf %zu (%s): %zu elements on replica %zu "
                      "(at %s) but %zu on replica %zu (at %s); every replica must pass leaves of the same size",
                      seq0, call0.text, k, leaf.c_str(), b, first + r, site_text(c.where).c_str(), a, first,
                      at0.c_str());
      }
    }
  }
  return format("mirror: collective #%llu (%s) at %s: replicas disagree on the shapes of the leaves", seq0, call0.text,
                at0.c_str());
}
#endif

}  // namespace mirror::detail
