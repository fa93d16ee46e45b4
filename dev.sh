#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# dev.sh: everything on a fresh Debian 12 machine, one command per job.
#
#   ./dev.sh example [tsan|asan]                 install what is missing, build, run the
#                                                main example (examples/overview.cpp)
#   ./dev.sh test    [tsan|asan] [-- ARGS...]    install what is missing, build, run the
#                                                whole test suite (ARGS go to meson test,
#                                                e.g. -- --suite mirror)
#
# Build directories: build (plain), build-tsan (-Db_sanitize=thread), build-asan
# (-Db_sanitize=address,undefined). Re-running reuses them (meson setup --reconfigure,
# which also picks up headers added since the last configure).
# Packages are installed with apt-get only when one is missing (sudo when not root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PACKAGES=(meson ninja-build g++ pkg-config python3 libboost-dev catch2 libbenchmark-dev)

log() { printf '==> %s\n' "$*"; }
die() { printf 'dev.sh: %s\n' "$*" >&2; exit 2; }

usage() {
  awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "${BASH_SOURCE[0]}"
  exit "${1:-2}"
}

install_missing() {
  if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    log "no apt/dpkg here: make sure these (or equivalents) are installed: ${PACKAGES[*]}"
    return 0
  fi
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "packages: all installed"
    return 0
  fi
  local as_root=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "installing ${missing[*]} needs root or sudo"
    as_root=(sudo)
  fi
  log "installing: ${missing[*]}"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# configure DIR OPTION...: set up DIR, or reconfigure it when it already holds a build.
configure() {
  local dir=$1; shift
  if [[ -f $dir/meson-private/coredata.dat ]]; then
    log "meson setup --reconfigure $dir $*"
    meson setup --reconfigure "$dir" "$@" && return 0
    log "reconfigure failed: wiping $dir"
    meson setup --wipe "$dir" "$@"
  else
    log "meson setup $dir $*"
    meson setup "$dir" "$@"
  fi
}

cmd=${1:-}
[[ -n $cmd ]] || usage 2
shift
variant=plain
if [[ ${1:-} == tsan || ${1:-} == asan || ${1:-} == plain ]]; then
  variant=$1
  shift
fi
test_args=()
if [[ ${1:-} == -- ]]; then
  shift
  test_args=("$@")
elif [[ $# -gt 0 ]]; then
  die "unexpected argument '$1' (see ./dev.sh help)"
fi

options=(-Dtests=enabled -Dexamples=true)
run_prefix=()
case $variant in
  plain)
    build_dir=build
    ;;
  tsan)
    build_dir=build-tsan
    options+=(-Db_sanitize=thread -Dbuildtype=debugoptimized)
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1}
    test_args=(--timeout-multiplier 4 "${test_args[@]}")
    # gcc 12's TSan cannot map its shadow memory with the high-entropy ASLR of newer
    # kernels (vm.mmap_rnd_bits > 28): run the tests with randomization off there.
    if [[ $(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28) -gt 28 ]] &&
      command -v setarch >/dev/null 2>&1; then
      run_prefix=(setarch "$(uname -m)" -R)
    fi
    ;;
  asan)
    build_dir=build-asan
    options+=(-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized)
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
    test_args=(--timeout-multiplier 3 "${test_args[@]}")
    ;;
esac

case $cmd in
  example)
    install_missing
    configure "$build_dir" "${options[@]}"
    meson compile -C "$build_dir" examples/overview
    log "$build_dir/examples/overview"
    "${run_prefix[@]}" "./$build_dir/examples/overview"
    ;;
  test)
    install_missing
    configure "$build_dir" "${options[@]}"
    meson compile -C "$build_dir"
    log "meson test -C $build_dir --print-errorlogs ${test_args[*]}"
    "${run_prefix[@]}" meson test -C "$build_dir" --print-errorlogs "${test_args[@]}"
    ;;
  help | -h | --help)
    usage 0
    ;;
  *)
    die "unknown command '$cmd' (see ./dev.sh help)"
    ;;
esac
