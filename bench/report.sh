#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the benchmark suite against its baselines and writes bench/results/: the raw JSON of every
# run, bench/results/report.md (the tables in docs/performance.md) and the PNG plots.
#
#   bench/report.sh [--build DIR] [--rounds 3] [--repetitions 3] [--min-time 0.2] [--quick]
#
# Each round runs every benchmark program once (Google Benchmark repetitions, randomly
# interleaved, so mirror and its in-binary baselines take turns), then the MPI baseline
# (mpirun -np R, the same sizes), then the compile-time comparison; rounds repeat that, so load
# from elsewhere hits every competitor alike. A figure is the median over all its repetitions
# of all rounds; the report also gives the spread. --quick: 1 round, 1 repetition, 0.05 s (a
# check that everything runs, not a measurement).
# Needs (Debian 12): libbenchmark-dev, libopenmpi-dev + openmpi-bin (the MPI baseline; skipped
# with a note when absent), gnuplot-nox (the plots; skipped when absent). ./dev.sh bench
# installs them and runs this script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build-bench rounds=3 reps=3 min_time=0.2
args="$*"
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --repetitions) reps=$2; shift ;;
    --min-time) min_time=$2; shift ;;
    --quick) rounds=1 reps=1 min_time=0.05 ;;
    -h | --help) sed -n '3,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "report.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

out=bench/results
raw=$out/raw
rm -rf "$raw"
mkdir -p "$raw"
log() { printf '==> %s\n' "$*" >&2; }

# The project's default build type (debugoptimized: -O2 -g): the flags users get.
if [[ -f $build/meson-private/coredata.dat ]]; then
  meson setup --reconfigure "$build" -Dbenchmarks=true -Dtests=disabled -Dexamples=false >/dev/null
else
  meson setup "$build" -Dbenchmarks=true -Dtests=disabled -Dexamples=false >/dev/null
fi
targets=(bench/all_reduce_bench bench/reduce_bench bench/broadcast_bench bench/run_bench bench/distribute_dataset_bench
  bench/gather_scatter_bench bench/handoff_bench)
have_mpi=0
if meson introspect --targets "$build" | grep -q '"name": "mpi_all_reduce"' && command -v mpirun >/dev/null; then
  have_mpi=1
  targets+=(bench/mpi_all_reduce)
else
  log "MPI not found (Debian: libopenmpi-dev openmpi-bin): the MPI baseline is left out"
fi
log "building ${targets[*]}"
meson compile -C "$build" -j 2 "${targets[@]}" >/dev/null

mpi_root=()
[[ $(id -u) -eq 0 ]] && mpi_root=(--allow-run-as-root)
run_mpi() {  # R SIZES...
  local r=$1; shift
  timeout -k 10 600 mpirun "${mpi_root[@]}" --oversubscribe --bind-to none -np "$r" \
    "$build/bench/mpi_all_reduce" --repetitions "$reps" --min-time "$min_time" "$@"
}

for ((round = 1; round <= rounds; ++round)); do
  # The host's cross-core latency this round (a VM's vCPUs may sit near or far apart).
  "$build/bench/handoff_bench" --benchmark_filter=spin_two_cores --benchmark_repetitions="$reps" \
    --benchmark_min_time="$min_time" --benchmark_out="$raw/handoff_$round.json" --benchmark_out_format=json >/dev/null
  for verb in all_reduce reduce broadcast run distribute_dataset gather_scatter; do
    log "round $round/$rounds: $verb"
    "$build/bench/${verb}_bench" --benchmark_repetitions="$reps" --benchmark_enable_random_interleaving=true \
      --benchmark_min_time="$min_time" --benchmark_out="$raw/${verb}_$round.json" --benchmark_out_format=json \
      --benchmark_context=round="$round" >/dev/null
  done
  if [[ $have_mpi == 1 ]]; then
    log "round $round/$rounds: MPI_Allreduce"
    run_mpi 2 4 64 4096 65536 1048576 16777216 67108864 >"$raw/mpi_2_$round.json"
    run_mpi 8 4 65536 1048576 16777216 >"$raw/mpi_8_$round.json"
    run_mpi 16 4 65536 1048576 16777216 >"$raw/mpi_16_$round.json"
  fi
  log "round $round/$rounds: compile time"
  bench/compile_time.sh --build "$build" --runs 1 >"$raw/compile_time_$round.json"
done

log "writing $out/report.md and plots"
python3 bench/report.py "$raw" "$out" --command "bench/report.sh${args:+ $args}" --rounds "$rounds" --repetitions "$reps"
cat "$out/report.md"
