#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The figures of docs/performance.md#overlap, in one run:
#  1. bench/overlap_bench (ResNet-50's gradients behind a timed backward pass, bucket caps 1-64
#     MiB) on devices::Cluster<Threads> with 2 workers x 1 and 2 workers x 2 replicas, and on
#     devices::Threads with 2 replicas, then on Threads the design mirror did not take (a helper
#     thread reducing each bucket) against its own, with timed-wait and with real compute;
#  2. the Fashion-MNIST trainer with both optimizers, without and with --overlap, on 2 threads
#     and on 2 workers x 1, alternated over ROUNDS rounds (samples/s of the last epoch, test
#     accuracy).
# Writes bench/results/overlap.md and prints it. Needs mpirun, a build with -Dbenchmarks=true and
# the Fashion-MNIST data set (Debian: dataset-fashion-mnist).
#   bench/overlap.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build} rounds=${2:-3}
run_mpi=tests/mpi/run_mpi.sh
out=bench/results/overlap.md
{
  echo "# Overlap: bucketed all-reduce behind the backward pass"
  echo
  echo "$(date -u +%Y-%m-%d), $(git describe --always --dirty), $(nproc) cores; \`bench/overlap.sh $build $rounds\`"
  for cfg in "2 --replicas 1" "2 --replicas 2"; do
    read -r np rest <<<"$cfg"
    bash "$run_mpi" "$np" "$build/bench/overlap_bench" $rest --rounds 5 | sed -n '/^devices::/,$p'
  done
  "$build/bench/overlap_bench" --threads --replicas 2 --rounds 5 | sed -n '/^devices::/,$p'
  echo
  echo "## devices::Threads: a helper thread against reducing in the start call"
  "$build/bench/overlap_bench" --threads --alternatives --replicas 2 --rounds 5 | sed -n '/^devices::/,$p'
  echo
  echo "## The Fashion-MNIST trainer, without and with --overlap 0.25"
  echo
  echo "| device | --optimizer | --overlap | samples/s (last epoch), median [range] | test accuracy |"
  echo "|---|---|---|---:|---:|"
  common=(--epochs 2 --limit 30000)
  variants=()
  for dev in threads cluster; do
    for opt in replicated sharded; do
      variants+=("$dev $opt off" "$dev $opt 0.25")
    done
  done
  declare -A rate acc
  for round in $(seq "$rounds"); do
    for v in "${variants[@]}"; do
      read -r dev opt ov <<<"$v"
      args=("${common[@]}" --optimizer "$opt")
      [[ $ov == off ]] || args+=(--overlap "$ov")
      if [[ $dev == threads ]]; then
        text=$("$build/examples/fashion_mnist" --replicas 2 "${args[@]}")
      else
        text=$(bash "$run_mpi" 2 "$build/examples/fashion_mnist" --device cluster --replicas 1 "${args[@]}")
      fi
      rate[$v]+="$(grep -o 'samples/s [0-9]*' <<<"$text" | tail -1 | cut -d' ' -f2) "
      acc[$v]=$(grep -o 'test_accuracy=[0-9.]*' <<<"$text" | cut -d= -f2)
    done
  done
  for v in "${variants[@]}"; do
    read -r dev opt ov <<<"$v"
    python3 -c 'import statistics,sys; x=sorted(map(float,sys.argv[4].split())); print(f"| {sys.argv[1]} | {sys.argv[2]} | {sys.argv[3]} | {statistics.median(x):.0f} [{x[0]:.0f}-{x[-1]:.0f}] | {sys.argv[5]} |")' \
      "$([[ $dev == threads ]] && echo "Threads, 2 replicas" || echo "Cluster, 2 workers x 1")" "$opt" "$ov" "${rate[$v]}" "${acc[$v]}"
  done
} | tee "$out"
