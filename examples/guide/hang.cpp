// SPDX-License-Identifier: Apache-2.0
// docs/debugging.md: a hang found with the flight recorder. A training loop in which one replica
// blocks forever in its own code (here: waiting on an input queue nobody fills) while the others
// wait for it in the next all-reduce. Nothing fails until the collective timeout (5 minutes by
// default); a signal makes the program print where every replica is. Here a watchdog thread
// sends the signal itself after a second, then unblocks the replica so that the program ends.
// Exits 1 when the dump does not show the hang.
#include <mirror/mirror.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

static std::atomic<bool> input_ready{false};

// The stand-in for the user's bug: a replica whose input never arrives.
static void wait_for_input(int replica, int step) {
  if (replica == 2 && step == 3) {
    while (!input_ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int main() {
  // [signal]
  // Any time the program seems stuck: kill -USR1 <pid> prints every strategy's recorder.
  std::signal(SIGUSR1, [](int) { mirror::dump_flight_recorders(STDOUT_FILENO); });
  // [/signal]

  mirror::Strategy<mirror::devices::Threads> strategy{{.replicas = 4}};
  strategy.set_flight_recorder(4);  // the last 4 collectives of each replica

  std::thread watchdog([] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::raise(SIGUSR1);  // what `kill -USR1` would do
    input_ready = true;
  });

  // [loop]
  std::vector<float> weights(1000, 0.0f);
  strategy.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    std::vector<float> grad(weights.size());
    for (int step = 0; step < 5; ++step) {
      wait_for_input(r, step);
      for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = float(r + step);
      ctx.all_reduce(mirror::ReduceOp::mean, std::span<float>(grad));
      const float norm = *ctx.all_reduce(mirror::ReduceOp::max, grad[0]);
      (void)norm;
    }
  });
  // [/loop]
  watchdog.join();

  // The dump went to stdout; check what the recorder holds now that the run has ended.
  const auto hung = strategy.flight_recorder().records(2);
  const bool ok = hung.size() == 4 && hung.back().sequence == 10 &&
                  hung.back().state == mirror::CollectiveRecord::State::completed;
  std::printf("hang: %s\n", ok ? "found and released" : "WRONG RECORDS");
  return ok ? 0 : 1;
}
