#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Contract consumer, subproject flavour: a tiny Meson project (tests/consumer/subproject/)
# with this repository as subprojects/mirror gets mirror through dependency('mirror')
# (meson.override_dependency), builds tests/consumer/contract.cpp,
# contract_default_device.cpp (which links the CUDA backend in CUDA builds) and
# contract_mpi_header.cpp (which includes <mpi.h> itself in MPI builds) and runs them.
#
#   run_subproject.sh BUILD_DIR SRC_DIR      (BUILD_DIR is unused: the consumer has its own)
#                                            (CXX: the compiler command, default g++)
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SRC_DIR" >&2
  exit 2
fi
src_dir=$(cd "$2" && pwd)
export CXX=${CXX:-g++}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mirror-subproject.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
proj="$tmp/consumer"

mkdir -p "$proj/subprojects"
cp "$src_dir/tests/consumer/subproject/meson.build" "$src_dir/tests/consumer/contract.cpp" \
   "$src_dir/tests/consumer/contract_default_device.cpp" \
   "$src_dir/tests/consumer/contract_mpi_header.cpp" "$proj/"
ln -s "$src_dir" "$proj/subprojects/mirror"

meson setup "$tmp/build" "$proj" --wrap-mode=nodownload >"$tmp/setup.log" 2>&1 || {
  cat "$tmp/setup.log"
  echo "FAIL: meson setup of the subproject consumer failed" >&2
  exit 1
}
meson compile -C "$tmp/build"
"$tmp/build/contract"
echo "PASS: contract.cpp built with mirror as a Meson subproject and ran"
"$tmp/build/contract_default_device"
echo "PASS: contract_default_device.cpp (devices::Default, CUDA backend libraries in CUDA builds) ran"
"$tmp/build/contract_mpi_header"
echo "PASS: contract_mpi_header.cpp (includes <mpi.h> in MPI builds) built with dependency('mirror') and ran"
"$tmp/build/contract_separate"
echo "PASS: contract.cpp built with dependency('mirror-separate') and ran"
