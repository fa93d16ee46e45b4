// SPDX-License-Identifier: Apache-2.0
#pragma once
// mirror::test::FakeDevice: a device whose replicas do not share memory, for proving that
// generic ops policies use only the device primitives. Replica buffers live in per-replica
// arenas and are named by opaque handles with no dereference, so an ops policy that touched
// memory directly would not compile; every byte moves through copy/combine/divide, which count
// the calls. Execution (pool, barrier, exchange) is the threads backend's.

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>
#include <mirror/backends/threads/threads_runtime.hpp>
#include <mirror/concepts/device.hpp>
#include <mirror/detail/element_ops.hpp>

namespace mirror::test {

/// A handle to elements of one replica's arena: (replica, block, element index). No operator*.
template <class E>
struct fake_pointer {
  int replica = -1;
  int block = -1;
  std::size_t index = 0;
  fake_pointer operator+(std::size_t n) const noexcept { return {replica, block, index + n}; }
};

/// A read-only view of a host argument of run staged into one replica's arena.
template <class E>
struct fake_view {
  fake_pointer<E> data;
  std::size_t size = 0;
};

struct FakeDevice {
  int replicas = 4;
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  friend bool operator==(const FakeDevice&, const FakeDevice&) = default;

  class runtime : public threads::runtime {
   public:
    template <class E>
    using pointer = fake_pointer<E>;
    static constexpr bool host_addressable = false;

    explicit runtime(const FakeDevice& d)
        : threads::runtime(d.replicas, d.timeout), arenas_(static_cast<std::size_t>(d.replicas)) {}

    template <class E>
    pointer<E> attach(int self, std::span<E> host) {
      const int b = arena(self).allocate(host.size_bytes());
      // (An empty leaf may have no address: memcpy must not see it.)
      if (!host.empty()) std::memcpy(arena(self).blocks[static_cast<std::size_t>(b)].get(), host.data(), host.size_bytes());
      ++copies_;
      return {self, b, 0};
    }
    /// Copies an attached leaf back and frees its block; a read-only (`const E`) leaf is only freed.
    template <class E>
    void detach(int self, pointer<E> p, std::span<E> host) {
      if constexpr (!std::is_const_v<E>) {
        if (!host.empty()) std::memcpy(host.data(), resolve(p), host.size_bytes());
      }
      arena(self).release(p.block);
      ++copies_;
    }
    template <class E>
    pointer<E> scratch(int self, std::size_t n) {
      arena_t& a = arena(self);
      if (a.scratch_block < 0 || a.sizes[static_cast<std::size_t>(a.scratch_block)] < n * sizeof(E)) {
        if (a.scratch_block >= 0) a.release(a.scratch_block);
        a.scratch_block = a.allocate(n * sizeof(E));
      }
      return {self, a.scratch_block, 0};
    }
    /// `src` may be read-only (`pointer<const E>`, an attached input).
    template <class E, class S>
      requires std::same_as<const E, const S>
    void copy(int, pointer<E> dst, pointer<S> src, std::size_t n) {
      if (n != 0) std::memmove(resolve(dst), resolve(src), n * sizeof(E));
      ++copies_;
    }
    template <class E, class S>
      requires std::same_as<const E, const S>
    void combine(int, ReduceOp op, pointer<E> dst, pointer<S> src, std::size_t n) {
      detail::combine_into(op, resolve(dst), resolve(src), n);
    }
    template <class E>
    void divide(int, pointer<E> p, std::size_t n, std::size_t count) {
      detail::divide_all(resolve(p), n, count);
    }

    /// Run's staging of shared host arguments (docs/cuda.md#host-arguments-of-run): one buffer per
    /// slot and replica, kept and reused by later runs.
    template <class E>
    using view = fake_view<E>;
    template <class E>
    view<const E> stage_argument(int self, std::size_t slot, std::span<const E> host) {
      arena_t& a = arena(self);
      if (a.argument_blocks.size() <= slot) a.argument_blocks.resize(slot + 1, -1);
      int& b = a.argument_blocks[slot];
      if (b < 0 || a.sizes[static_cast<std::size_t>(b)] < host.size_bytes()) {
        if (b >= 0) a.release(b);
        b = a.allocate(host.size_bytes());
        ++argument_buffers_;
      }
      if (!host.empty()) std::memcpy(a.blocks[static_cast<std::size_t>(b)].get(), host.data(), host.size_bytes());
      ++copies_;
      return {{self, b, 0}, host.size()};
    }
    /// The elements behind a staged view (for tests: fn cannot dereference it).
    template <class E>
    std::span<const E> read(view<const E> v) {
      return {resolve(v.data), v.size};
    }

    /// Number of copies made (attach, detach, copy, staging) since construction.
    long copies() const noexcept { return copies_.load(); }
    /// Number of argument staging buffers allocated since construction.
    long argument_buffers() const noexcept { return argument_buffers_.load(); }

   private:
    struct arena_t {
      static constexpr std::size_t capacity = 4096;
      std::unique_ptr<std::unique_ptr<std::byte[]>[]> blocks{new std::unique_ptr<std::byte[]>[capacity]};
      std::vector<std::size_t> sizes = std::vector<std::size_t>(capacity, 0);
      std::vector<int> free_list;
      int next = 0;
      int scratch_block = -1;
      std::vector<int> argument_blocks;  // by staging slot
      int allocate(std::size_t bytes) {
        int b;
        if (!free_list.empty()) {
          b = free_list.back();
          free_list.pop_back();
        } else {
          b = next++;
        }
        blocks[static_cast<std::size_t>(b)].reset(new std::byte[bytes == 0 ? 1 : bytes]);
        sizes[static_cast<std::size_t>(b)] = bytes;
        return b;
      }
      void release(int b) {
        blocks[static_cast<std::size_t>(b)].reset();
        free_list.push_back(b);
      }
    };
    arena_t& arena(int r) { return arenas_[static_cast<std::size_t>(r)]; }
    template <class E>
    E* resolve(fake_pointer<E> p) {
      return reinterpret_cast<E*>(arena(p.replica).blocks[static_cast<std::size_t>(p.block)].get()) + p.index;
    }

    std::vector<arena_t> arenas_;
    std::atomic<long> copies_{0};
    std::atomic<long> argument_buffers_{0};
  };
};

static_assert(device<FakeDevice>);

}  // namespace mirror::test
