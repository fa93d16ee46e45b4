// SPDX-License-Identifier: Apache-2.0
// mirror::FlightRecorder (docs/debugging.md): what each replica's records hold (call, bytes,
// call site, times, state) against what the test made them do; the ring keeps the last n; a
// replica that hangs is found from another thread while it hangs; timeouts and mismatches
// carry the table; the settings (set_flight_recorder, MIRROR_FLIGHT_RECORDER).

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>
#include <mirror/mirror.hpp>

using mirror::CollectiveRecord;
using mirror::ReduceOp;
using namespace std::chrono_literals;
using S = mirror::Strategy<mirror::devices::Threads>;

namespace {

std::string site(unsigned line) { return std::string(__FILE__) + ":" + std::to_string(line); }

// Everything written to a pipe by `write_to(fd)`.
template <class Write>
std::string captured(Write&& write_to) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::string out;
  std::thread reader([&] {
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  });
  write_to(fds[1]);
  close(fds[1]);
  reader.join();
  close(fds[0]);
  return out;
}

}  // namespace

TEST_CASE("each replica's records say what it called, where, with how many bytes, and when", "[flight_recorder]") {
  S s{{.replicas = 3}};
  s.set_flight_recorder(8);
  REQUIRE(s.flight_recorder().kept() == 8);
  std::atomic<unsigned> reduce_line{0}, broadcast_line{0}, gather_line{0};
  for (int run = 1; run <= 2; ++run) {
    s.run([&](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      reduce_line = __LINE__ + 1;
      (void)ctx.all_reduce(ReduceOp::sum, std::vector<float>(10, 1.0f));
      broadcast_line = __LINE__ + 1;
      (void)ctx.broadcast(std::vector<int>(5, r), 2);
      gather_line = __LINE__ + 1;
      (void)ctx.all_gather(std::vector<double>(static_cast<std::size_t>(r), 1.0), mirror::axis0);
    });
  }
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto records = s.flight_recorder().records(r);
    REQUIRE(records.size() == 6);
    const std::vector<std::string> calls = {"all_reduce(sum)", "broadcast(from = 2)", "all_gather"};
    const std::vector<unsigned> lines = {reduce_line, broadcast_line, gather_line};
    const std::vector<std::uint64_t> bytes = {40, 20, 8 * static_cast<std::uint64_t>(r)};
    for (std::size_t i = 0; i < records.size(); ++i) {
      const CollectiveRecord& c = records[i];
      CAPTURE(i);
      CHECK(c.run == i / 3 + 1);
      CHECK(c.sequence == i % 3 + 1);
      CHECK(c.call == calls[i % 3]);
      CHECK(c.bytes == bytes[i % 3]);
      CHECK(std::string(c.where.file_name()) == __FILE__);
      CHECK(c.where.line() == lines[i % 3]);
      CHECK(c.state == CollectiveRecord::State::completed);
      CHECK(c.end >= c.start);
      if (i > 0) CHECK(c.start >= records[i - 1].end);
    }
  }
  // The table has one line per record, each naming its replica, call and site.
  const std::string table = s.flight_recorder().table();
  CHECK_THAT(table, Catch::StartsWith("flight recorder: the last 8 collectives of replicas 0..2, oldest first:\n"));
  CHECK_THAT(table, Catch::Contains("replica 2  run 2  #3  all_gather") && Catch::Contains(site(gather_line)) &&
                        Catch::Contains("completed in"));
  CHECK(std::count(table.begin(), table.end(), '\n') == 1 + 3 * 6);
  // dump(fd) writes the same text.
  CHECK(captured([&](int fd) { s.flight_recorder().dump(fd); }) == table);
}

