// SPDX-License-Identifier: Apache-2.0
#pragma once
// The command line both fault-injection harnesses share (tests/fault/fault_injection.cpp in one
// process, tests/fault/cluster_fault_injection.cpp across workers): which trials to run, and
// when the watchdog calls a trial hung.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace mirror::test {

struct trial_options {
  std::uint64_t trials = 300;  // --trials N
  std::uint64_t seed = 1;      // --seed S: trial t uses the random stream (S, t)
  std::uint64_t first = 0;     // --first T: the first trial's id (--first T --trials 1 replays T)
  double hang_seconds = 120;   // --hang-seconds H: the watchdog's limit per trial
  bool verbose = false;        // --verbose: print each trial before it runs
};

/// Parses the shared flags; `own(flag, options)` takes a harness's own flags and returns whether
/// it did. A flag nobody takes prints `usage` and exits with status 2, as does a missing value.
template <class Own>
trial_options parse_trial_options(int argc, char** argv, const char* usage, Own&& own) {
  trial_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n%s\n", a.c_str(), usage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--trials") {
      o.trials = std::strtoull(value(), nullptr, 10);
    } else if (a == "--seed") {
      o.seed = std::strtoull(value(), nullptr, 10);
    } else if (a == "--first") {
      o.first = std::strtoull(value(), nullptr, 10);
    } else if (a == "--hang-seconds") {
      o.hang_seconds = std::strtod(value(), nullptr);
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if (!own(a, o)) {
      std::fprintf(stderr, "%s\n", usage);
      std::exit(2);
    }
  }
  return o;
}

}  // namespace mirror::test
