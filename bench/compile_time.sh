#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compile time of a translation unit using run / reduce / all_reduce on a 3-level nest
# (bench/compile/mirror_nest3.cpp) against the same program hand-written with std::thread
# (bench/compile/std_thread_nest3.cpp): the same compiler and flags as the build (the project's
# debugoptimized: -std=c++20 -O2 -g), compiled alternately, CPU seconds (user + system) per
# compile. mirror's file is compiled twice: header-only (the default) and with
# -DMIRROR_SEPARATE_COMPILATION (its non-template code from libmirror_threads; what that
# library costs to compile, once per build of mirror, is measured too). Prints JSON:
# {"mirror": [s, ...], "mirror_separate": [...], "std_thread": [...], "library": [...],
#  "compiler": "...", "flags": "..."}.
#
#   bench/compile_time.sh [--build DIR] [--runs 3] [--instructions]
# DIR (default build-bench) is a configured build directory (for mirror/config.hpp).
# --instructions: instead of CPU seconds, the instructions the compiler proper (cc1plus) executes
# for each translation unit, in billions, counted once by valgrind's callgrind (Debian:
# valgrind): the same count on every run of the same compiler, whatever else the machine does,
# where CPU seconds scatter by 5-25 % on a shared VM. About a minute per compile.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build-bench runs=3 instructions=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift ;;
    --runs) runs=$2; shift ;;
    --instructions) instructions=1 ;;
    *) echo "compile_time.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
[[ -f $build/mirror/config.hpp ]] || { echo "compile_time.sh: $build is not a configured build directory (meson setup $build)" >&2; exit 2; }
cxx=${CXX:-c++}
flags=(-std=c++20 -O2 -g -pthread -I. -I"$build")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# CPU seconds (user + system) of one compile to an object file: unlike wall time, other load on
# the machine barely changes it.
seconds() {  # SOURCE [EXTRA FLAG...]
  python3 - "$tmp/out.o" "$cxx" "$@" "${flags[@]}" <<'PY'
import resource, subprocess, sys
out, cxx, src, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
subprocess.run([cxx, *flags, '-c', src, '-o', out], check=True)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(round(ru.ru_utime + ru.ru_stime, 3))
PY
}
if [[ $instructions == 1 ]]; then
  command -v valgrind >/dev/null || { echo "compile_time.sh: --instructions needs valgrind (Debian: valgrind)" >&2; exit 2; }
  # The compiler proper's command line (g++ -### prints it), run under callgrind.
  count() {  # SOURCE [EXTRA FLAG...]
    local src=$1; shift
    local cmd
    cmd=$("$cxx" "${flags[@]}" "$@" -c "$src" -o "$tmp/out.o" -### 2>&1 | grep -m1 cc1plus)
    eval "valgrind --tool=callgrind --callgrind-out-file=$tmp/callgrind.out $cmd" >"$tmp/valgrind.log" 2>&1 ||
      { cat "$tmp/valgrind.log" >&2; exit 1; }
    grep -o 'Collected : [0-9]*' "$tmp/valgrind.log" | awk '{printf "%.3f", $3 / 1e9}'
  }
  # (Assignments, not substitutions in printf's arguments: a failed count then stops the script
  # instead of printing an empty figure.)
  header=$(count bench/compile/mirror_nest3.cpp)
  separate=$(count bench/compile/mirror_nest3.cpp -DMIRROR_SEPARATE_COMPILATION)
  baseline=$(count bench/compile/std_thread_nest3.cpp)
  library=$(count backends/threads/separate_compilation.cpp)
  printf '{"unit": "G instructions (cc1plus)", "mirror": [%s], "mirror_separate": [%s], "std_thread": [%s], "library": [%s], "compiler": "%s", "flags": "%s"}\n' \
    "$header" "$separate" "$baseline" "$library" "$("$cxx" --version | head -1)" "${flags[*]}"
  exit 0
fi
m=() p=() s=() l=()
for ((i = 0; i < runs; ++i)); do
  m+=("$(seconds bench/compile/mirror_nest3.cpp)")
  s+=("$(seconds bench/compile/std_thread_nest3.cpp)")
  p+=("$(seconds bench/compile/mirror_nest3.cpp -DMIRROR_SEPARATE_COMPILATION)")
done
l+=("$(seconds backends/threads/separate_compilation.cpp)")
join() { local IFS=,; echo "$*"; }
printf '{"mirror": [%s], "mirror_separate": [%s], "std_thread": [%s], "library": [%s], "compiler": "%s", "flags": "%s"}\n' \
  "$(join "${m[@]}")" "$(join "${p[@]}")" "$(join "${s[@]}")" "$(join "${l[@]}")" "$("$cxx" --version | head -1)" \
  "${flags[*]}"