TEST_CASE("the ring keeps each replica's last n, oldest first; 0 keeps none", "[flight_recorder]") {
  S s{{.replicas = 2}};
  s.set_flight_recorder(4);
  s.run([](auto& ctx) {
    for (int k = 0; k < 10; ++k) (void)ctx.all_reduce(ReduceOp::max, k);
  });
  for (int r = 0; r < 2; ++r) {
    const auto records = s.flight_recorder().records(r);
    REQUIRE(records.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(records[i].sequence == 7 + i);
  }
  s.set_flight_recorder(0);
  s.run([](auto& ctx) { (void)ctx.all_reduce(ReduceOp::max, 1); });
  CHECK(s.flight_recorder().records(0).empty());
  CHECK(s.flight_recorder().table().empty());
  CHECK(captured([&](int fd) { s.flight_recorder().dump(fd); }).empty());
  // Only between runs.
  CHECK_THROWS_AS(s.run([&](auto&) { s.set_flight_recorder(3); }), mirror::error);
}

TEST_CASE("a replica that hangs is found from another thread, with its last call", "[flight_recorder]") {
  // Replica 2 hangs (on a flag) between collective #1 and #2; replicas 0 and 1 wait in #2. A
  // thread of the test reads the recorder meanwhile, as a user's watchdog or signal handler would.
  S s{{.replicas = 3, .timeout = 60s}};
  s.set_flight_recorder(8);
  std::atomic<bool> release{false};
  std::atomic<unsigned> first_line{0}, second_line{0};
  std::string table, dumped, all_dumped;
  std::vector<CollectiveRecord> waiting, hung;
  std::thread watchdog([&] {
    // Until both replicas that did not hang are in #2, and replica 2 has recorded the end of
    // #1 (it may leave that collective last, after the others started #2) and hangs.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      waiting = s.flight_recorder().records(1);
      const auto third = s.flight_recorder().records(2);
      if (waiting.size() == 2 && s.flight_recorder().records(0).size() == 2 && third.size() == 1 &&
          third[0].state == CollectiveRecord::State::completed) {
        break;
      }
      std::this_thread::sleep_for(1ms);
    }
    hung = s.flight_recorder().records(2);
    table = s.flight_recorder().table();
    dumped = captured([&](int fd) { s.flight_recorder().dump(fd); });
    all_dumped = captured([](int fd) { mirror::dump_flight_recorders(fd); });
    release = true;
  });
  s.run([&](auto& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    first_line = __LINE__ + 1;
    (void)ctx.all_reduce(ReduceOp::sum, r);
    if (r == 2) {
      while (!release) std::this_thread::sleep_for(1ms);
    }
    second_line = __LINE__ + 1;
    (void)ctx.broadcast(r, 0);
  });
  watchdog.join();
  REQUIRE(waiting.size() == 2);
  CHECK(waiting[1].sequence == 2);
  CHECK(waiting[1].state == CollectiveRecord::State::running);
  CHECK(waiting[1].where.line() == second_line);
  REQUIRE(hung.size() == 1);
  CHECK(hung[0].call == "all_reduce(sum)");
  CHECK(hung[0].where.line() == first_line);
  CHECK(hung[0].state == CollectiveRecord::State::completed);
  CHECK_THAT(table, Catch::Contains("replica 0  run 1  #2  broadcast(from = 0)") &&
                        Catch::Contains(site(second_line) + "  started at") && Catch::Contains("running"));
  CHECK_THAT(table, Catch::Contains("replica 2  run 1  #1  all_reduce(sum)") && Catch::Contains(site(first_line)));
  CHECK(dumped == table);
  CHECK_THAT(all_dumped, Catch::Contains(table));
  // After the release every record completed.
  for (int r = 0; r < 3; ++r) {
    for (const auto& c : s.flight_recorder().records(r)) CHECK(c.state == CollectiveRecord::State::completed);
  }
}

TEST_CASE("timeouts and mismatches carry the table; failed calls are marked", "[flight_recorder]") {
  S s{{.replicas = 2, .timeout = 300ms}};
  s.set_flight_recorder(4);
  SECTION("a timeout") {
    std::string what;
    try {
      s.run([](auto& ctx) {
        (void)ctx.all_reduce(ReduceOp::sum, 1);
        if (ctx.replica_id_in_sync_group() == 1) return;
        (void)ctx.all_reduce(ReduceOp::sum, 2);
      });
    } catch (const mirror::timeout_error& e) {
      what = e.what();
    }
    CHECK_THAT(what, Catch::Contains("\nflight recorder: the last 4 collectives of replicas 0..1"));
    CHECK_THAT(what, Catch::Contains("replica 0  run 1  #2  all_reduce(sum)") && Catch::Contains("running"));
    CHECK_THAT(what, Catch::Contains("replica 1  run 1  #1  all_reduce(sum)"));
    const auto records = s.flight_recorder().records(0);
    REQUIRE(records.size() == 2);
    CHECK(records[1].state == CollectiveRecord::State::failed);
  }
  SECTION("a mismatch: the same text on every replica") {
    std::vector<std::string> texts(2);
    s.run([&](auto& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      try {
        (void)ctx.all_reduce(ReduceOp::sum, std::vector<float>(static_cast<std::size_t>(3 + r), 1.0f));
      } catch (const mirror::shape_error& e) {
        texts[static_cast<std::size_t>(r)] = e.what();
      }
    });
    CHECK_THAT(texts[0], Catch::Contains("shape mismatch") && Catch::Contains("\nflight recorder:"));
    CHECK(texts[0] == texts[1]);
    for (int r = 0; r < 2; ++r) CHECK(s.flight_recorder().records(r).back().state == CollectiveRecord::State::failed);
  }
  SECTION("off: no table") {
    s.set_flight_recorder(0);
    try {
      s.run([](auto& ctx) { (void)ctx.all_reduce(ReduceOp::sum, ctx.replica_id_in_sync_group() == 0 ? 1.0 : 1.0f); });
    } catch (const mirror::shape_error& e) {
      CHECK_THAT(std::string(e.what()), !Catch::Contains("flight recorder"));
    }
  }
}

TEST_CASE("MIRROR_FLIGHT_RECORDER sets the default; a bad value is an invalid_argument naming it", "[flight_recorder]") {
  unsetenv("MIRROR_FLIGHT_RECORDER");
  CHECK(S{{.replicas = 2}}.flight_recorder().kept() == mirror::FlightRecorder::default_kept);
  setenv("MIRROR_FLIGHT_RECORDER", "3", 1);
  CHECK(S{{.replicas = 2}}.flight_recorder().kept() == 3);
  setenv("MIRROR_FLIGHT_RECORDER", "0", 1);
  CHECK(S{{.replicas = 2}}.flight_recorder().kept() == 0);
  for (const char* bad : {"abc", "-1", "12x", "", "99999999"}) {
    CAPTURE(bad);
    setenv("MIRROR_FLIGHT_RECORDER", bad, 1);
    try {
      S s{{.replicas = 2}};
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains("MIRROR_FLIGHT_RECORDER="));
    }
  }
  unsetenv("MIRROR_FLIGHT_RECORDER");
}
