#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Contract consumers, CMake flavour: the CMake project tests/consumer/CMakeLists.txt
# (find_package(mirror 0.1 CONFIG REQUIRED) + mirror::mirror / mirror::separate), configured
# with the system's cmake against an installed mirror, built and run, as a CMake user would.
#
#   run_cmake.sh BUILD_DIR SRC_DIR                install BUILD_DIR into a temporary DESTDIR;
#                                                 use it there, then moved to another prefix
#   run_cmake.sh --header-only BUILD_DIR SRC_DIR  the same for a build of SRC_DIR without
#                                                 CUDA, NCCL and MPI, made here (BUILD_DIR unused)
#
# Each run also checks that a component this install lacks (or an unknown one) is a configure
# error naming the components it has, and that the next minor version is refused
# (SameMinorVersion). Exit 77 (skip) without cmake. CXX: the compiler command (default c++);
# CONSUMER_SANITIZE: the build's b_sanitize, as in run_consumer.sh.
set -euo pipefail

header_only=false
if [[ ${1:-} == --header-only ]]; then
  header_only=true
  shift
fi
if [[ $# -ne 2 ]]; then
  echo "usage: $0 [--header-only] BUILD_DIR SRC_DIR" >&2
  exit 2
fi
if ! command -v cmake >/dev/null 2>&1; then
  echo "SKIP: cmake not found (Debian: apt-get install cmake; ./dev.sh installs it)"
  exit 77
fi
build_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mirror-cmake.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
destdir="$tmp/root"

sanitize=${CONSUMER_SANITIZE:-none}
if $header_only; then
  # A second build of this source tree: no backend but threads, no tests; only the libraries
  # it installs are compiled (libmirror_threads).
  build_dir="$tmp/build-header-only"
  meson setup "$build_dir" "$src_dir" -Dcuda=disabled -Dnccl=disabled -Dmpi=disabled \
    -Dtests=disabled -Dexamples=false -Dbenchmarks=false -Db_sanitize="$sanitize" \
    --wrap-mode=nodownload >"$tmp/setup.log" 2>&1 || {
    cat "$tmp/setup.log"
    echo "FAIL: meson setup of the header-only build failed" >&2
    exit 1
  }
  meson install -C "$build_dir" --destdir "$destdir" --quiet
else
  meson install -C "$build_dir" --destdir "$destdir" --no-rebuild --quiet
fi

config=$(find "$destdir" -name mirrorConfig.cmake -print -quit)
if [[ -z $config ]]; then
  echo "FAIL: meson install did not install mirrorConfig.cmake (was cmake found when $build_dir was configured?)" >&2
  exit 1
fi
pc=$(find "$destdir" -name mirror.pc -print -quit)
prefix=$(sed -n 's/^prefix=//p' "$pc")
root="$destdir$prefix"
# Relocatable: no path into the install prefix (where mirror may also be installed for real,
# which would hide the mistake below) may be baked into the package.
baked=$(awk -v p="$prefix/" 'index($0, p) && (index($0, "mirror-0") || index($0, "libmirror_"))' \
  "$(dirname "$config")"/*.cmake)
if [[ -n $baked ]]; then
  echo "$baked"
  echo "FAIL: the CMake package names paths under its install prefix $prefix" >&2
  exit 1
fi

# What this build has, from its mirror/config.hpp.
has=(threads)
for backend in cuda nccl mpi; do
  if grep -q "^#define MIRROR_HAS_${backend^^} 1" "$build_dir/mirror/config.hpp"; then
    has+=("$backend")
  fi
done
lacks=()
for backend in cuda nccl mpi; do
  [[ " ${has[*]} " == *" $backend "* ]] || lacks+=("$backend")
done

# The compiler: CMake takes CXX's first word as the compiler and the rest as flags, so a
# launcher in front (ccache c++) goes to CMAKE_CXX_COMPILER_LAUNCHER instead.
read -r -a cxx <<<"${CXX:-c++}"
cmake_compiler=()
case $(basename "${cxx[0]}") in
  ccache | sccache) cmake_compiler=(-DCMAKE_CXX_COMPILER_LAUNCHER="${cxx[0]}"); cxx=("${cxx[@]:1}") ;;
esac
cmake_compiler+=(-DCMAKE_CXX_COMPILER="${cxx[0]}")
cxx_flags="-O1 ${cxx[*]:1}"
[[ $sanitize != none ]] && cxx_flags+=" -fsanitize=$sanitize"  # the installed archives are instrumented

# configure NAME PROJECT [cmake args...]: the CMake project in folder PROJECT into $tmp/NAME.
configure() {
  local name=$1 project=$2
  shift 2
  cmake -S "$project" -B "$tmp/$name" -G Ninja "${cmake_compiler[@]}" \
    -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_FLAGS="$cxx_flags" "$@" >"$tmp/$name.log" 2>&1 || {
    cat "$tmp/$name.log"
    echo "FAIL: cmake could not configure $project ($name)" >&2
    exit 1
  }
  grep -- '-- mirror ' "$tmp/$name.log"
}

# run DIR HOW PROGRAM...: build those targets in $tmp/DIR and run them (HOW: for the log).
run() {
  local dir=$1 how=$2
  shift 2
  cmake --build "$tmp/$dir" --target "$@" >"$tmp/$dir.build.log" 2>&1 || {
    cat "$tmp/$dir.build.log"
    echo "FAIL: the consumer did not build in $dir" >&2
    exit 1
  }
  local p
  for p in "$@"; do
    case $p in
      # MPI_Init's allocations are never freed (Open MPI's own "leaks"; tests/mpi/mpi_env.sh)
      contract_mpi_header) ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$tmp/$dir/$p" ;;
      *) "$tmp/$dir/$p" ;;
    esac
    echo "PASS: $p built with $how and ran"
  done
}

# 1. The installed tree, where `meson install --destdir` put it; asking for every component
#    this install has (the second find_package in CMakeLists.txt) must work too.
# (The contract itself is the slowest to compile: once, in the build with backends.)
programs=(contract_default_device contract_default_device_separate)
$header_only || programs+=(contract)
[[ " ${has[*]} " == *" mpi "* ]] && programs+=(contract_mpi_header)
configure installed "$src_dir/tests/consumer" -DCMAKE_PREFIX_PATH="$root" \
  -DMIRROR_CONSUMER_COMPONENTS="$(IFS=';'; echo "${has[*]}")"
run installed "find_package(mirror)" "${programs[@]}"

# 2. Refusals, in a project without languages (they fail before anything is compiled; without
#    a compiler CMake does not know the multiarch libdir, so mirror_DIR names the folder).
mkdir "$tmp/refusals"
cat >"$tmp/refusals/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.17)
project(mirror_refusals NONE)
find_package(mirror ${VERSION} CONFIG REQUIRED COMPONENTS ${COMPONENTS})
EOF
# refuse WHAT EXPECTED VERSION COMPONENTS: configuring must fail, printing EXPECTED.
refuse() {
  local what=$1 expected=$2 version=$3 components=$4 log="$tmp/refusal.log"
  rm -rf "$tmp/refusals-build"
  if cmake -S "$tmp/refusals" -B "$tmp/refusals-build" -Dmirror_DIR="$(dirname "$config")" \
      -DVERSION="$version" -DCOMPONENTS="$components" >"$log" 2>&1; then
    cat "$log"
    echo "FAIL: find_package(mirror $version COMPONENTS $components) succeeded: $what" >&2
    exit 1
  fi
  # CMake wraps long messages: compare with the line breaks and indentation removed.
  if ! tr -s ' \n' ' ' <"$log" | grep -qF -- "$expected"; then
    cat "$log"
    echo "FAIL: $what: the error does not say '$expected'" >&2
    exit 1
  fi
  echo "PASS: $what is a configure error:"
  sed -n '/CMake Error/,/Configuring incomplete/p' "$log" | grep -v -e '^$' -e 'Configuring incomplete' |
    sed 's/^/    /'
}
have_list=$(IFS=,; echo "${has[*]}" | sed 's/,/, /g')
version=$(sed -n 's/^Version: //p' "$pc")
if [[ ${#lacks[@]} -gt 0 ]]; then
  refuse "a component this install lacks (${lacks[0]})" "it has: $have_list" "${version%.*}" "${lacks[0]}"
fi
refuse "an unknown component" "unknown mirror component(s) rocm" "${version%.*}" "threads;rocm"
IFS=. read -r major minor _ <<<"$version"
refuse "the next minor version" "compatible with requested version \"$major.$((minor + 1))\"" \
  "$major.$((minor + 1))" threads

# 3. The build itself, not installed: pkg-config's uninstalled mirror.pc from the build's
#    meson-uninstalled/ folder, through pkg_check_modules(... IMPORTED_TARGET) (uninstalled/).
PKG_CONFIG_PATH="$build_dir/meson-uninstalled" configure uninstalled-build "$src_dir/tests/consumer/uninstalled"
run uninstalled-build "pkg_check_modules(mirror IMPORTED_TARGET mirror)" \
  contract_default_device contract_default_device_separate contract_mpi_header
echo "PASS: the build used uninstalled, through PKG_CONFIG_PATH=$build_dir/meson-uninstalled"

# 4. The same tree moved to another prefix: nothing in it may name where it was installed.
moved="$tmp/elsewhere/opt/mirror"
mkdir -p "$(dirname "$moved")"
mv "$root" "$moved"
configure moved "$src_dir/tests/consumer" -DCMAKE_PREFIX_PATH="$moved"
if ! grep -qF -- "from $moved/" "$tmp/moved.log"; then
  echo "FAIL: cmake did not take mirror from $moved" >&2
  exit 1
fi
relocated=(contract_default_device contract_default_device_separate)
[[ " ${has[*]} " == *" mpi "* ]] && relocated+=(contract_mpi_header)
run moved "find_package(mirror) from the moved tree" "${relocated[@]}"
echo "PASS: the package works from a copy moved to another prefix ($moved)"
