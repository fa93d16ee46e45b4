#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Scaling of examples/fashion_mnist: mirror on 1, 2 and 4 replicas (the default sharded optimiser;
# 1 and 2 replicas also with --optimizer replicated) against the numpy + OpenBLAS
# baseline (bench/fashion_mnist_numpy.py: same model, optimiser, batch size and epochs), and beside
# them the ceiling of the speedup (bench/fashion_mnist_ceiling.cpp: the model's compute alone on
# 2 threads x 128 rows against 1 x 256, no collective or optimiser), run
# alternately for several rounds so that load from elsewhere hits every configuration alike.
# Prints the runs as they finish (stderr) and then a Markdown table (stdout).
#
#   bench/fashion_mnist_scaling.sh [--build DIR] [--epochs 10] [--rounds 5] [--batch-size 256]
#                                  [--policy default] [--seed 1]
#
# samples/s of a run is the median of its epochs' samples/s. Ratios are taken within a round
# (runs of one round are seconds apart, so they share the machine's state) and the table gives
# the median over the rounds of each figure and ratio, plus the best round. The numpy baseline
# runs twice per round: OpenBLAS with its default thread count (one per core) and with one
# thread; "vs numpy" divides by the faster of the two in the same round. The test accuracy is
# the last run's (a given binary and environment give the same accuracy in every run;
# docs/fashion-mnist.md says what can move it).
# DIR (default: build) is a configured Meson build directory; the trainer is built there first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build epochs=10 rounds=5 batch=256 policy=default seed=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2 ;;
    --epochs) epochs=$2 ;;
    --rounds) rounds=$2 ;;
    --batch-size) batch=$2 ;;
    --policy) policy=$2 ;;
    --seed) seed=$2 ;;
    -h | --help) sed -n '3,/^[^#]/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fashion_mnist_scaling.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done

[[ -f $build/build.ninja ]] || meson setup "$build" >&2
ninja -C "$build" examples/fashion_mnist examples/fashion_mnist_ceiling >&2
trainer=$build/examples/fashion_mnist
numpy_script=bench/fashion_mnist_numpy.py

runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
# run NAME COMMAND...: one run; appends "round name samples/s accuracy" to $runs.
run() {
  local name=$1; shift
  local out
  out=$("$@") || { echo "fashion_mnist_scaling.sh: '$*' failed" >&2; exit 1; }
  local rate accuracy
  rate=$(awk '/^epoch .*samples\/s/ { print $NF }' <<<"$out" | sort -n |
         awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  accuracy=$(tail -n 1 <<<"$out" | sed -n 's/^test_accuracy=//p')
  [[ -n $accuracy ]] || { echo "fashion_mnist_scaling.sh: no test_accuracy line from '$*'" >&2; exit 1; }
  printf '  %-10s %8.0f samples/s  test_accuracy %s\n' "$name" "$rate" "$accuracy" >&2
  echo "$round $name $rate $accuracy" >>"$runs"
}

common=(--epochs "$epochs" --batch-size "$batch" --seed "$seed")
for ((round = 1; round <= rounds; ++round)); do
  echo "round $round/$rounds" >&2
  for r in 1 2 4; do
    run "mirror-$r" "$trainer" "${common[@]}" --replicas "$r" --policy "$policy"
  done
  # The replicated optimiser (every replica steps the whole model) beside the default sharded one.
  for r in 1 2; do
    run "mirror-${r}r" "$trainer" "${common[@]}" --replicas "$r" --policy "$policy" --optimizer replicated
  done
  # The compute alone, 2 threads x 128 rows against 1 x 256: the ceiling of the speedup.
  ceiling=$("$build/examples/fashion_mnist_ceiling" --rounds 1 | sed -n 's/^ceiling //p')
  printf '  %-10s %8s x (forward + backward alone, 2 threads vs 1)\n' ceiling "$ceiling" >&2
  echo "$round ceiling $ceiling -" >>"$runs"
  run numpy "$numpy_script" "${common[@]}"
  run numpy-1 "$numpy_script" "${common[@]}" --blas-threads 1
done

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo
echo "Fashion-MNIST, MLP 784-256-128-10, global batch $batch, $epochs epochs, seed $seed, policy $policy;"
echo "$(nproc) cores ($cpu); $rounds rounds, each running every configuration once, alternately."
echo "samples/s: median epoch of a run; columns: the median over the rounds (ratios taken within"
echo "each round), and the best round. vs numpy: against the faster numpy run of the same round."
echo
python3 - "$runs" "$(nproc)" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
rate, acc = {}, {}
for rnd, name, r, a in rows:
    rate.setdefault(name, {})[rnd] = float(r)
    acc[name] = a
rounds = sorted(rate['mirror-1'], key=int)
numpy_best = {k: max(rate['numpy'][k], rate['numpy-1'][k]) for k in rounds}
med = statistics.median
print('| trainer | samples/s | speedup vs 1 replica | vs numpy | test accuracy | best round: samples/s, speedup |')
print('|---|---:|---:|---:|---:|---:|')
labels = {'mirror-1': 'mirror, 1 replica', 'mirror-2': 'mirror, 2 replicas', 'mirror-4': 'mirror, 4 replicas',
          'mirror-1r': 'mirror, 1 replica, replicated optimiser', 'mirror-2r': 'mirror, 2 replicas, replicated optimiser',
          'numpy': f'numpy + OpenBLAS, default threads ({sys.argv[2]})', 'numpy-1': 'numpy + OpenBLAS, 1 thread'}
for name, label in labels.items():
    v = rate[name]
    vs_np = med(v[k] / numpy_best[k] for k in rounds)
    best = max(rounds, key=lambda k: v[k])
    if name.startswith('mirror'):
        speedup = med(v[k] / rate['mirror-1'][k] for k in rounds)
        print(f'| {label} | {med(v.values()):.0f} | {speedup:.2f}x | {vs_np:.2f}x | {acc[name]} | '
              f'{v[best]:.0f}, {v[best] / rate["mirror-1"][best]:.2f}x |')
    else:
        print(f'| {label} | {med(v.values()):.0f} | | {vs_np:.2f}x | {acc[name]} | {v[best]:.0f} |')
c = rate['ceiling']
best = max(rounds, key=lambda k: rate['mirror-2'][k] / rate['mirror-1'][k])
print(f'| ceiling: the model\'s forward + backward alone, 2 threads x 128 rows vs 1 x 256 '
      f'(bench/fashion_mnist_ceiling.cpp) | | {med(c.values()):.2f}x | | | round of the best 2-replica speedup: {c[best]:.2f}x |')
PY
