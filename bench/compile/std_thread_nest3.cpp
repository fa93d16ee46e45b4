// SPDX-License-Identifier: Apache-2.0
// Compile-time benchmark (bench/compile_time.sh), the hand-written side: compile/mirror_nest3.cpp
// written with std::thread, a std::barrier and loops over each leaf of the same 3-level nest.
#include <array>
#include <barrier>
#include <cstdio>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

struct Layer {
  std::vector<float> w, b;
};
struct Grads {
  Layer layer;
  std::pair<std::array<std::vector<double>, 2>, float> head;
};

constexpr int replicas = 2;

template <class F>
void run(F f) {
  std::vector<std::thread> threads;
  for (int r = 1; r < replicas; ++r) threads.emplace_back(f, r);
  f(0);
  for (auto& t : threads) t.join();
}

Grads make(int id) {
  const float x = static_cast<float>(id);
  return Grads{Layer{std::vector<float>(8, x), std::vector<float>(2, x)},
               {{std::vector<double>(4, x), std::vector<double>(3, x)}, x}};
}

// Element-wise sum of leaf `get(g)` over all replicas' nests, written back into every nest.
template <class Get>
void all_reduce_leaf(std::array<Grads*, replicas>& all, int self, Get get) {
  auto& mine = get(*all[static_cast<std::size_t>(self)]);
  if constexpr (std::is_arithmetic_v<std::remove_reference_t<decltype(mine)>>) {
    if (self == 0) {
      auto s = get(*all[0]);
      for (int r = 1; r < replicas; ++r) s += get(*all[static_cast<std::size_t>(r)]);
      for (int r = 0; r < replicas; ++r) get(*all[static_cast<std::size_t>(r)]) = s;
    }
  } else {
    const std::size_t n = mine.size(), per = (n + replicas - 1) / replicas;
    for (std::size_t i = per * static_cast<std::size_t>(self); i < std::min(n, per * (self + 1)); ++i) {
      auto s = get(*all[0])[i];
      for (int r = 1; r < replicas; ++r) s += get(*all[static_cast<std::size_t>(r)])[i];
      for (int r = 0; r < replicas; ++r) get(*all[static_cast<std::size_t>(r)])[i] = s;
    }
  }
}

template <class Get>
void reduce_leaf(const std::array<Grads, replicas>& in, Grads& out, Get get, bool mean) {
  auto& o = get(out);
  if constexpr (std::is_arithmetic_v<std::remove_reference_t<decltype(o)>>) {
    o = get(in[0]);
    for (int r = 1; r < replicas; ++r) o += get(in[static_cast<std::size_t>(r)]);
    if (mean) o /= replicas;
  } else {
    for (std::size_t i = 0; i < o.size(); ++i) {
      o[i] = get(in[0])[i];
      for (int r = 1; r < replicas; ++r) o[i] += get(in[static_cast<std::size_t>(r)])[i];
      if (mean) o[i] /= replicas;
    }
  }
}

template <class F>
void each_leaf(F f) {
  f([](auto& g) -> auto& { return g.layer.w; });
  f([](auto& g) -> auto& { return g.layer.b; });
  f([](auto& g) -> auto& { return g.head.first[0]; });
  f([](auto& g) -> auto& { return g.head.first[1]; });
  f([](auto& g) -> auto& { return g.head.second; });
}

int main() {
  std::array<Grads, replicas> synced;
  std::array<Grads*, replicas> ptrs;
  std::barrier sync(replicas);
  run([&](int r) {
    synced[static_cast<std::size_t>(r)] = make(r);
    ptrs[static_cast<std::size_t>(r)] = &synced[static_cast<std::size_t>(r)];
    sync.arrive_and_wait();
    each_leaf([&](auto get) { all_reduce_leaf(ptrs, r, get); });
    sync.arrive_and_wait();
  });
  std::array<Grads, replicas> local;
  run([&](int r) { local[static_cast<std::size_t>(r)] = make(r); });
  Grads total = local[0];
  each_leaf([&](auto get) { reduce_leaf(local, total, get, true); });
  std::printf("%g %g %g\n", synced[0].layer.w[0], total.layer.b[1], total.head.second);
}
