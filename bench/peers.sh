#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mirror against what its users run today, on this machine: TensorFlow's MirroredStrategy and
# MultiWorkerMirroredStrategy, PyTorch DistributedDataParallel with gloo (bench/peers/), 2
# replicas, the same three measures as mirror's own programs:
#   1. a step with a 1-float all-reduce   (bench/run_bench: run/impl:run_all_reduce)
#   2. an all-reduce of 4 KiB, 1 MiB, 64 MiB per replica   (bench/all_reduce_bench: impl:default)
#   3. the Fashion-MNIST MLP, samples/s and test accuracy   (examples/fashion_mnist)
# and across 2 processes: devices::Cluster 2 workers x 1 replica (bench/mpi_cluster_bench,
# fashion_mnist --device cluster under mpirun) against MultiWorkerMirroredStrategy (2 workers on
# localhost, TF_CONFIG) and torch DDP (which is always one process per replica).
#
#   bench/peers.sh --setup          create the virtual environment (pip: pinned tensorflow-cpu,
#                                   torch, numpy) in build-peers/venv, then run
#   bench/peers.sh [--rounds 3] [--repetitions 5] [--min-time 0.2] [--epochs 3] [--batch-size 128]
#                  [--build DIR] [--venv DIR] [--limit N] [--no-multi-worker] [--quick]
#
# Every round runs every measure of every framework once, the frameworks in a rotating order
# (mirror, tf, torch; then tf, torch, mirror; ...), each timed measure inside
# `flock /tmp/mirror-bench.lock` so that it never overlaps another benchmark on the machine.
# Figures: the median over all repetitions of all rounds (micro-benchmarks) or over the rounds
# (training), with the range. Writes the raw output to bench/results/peers/, the table to
# bench/results/peers.md and a plot to bench/results/peers.png (gnuplot), and prints the table.
# Without the virtual environment (or where pip cannot reach the packages) each missing peer is
# skipped with a loud SKIP line and mirror's column is still measured.
# Needs: meson, ninja, g++, Open MPI (libopenmpi-dev, openmpi-bin), libbenchmark-dev, python3-venv.
# On request only: never in CI (it needs the network for --setup and takes 10-20 minutes, with the build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TF_VERSION=2.21.0 TORCH_VERSION=2.15.0 NUMPY_VERSION=2.4.6
setup=0 rounds=3 reps=5 min_time=0.2 epochs=3 batch=128 build=build-peers/build venv=build-peers/venv multi=1 limit=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --setup) setup=1 ;;
    --rounds) rounds=$2; shift ;;
    --repetitions) reps=$2; shift ;;
    --min-time) min_time=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --batch-size) batch=$2; shift ;;
    --build) build=$2; shift ;;
    --venv) venv=$2; shift ;;
    --limit) limit=$2; shift ;;
    --no-multi-worker) multi=0 ;;
    --quick) rounds=1 reps=2 min_time=0.05 epochs=2 ;;
    -h | --help) sed -n '3,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "peers.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

loud() { printf '\n==================== %s ====================\n\n' "$*" >&2; }

# --- the virtual environment -------------------------------------------------------------------
if [[ $setup -eq 1 ]]; then
  if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv" || { loud "SKIP setup: python3 -m venv failed (Debian: apt-get install python3-venv)"; }
  fi
  if [[ -x $venv/bin/python ]]; then
    pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
    "${pip[@]}" "numpy==$NUMPY_VERSION" || loud "SKIP: pip could not install numpy==$NUMPY_VERSION"
    "${pip[@]}" "tensorflow-cpu==$TF_VERSION" "numpy==$NUMPY_VERSION" \
      || loud "SKIP TensorFlow: pip could not install tensorflow-cpu==$TF_VERSION (no network or no wheel for this Python)"
    # torch's CPU-only index first (no CUDA wheels), PyPI where that index is not reachable.
    "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION" 2>/dev/null \
      || "${pip[@]}" "torch==$TORCH_VERSION" "numpy==$NUMPY_VERSION" \
      || loud "SKIP PyTorch: pip could not install torch==$TORCH_VERSION (no network or no wheel for this Python)"
  fi
fi
python=$venv/bin/python
have() { [[ -x $python ]] && "$python" -c "import $1" >/dev/null 2>&1; }
have_tf=0 have_torch=0
if have tensorflow; then have_tf=1; else loud "SKIP TensorFlow peer: '$python' cannot import tensorflow (run bench/peers.sh --setup)"; fi
if have torch; then have_torch=1; else loud "SKIP PyTorch peer: '$python' cannot import torch (run bench/peers.sh --setup)"; fi

# --- mirror's programs -------------------------------------------------------------------------
if ! command -v mpirun >/dev/null; then
  loud "SKIP multi-worker rows: mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev)"
  multi=0
fi
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" -Dbenchmarks=true -Dexamples=true -Dfashion_mnist=enabled -Dtests=disabled -Ddocs=false \
    -Dcuda=disabled -Dnccl=disabled -Dgpu_kit=disabled -Dmpi="$([[ $multi -eq 1 ]] && echo enabled || echo auto)"
fi
targets=(bench/run_bench bench/all_reduce_bench examples/fashion_mnist)
[[ $multi -eq 1 ]] && targets+=(bench/mpi_cluster_bench)
meson compile -C "$build" "${targets[@]}" >/dev/null

source tests/mpi/mpi_env.sh  # root, the containers' CMA copy: the same launches as the tests
mpirun=(mpirun -np 2 --bind-to none)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)

