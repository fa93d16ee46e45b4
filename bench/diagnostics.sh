#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# What call sites, the flight recorder and the timeline cost (docs/performance.md#diagnostics):
# run + a 1-float all-reduce and a 64 MiB all-reduce on 2 and 4 replicas, alternated over ROUNDS
# rounds between a build without the diagnostics (BASE, e.g. the commit before them, configured
# with -Dbenchmarks=true) and this one with the recorder off, on, and the timeline on. Prints
# medians, ranges and ratios to BASE.
# Usage: bench/diagnostics.sh BASE_BUILD_DIR NEW_BUILD_DIR [ROUNDS]
set -euo pipefail
base=$1 new=$2 rounds=${3:-7}
out=$(mktemp -d)
trace=$out/trace.json
F1='run/impl:run_all_reduce/type:float/replicas:(2|4)/bytes:4/'
F2='all_reduce/impl:default/type:float/replicas:(2|4)/bytes:67108864/'
for round in $(seq "$rounds"); do
  for v in base off on timeline; do
    case $v in
      base) bin=$base/bench; env=();;
      off) bin=$new/bench; env=(MIRROR_FLIGHT_RECORDER=0);;
      on) bin=$new/bench; env=();;
      timeline) bin=$new/bench; env=(MIRROR_FLIGHT_RECORDER=0 MIRROR_TIMELINE=$trace);;
    esac
    env "${env[@]}" "$bin/run_bench" --benchmark_filter="$F1" --benchmark_min_time=0.5 \
      --benchmark_format=json > "$out/run_${v}_$round.json" 2>/dev/null
    env "${env[@]}" "$bin/all_reduce_bench" --benchmark_filter="$F2" --benchmark_min_time=0.5 \
      --benchmark_format=json > "$out/ar_${v}_$round.json" 2>/dev/null
    rm -f "$trace"
  done
done
python3 - "$out" <<'PY'
import collections, glob, json, re, statistics, sys
res = collections.defaultdict(lambda: collections.defaultdict(list))
unit = {'ns': 1, 'us': 1e3, 'ms': 1e6, 's': 1e9}
for f in glob.glob(sys.argv[1] + '/*.json'):
    v = re.search(r'_(base|off|on|timeline)_\d+\.json$', f).group(1)
    for b in json.load(open(f))['benchmarks']:
        res[b['name']][v].append(b['real_time'] * unit[b['time_unit']])
for name, vs in sorted(res.items()):
    base = statistics.median(vs['base'])
    print(name)
    for v in ('base', 'off', 'on', 'timeline'):
        x = vs[v]
        m = statistics.median(x)
        print(f'  {v:9s} median {m / 1e3:11.3f} us  range {min(x) / 1e3:.3f}-{max(x) / 1e3:.3f}  x{m / base:.2f}')
PY
rm -rf "$out"
