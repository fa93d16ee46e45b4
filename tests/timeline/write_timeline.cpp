// SPDX-License-Identifier: Apache-2.0
// Writes the timeline that tests/timeline/check_timeline.py checks (docs/debugging.md#the-timeline):
// R replicas (W workers under mpirun: devices::Cluster), each run computing (a sleep, longer on
// the last replica: an imbalance the waits must show) between an all-reduce of a buffer, a
// broadcast and a scalar all-reduce. Usage: write_timeline FILE [replicas] [runs] [end]. Prints the
// collectives' lines, which the checker finds in the trace. `end` is how the program ends: close
// (the timeline is ended by set_timeline, the default), exit (std::exit with the strategy alive),
// throw (an uncaught exception: std::terminate) or signal (SIGSEGV): the file must be whole each way.
#include <mirror/mirror.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#if MIRROR_TIMELINE_CLUSTER
using Device = mirror::devices::Cluster<mirror::devices::Threads>;
#else
using Device = mirror::devices::Threads;
#endif

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: write_timeline FILE [replicas] [runs] [close|exit|throw|signal]\n");
    return 2;
  }
  const int replicas = argc > 2 ? std::atoi(argv[2]) : 2;
  const int runs = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::string end = argc > 4 ? argv[4] : "close";
#if MIRROR_TIMELINE_CLUSTER
  mirror::Strategy<Device> strategy{Device{.local = {.replicas = replicas}}};
#else
  mirror::Strategy<Device> strategy{{.replicas = replicas}};
#endif
  strategy.set_timeline(argv[1]);
  const int last = strategy.num_replicas_in_sync() - 1;
  const unsigned reduce_line = __LINE__ + 7, broadcast_line = reduce_line + 1, scalar_line = reduce_line + 2;
  for (int run = 0; run < runs; ++run) {
    strategy.run([&](auto& ctx) {
      const int g = ctx.replica_id_in_sync_group();
      std::vector<float> grad(1 << 16, float(g));
      std::this_thread::sleep_for(std::chrono::milliseconds(g == last ? 20 : 2));  // the slow replica
      // (reduce_line counts from its definition above: keep these three lines together.)
      ctx.all_reduce(mirror::ReduceOp::sum, std::span<float>(grad));
      (void)ctx.broadcast(std::vector<int>(8, g), last);
      (void)ctx.all_reduce(mirror::ReduceOp::max, grad[0]);
    });
  }
  if (strategy.is_chief()) {
    std::printf("lines %u %u %u\n", reduce_line, broadcast_line, scalar_line);
    std::fflush(stdout);
  }
  if (end == "exit") std::exit(0);
  if (end == "throw") throw std::runtime_error("write_timeline: an exception nobody catches");
  if (end == "signal") std::raise(SIGSEGV);
  strategy.set_timeline("");  // ends the file
  return 0;
}
