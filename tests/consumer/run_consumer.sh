#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Contract consumers, installed flavour: install this build into a temporary DESTDIR, then
# build every tests/consumer/contract*.cpp outside the tree with nothing but
#   $CXX -std=c++20 -O1 contract.cpp $(pkg-config --cflags --libs mirror)
# and run it. The exit code is the verdict.
#
#   run_consumer.sh BUILD_DIR SRC_DIR        (CXX: the compiler command, default g++;
#                                             CONSUMER_SANITIZE: the build's b_sanitize)
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SRC_DIR" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
cxx=${CXX:-g++}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mirror-consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
destdir="$tmp/root"

meson install -C "$build_dir" --destdir "$destdir" --no-rebuild --quiet

pc=$(find "$destdir" -name mirror.pc -print -quit)
if [[ -z $pc ]]; then
  echo "FAIL: meson install did not install mirror.pc" >&2
  exit 1
fi
separate_pc=$(find "$destdir" -name mirror-separate.pc -print -quit)
if [[ -z $separate_pc ]]; then
  echo "FAIL: meson install did not install mirror-separate.pc" >&2
  exit 1
fi
# Relocate the install prefix into DESTDIR: copies of mirror.pc (datadir in header-only builds)
# and mirror-separate.pc (libdir) whose prefix= line names it. Not PKG_CONFIG_SYSROOT_DIR, which
# would also prefix paths outside the install (the CUDA toolkit's -L and rpath in CUDA builds),
# nor --define-variable=prefix=, which also redefines the prefix of the modules mirror.pc
# requires (ompi-c's -I, so a program that includes <mpi.h> would not find it).
prefix=$(sed -n 's/^prefix=//p' "$pc")
mkdir "$tmp/pkgconfig"
for f in "$pc" "$separate_pc"; do
  sed "s|^prefix=.*|prefix=$destdir$prefix|" "$f" >"$tmp/pkgconfig/$(basename "$f")"
done
export PKG_CONFIG_PATH="$tmp/pkgconfig"
flags=$(pkg-config --cflags --libs mirror)
echo "pkg-config --cflags --libs mirror: $flags"
sanitize=()
if [[ -n ${CONSUMER_SANITIZE:-} && $CONSUMER_SANITIZE != none ]]; then
  sanitize=(-fsanitize="$CONSUMER_SANITIZE")  # the installed archives are instrumented
fi

for program in "$src_dir"/tests/consumer/contract*.cpp; do
  name=$(basename "$program" .cpp)
  # shellcheck disable=SC2086  # $cxx and $flags are word lists
  $cxx -std=c++20 -O1 "${sanitize[@]}" "$program" $flags -o "$tmp/$name"
  case $name in
    # MPI_Init's allocations are never freed (Open MPI's own "leaks"; tests/mpi/mpi_env.sh)
    contract_cluster* | contract_mpi_header) ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$tmp/$name" ;;
    *) "$tmp/$name" ;;
  esac
  echo "PASS: $name.cpp built with pkg-config mirror and ran"
done

# MIRROR_SEPARATE_COMPILATION, against the installed libmirror_threads: the contract in two
# translation units (it and a second one that includes everything too), and the programs
# whose device comes from another backend (Cluster in MPI builds, Cuda in CUDA builds).
separate_flags=$(pkg-config --cflags --libs mirror-separate)
echo "pkg-config --cflags --libs mirror-separate: $separate_flags"
printf '#include <mirror/mirror.hpp>\nint second_translation_unit() { return 0; }\n' >"$tmp/second.cpp"
for program in contract contract_cluster contract_default_device; do
  [[ -f $src_dir/tests/consumer/$program.cpp ]] || continue
  extra=()
  [[ $program == contract ]] && extra=("$tmp/second.cpp")
  # shellcheck disable=SC2086  # $cxx and $separate_flags are word lists
  $cxx -std=c++20 -O1 "${sanitize[@]}" "$src_dir/tests/consumer/$program.cpp" "${extra[@]}" $separate_flags \
    -o "$tmp/${program}_separate"
  case $program in
    contract_cluster) ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$tmp/${program}_separate" ;;
    *) "$tmp/${program}_separate" ;;
  esac
  echo "PASS: $program.cpp built with pkg-config mirror-separate and ran"
done