# The tree measured, before the results are written into it.
describe=$(git describe --always --dirty 2>/dev/null || echo unknown)
out=bench/results/peers
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.txt "$out"/plot.dat bench/results/peers.png
lock=(flock /tmp/mirror-bench.lock)
sizes=4096,1048576,67108864
sizes_re='(4096|1048576|67108864)'
peer_args=(--replicas 2 --sizes "$sizes" --repetitions "$reps" --min-time "$min_time" --epochs "$epochs"
           --batch-size "$batch" --lr 0.1 --momentum 0.9 --seed 1 --limit "$limit")
gbench=(--benchmark_repetitions="$reps" --benchmark_min_time="$min_time" --benchmark_format=json)

run_mirror() {  # round
  local r=$1
  echo "round $r: mirror" >&2
  "${lock[@]}" "$build/bench/run_bench" --benchmark_filter='^run/impl:run_all_reduce/type:float/replicas:2/' \
    "${gbench[@]}" >"$out/mirror_step_r$r.json"
  "${lock[@]}" "$build/bench/all_reduce_bench" \
    --benchmark_filter="^all_reduce/impl:default/type:float/replicas:2/bytes:$sizes_re/" \
    "${gbench[@]}" >"$out/mirror_all_reduce_r$r.json"
  "${lock[@]}" "$build/examples/fashion_mnist" --replicas 2 --epochs "$epochs" --batch-size "$batch" \
    --lr 0.1 --momentum 0.9 --seed 1 --limit "$limit" >"$out/mirror_train_r$r.txt"
  if [[ $multi -eq 1 ]]; then
    "${lock[@]}" "${mpirun[@]}" "$build/bench/mpi_cluster_bench" --replicas 1 --repetitions "$reps" \
      --min-time "$min_time" 4 4096 1048576 67108864 >"$out/mirror_mw_all_reduce_r$r.json"
    "${lock[@]}" "${mpirun[@]}" "$build/examples/fashion_mnist" --device cluster --replicas 1 --epochs "$epochs" \
      --batch-size "$batch" --lr 0.1 --momentum 0.9 --seed 1 --limit "$limit" >"$out/mirror_mw_train_r$r.txt"
  fi
}
run_tf() {
  local r=$1
  [[ $have_tf -eq 1 ]] || return 0
  echo "round $r: tensorflow" >&2
  "${lock[@]}" "$python" bench/peers/tf_peer.py --what micro "${peer_args[@]}" >"$out/tf_micro_r$r.txt"
  "${lock[@]}" "$python" bench/peers/tf_peer.py --what train "${peer_args[@]}" >"$out/tf_train_r$r.txt"
  if [[ $multi -eq 1 ]]; then
    "${lock[@]}" "$python" bench/peers/tf_peer.py --workers 2 --what micro "${peer_args[@]}" >"$out/tf_mw_micro_r$r.txt"
    "${lock[@]}" "$python" bench/peers/tf_peer.py --workers 2 --what train "${peer_args[@]}" >"$out/tf_mw_train_r$r.txt"
  fi
}
run_torch() {
  local r=$1
  [[ $have_torch -eq 1 ]] || return 0
  echo "round $r: pytorch" >&2
  "${lock[@]}" "$python" bench/peers/torch_peer.py --what micro "${peer_args[@]}" >"$out/torch_micro_r$r.txt"
  "${lock[@]}" "$python" bench/peers/torch_peer.py --what train "${peer_args[@]}" >"$out/torch_train_r$r.txt"
}

order=(run_mirror run_tf run_torch)
for ((r = 1; r <= rounds; ++r)); do
  echo "round $r: load average $(cut -d' ' -f1-3 /proc/loadavg) at the start" >>"$out/load.txt"
  for ((k = 0; k < 3; ++k)); do
    "${order[(r - 1 + k) % 3]}" "$r"
  done
done

# Versions of everything, for the table's header.
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') ($(nproc) cores)"
  echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "compiler: $(c++ --version | head -1)"
  echo "mpi: $(mpirun --version 2>/dev/null | head -1 || echo none)"
  echo "python: $( ([[ -x $python ]] && "$python" --version) || python3 --version)"
  [[ $have_tf -eq 1 ]] && echo "tensorflow: $("$python" -c 'import tensorflow as t; print(t.__version__)' 2>/dev/null)"
  [[ $have_torch -eq 1 ]] && echo "torch: $("$python" -c 'import torch; print(torch.__version__)')"
  [[ -x $python ]] && echo "numpy: $("$python" -c 'import numpy; print(numpy.__version__)' 2>/dev/null)"
  echo "config: rounds $rounds, repetitions $reps, min-time ${min_time}s, epochs $epochs, global batch $batch, 2 replicas"
  echo "git: $describe"
  sed 's/^round \([0-9]*\): load average/load (1, 5, 15 min), round \1:/' "$out/load.txt"
  echo "load (1, 5, 15 min), at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/versions.txt"

python3 bench/peers/table.py "$out" bench/results/peers.md
if [[ ! -f $out/plot.dat ]]; then
  echo "peers.sh: no peer measured: no plot" >&2
elif command -v gnuplot >/dev/null; then
  gnuplot bench/peers/plot.gp && echo "peers.sh: wrote bench/results/peers.png" >&2
else
  echo "peers.sh: no gnuplot: no plot (apt-get install gnuplot-nox)" >&2
fi
cat bench/results/peers.md
