#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_fuzz.sh TARGET SECONDS [SRC_DIR] [BUILD_DIR]: builds tests/fuzz/TARGET_fuzz.cpp with
# clang++ -fsanitize=fuzzer,address,undefined and runs it for SECONDS on a copy of its seed
# corpus (tests/fuzz/corpus/TARGET: the repository's corpus is never written). Prints
# libFuzzer's final statistics (executions per second, coverage). Exit status: 0 when the
# fuzzer found nothing, 1 on a finding (its input is kept in BUILD_DIR/fuzz/TARGET-findings/),
# 77 (Meson: skipped) with a SKIP line when clang++ with libFuzzer is missing.
#
#   tests/fuzz/run_fuzz.sh restore 600      # a long run, by hand (release checklist: 10 min each)
#
# CXX_FUZZ overrides the compiler (default clang++-14, then clang++). Debian: apt-get install
# clang-14 libclang-rt-14-dev (./dev.sh installs them).
set -euo pipefail
target=${1:?usage: run_fuzz.sh TARGET SECONDS [SRC_DIR] [BUILD_DIR]}
seconds=${2:?usage: run_fuzz.sh TARGET SECONDS [SRC_DIR] [BUILD_DIR]}
src=$(cd "${3:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
build=$(cd "${4:-$src/build}" && pwd)

cxx=${CXX_FUZZ:-}
if [[ -z $cxx ]]; then
  for c in clang++-14 clang++; do
    if command -v "$c" >/dev/null 2>&1; then cxx=$c; break; fi
  done
fi
skip() {
  echo "SKIP: $1: the fuzz target '$target' did NOT run (Debian: apt-get install clang-14 libclang-rt-14-dev)"
  exit 77
}
[[ -n $cxx ]] || skip "no clang++ found"
[[ -f $build/mirror/config.hpp ]] || { echo "run_fuzz.sh: $build is not a configured build directory" >&2; exit 2; }

out=$build/fuzz
mkdir -p "$out"
exe=$out/${target}_fuzz
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I"$src" -I"$build")
# Rebuilt when missing or older than any header or the target's source.
if [[ ! -x $exe || -n $(find "$src/tests/fuzz/${target}_fuzz.cpp" "$src/mirror" "$src/backends/threads" "$src/examples/fashion_mnist" -newer "$exe" -print -quit) ]]; then
  probe=$out/probe.cpp
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe"
  "$cxx" -fsanitize=fuzzer "$probe" -o "$out/probe" >/dev/null 2>&1 || skip "$cxx cannot link libFuzzer"
  echo "==> $cxx ${flags[*]} tests/fuzz/${target}_fuzz.cpp"
  "$cxx" "${flags[@]}" "$src/tests/fuzz/${target}_fuzz.cpp" -o "$exe" -pthread -lz
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/mirror-fuzz-$target.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$src/tests/fuzz/corpus/$target" "$work/corpus"
findings=$out/$target-findings
mkdir -p "$findings"
echo "==> $exe -max_total_time=$seconds (seed corpus: $(ls "$work/corpus" | wc -l) inputs)"
# -rss_limit_mb: the restore target keeps a thread pool and its scratch; 2 GiB is libFuzzer's own
# default, kept explicit. Leaks are checked (ASan's LeakSanitizer) at exit.
status=0
(cd "$work" && ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$exe" -max_total_time="$seconds" -print_final_stats=1 \
   -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$findings/" "$work/corpus" >"$work/log" 2>&1) || status=$?
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::' "$work/log" || true
if [[ $status -ne 0 ]]; then
  tail -60 "$work/log"
  echo "FINDING: $target (input saved in $findings)"
  exit 1
fi
echo "$target: no finding in $seconds s"
