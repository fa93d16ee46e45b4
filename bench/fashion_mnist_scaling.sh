#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Scaling of examples/fashion_mnist: mirror on 1, 2 and 4 replicas against the numpy + OpenBLAS
# baseline (bench/fashion_mnist_numpy.py: same model, optimiser, batch size and epochs), run
# alternately for several rounds so that load from elsewhere hits every configuration alike.
# Prints the runs as they finish (stderr) and then a Markdown table (stdout).
#
#   bench/fashion_mnist_scaling.sh [--build DIR] [--epochs 10] [--rounds 3] [--batch-size 256]
#                                  [--policy default] [--seed 1]
#
# samples/s of a run is the median of its epochs' samples/s; a configuration's figure is the best
# run over the rounds (the table also gives the median run, which shows how noisy the machine is). The test accuracy is the final one of a run (runs are deterministic: the
# same in every round). The numpy baseline runs twice per round: OpenBLAS with its default
# thread count (one per core) and with one thread; "vs numpy" divides by the faster of the two.
# DIR (default: build) is a configured Meson build directory; the trainer is built there first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build epochs=10 rounds=3 batch=256 policy=default seed=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2 ;;
    --epochs) epochs=$2 ;;
    --rounds) rounds=$2 ;;
    --batch-size) batch=$2 ;;
    --policy) policy=$2 ;;
    --seed) seed=$2 ;;
    -h | --help) sed -n '3,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fashion_mnist_scaling.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done

[[ -f $build/build.ninja ]] || meson setup "$build" >&2
ninja -C "$build" examples/fashion_mnist >&2
trainer=$build/examples/fashion_mnist
numpy_script=bench/fashion_mnist_numpy.py

declare -A best acc all
# run NAME COMMAND...: one run; records the median epoch samples/s and the test accuracy.
run() {
  local name=$1; shift
  local out
  out=$("$@") || { echo "fashion_mnist_scaling.sh: '$*' failed" >&2; exit 1; }
  local rate accuracy
  rate=$(awk '/^epoch .*samples\/s/ { print $NF }' <<<"$out" | sort -n |
         awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  accuracy=$(tail -n 1 <<<"$out" | sed -n 's/^test_accuracy=//p')
  [[ -n $accuracy ]] || { echo "fashion_mnist_scaling.sh: no test_accuracy line from '$*'" >&2; exit 1; }
  printf '  %-22s %8.0f samples/s  test_accuracy %s\n' "$name" "$rate" "$accuracy" >&2
  all[$name]+="$rate "
  if [[ -z ${best[$name]:-} ]] || awk -v a="$rate" -v b="${best[$name]}" 'BEGIN { exit !(a > b) }'; then
    best[$name]=$rate
  fi
  acc[$name]=$accuracy
}

common=(--epochs "$epochs" --batch-size "$batch" --seed "$seed")
for ((round = 1; round <= rounds; ++round)); do
  echo "round $round/$rounds" >&2
  for r in 1 2 4; do
    run "mirror-$r" "$trainer" "${common[@]}" --replicas "$r" --policy "$policy"
  done
  run numpy "$numpy_script" "${common[@]}"
  run numpy-1 "$numpy_script" "${common[@]}" --blas-threads 1
done

# median NAME: the median over the rounds of a configuration's samples/s.
median() {
  tr ' ' '\n' <<<"${all[$1]}" | grep . | sort -n |
    awk '{ v[NR] = $1 } END { printf "%.0f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

numpy_best=$(awk -v a="${best[numpy]}" -v b="${best[numpy-1]}" 'BEGIN { print (a > b) ? a : b }')
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo
echo "Fashion-MNIST, MLP 784-256-128-10, global batch $batch, $epochs epochs, seed $seed, policy $policy;"
echo "$(nproc) cores ($cpu); samples/s: best of $rounds rounds (each round: the median epoch);"
echo "vs numpy: divided by the faster numpy row; last column: the median round, for the spread."
echo
echo "| trainer | samples/s | speedup vs 1 replica | vs numpy | test accuracy | median round |"
echo "|---|---:|---:|---:|---:|---:|"
for r in 1 2 4; do
  awk -v name="mirror, $r replica$([[ $r == 1 ]] || echo s)" -v s="${best[mirror-$r]}" -v one="${best[mirror-1]}" \
      -v np="$numpy_best" -v a="${acc[mirror-$r]}" -v m="$(median mirror-$r)" \
      'BEGIN { printf "| %s | %.0f | %.2fx | %.2fx | %s | %s |\n", name, s, s / one, s / np, a, m }'
done
awk -v s="${best[numpy]}" -v np="$numpy_best" -v a="${acc[numpy]}" -v t="$(nproc)" -v m="$(median numpy)" \
    'BEGIN { printf "| numpy + OpenBLAS, default threads (%d) | %.0f | | %.2fx | %s | %s |\n", t, s, s / np, a, m }'
awk -v s="${best[numpy-1]}" -v np="$numpy_best" -v a="${acc[numpy-1]}" -v m="$(median numpy-1)" \
    'BEGIN { printf "| numpy + OpenBLAS, 1 thread | %.0f | | %.2fx | %s | %s |\n", s, s / np, a, m }'
