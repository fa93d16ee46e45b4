#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The multi-worker bench tables of docs/multi-worker.md ("What it costs"), from
# bench/mpi_cluster_bench:
#  1. mirror's cross-worker all-reduce (devices::Cluster<Threads>, 2 workers x 1 replica) against
#     raw MPI_Allreduce(MPI_IN_PLACE) of the same bytes on the same processes, alternated, over
#     shared memory and over TCP only (--mca btl self,tcp: two hosts' transport on one machine);
#  2. W workers x R replicas against 1 process x (W*R) replicas, the same bytes per replica.
#
#   bench/mpi_cluster_table.sh [--build DIR] [--rounds 2] [--repetitions 5] [--min-time 0.1]
#                              [--quick] [BYTES...]
#
# Each round runs every configuration once; a figure is the median over all repetitions of all
# rounds, a ratio the median of the per-repetition ratios (mirror and raw MPI run back to back
# in one process, so load from elsewhere hits both alike). Writes bench/results/mpi_cluster.md
# (and the raw JSON under bench/results/mpi_cluster/) and prints the tables. Needs libopenmpi-dev and
# openmpi-bin (Debian); --build DIR must be configured with -Dbenchmarks=true.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build rounds=2 reps=5 min_time=0.1
sizes=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --repetitions) reps=$2; shift ;;
    --min-time) min_time=$2; shift ;;
    --quick) rounds=1 reps=1 min_time=0.02 ;;
    -h | --help) sed -n '3,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "mpi_cluster_table.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    *) sizes+=("$1") ;;
  esac
  shift
done
[[ ${#sizes[@]} -gt 0 ]] || sizes=(4 65536 1048576 16777216)

if ! command -v mpirun >/dev/null; then
  echo "mpi_cluster_table.sh: mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2
  exit 1
fi
if ! meson introspect --targets "$build" 2>/dev/null | grep -q '"name": "mpi_cluster_bench"'; then
  echo "mpi_cluster_table.sh: $build has no mpi_cluster_bench; configure it with -Dbenchmarks=true" \
    "(meson setup $build -Dbenchmarks=true) on a machine with libopenmpi-dev" >&2
  exit 1
fi
meson compile -C "$build" bench/mpi_cluster_bench >/dev/null

source tests/mpi/mpi_env.sh  # root, the containers' CMA copy: the same launches as the tests
mpi_root=()
[[ $(id -u) -eq 0 ]] && mpi_root=(--allow-run-as-root)

# The tree measured, before this script writes its results into it (the binary's own git
# describe is from configure time).
describe=$(git describe --always --dirty 2>/dev/null || echo unknown)
out=bench/results
raw=$out/mpi_cluster  # not raw/: bench/report.sh empties that
mkdir -p "$raw"
rm -f "$raw"/mpi_cluster_*.json
# transport W R shape-check extra-mpirun-args
configs=(
  "shm 2 1 on"
  "shm 2 1 off"
  "tcp 2 1 on --mca btl self,tcp"
  "tcp 2 1 off --mca btl self,tcp"
  "shm 1 2 on"
  "shm 1 4 on"
  "shm 2 2 on"
  "shm 4 1 on"
)
for ((round = 0; round < rounds; ++round)); do
  for c in "${configs[@]}"; do
    read -r transport W R check extra <<<"$c"
    printf '==> round %d: %s, %d workers x %d replicas, shape check %s\n' "$((round + 1))" "$transport" "$W" "$R" \
      "$check" >&2
    flags=()
    [[ $check == on ]] || flags=(--no-validate)
    # shellcheck disable=SC2086 # $extra is a list of mpirun arguments
    timeout -k 10 600 mpirun "${mpi_root[@]}" --oversubscribe --bind-to none -np "$W" $extra \
      "$build/bench/mpi_cluster_bench" --replicas "$R" --repetitions "$reps" --min-time "$min_time" \
      "${flags[@]}" "${sizes[@]}" >"$raw/mpi_cluster_${transport}_${W}x${R}_${check}_round${round}.json"
  done
done

python3 - "$raw" "$out/mpi_cluster.md" "$describe" <<'EOF'
import glob, json, os, re, statistics as st, sys
raw, md, git = sys.argv[1], sys.argv[2], sys.argv[3]
times = {}   # (transport, W, R, check, impl, bytes) -> [ns]
ratios = {}  # (transport, W, R, check, bytes) -> [cluster / mpi]
for path in sorted(glob.glob(os.path.join(raw, "mpi_cluster_*.json"))):
    transport, W, R, check = re.match(r".*mpi_cluster_(\w+?)_(\d+)x(\d+)_(on|off)_round", path).groups()
    W, R = int(W), int(R)
    doc = json.load(open(path))
    pairs = {}
    for b in doc["benchmarks"]:
        impl = b["name"].split("/")[1].split(":")[1]
        times.setdefault((transport, W, R, check, impl, b["bytes"]), []).append(b["real_time"])
        pairs.setdefault((b["bytes"], b["repetition_index"]), {})[impl] = b["real_time"]
    for (nbytes, _), p in pairs.items():
        if "cluster" in p and "mpi" in p:
            ratios.setdefault((transport, W, R, check, nbytes), []).append(p["cluster"] / p["mpi"])

def fmt_time(ns):
    return f"{ns / 1e3:.1f} us" if ns < 1e6 else f"{ns / 1e6:.2f} ms"

def fmt_bytes(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"

def med(key):
    v = times.get(key)
    return st.median(v) if v else None

sizes = sorted({k[5] for k in times})
lines = [f"mirror {git}, bench/mpi_cluster_table.sh; medians over all repetitions of all rounds.", ""]
lines += ["**Cross-worker all-reduce vs raw `MPI_Allreduce`** (2 workers x 1 replica, the same "
          "bytes on the same processes, alternated; ratio = median of per-repetition ratios, "
          "range in brackets; \"no check\": `Cluster{.validate_shapes = false}`, which skips the "
          "cross-worker shape check)", "",
          "| bytes | transport | mirror | raw MPI | mirror / MPI | mirror, no check | no check / MPI |",
          "|---:|:--|---:|---:|---:|---:|---:|"]
def cell(transport, check, n):
    c, r = med((transport, 2, 1, check, "cluster", n)), ratios.get((transport, 2, 1, check, n))
    if c is None or not r:
        return "-", "-"
    return fmt_time(c), f"{st.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]"
for transport in ("shm", "tcp"):
    for n in sizes:
        m = med((transport, 2, 1, "on", "mpi", n))
        if m is None:
            continue
        name = "shared memory" if transport == "shm" else "TCP (`--mca btl self,tcp`)"
        on, off = cell(transport, "on", n), cell(transport, "off", n)
        lines.append(f"| {fmt_bytes(n)} | {name} | {on[0]} | {fmt_time(m)} | {on[1]} | {off[0]} | {off[1]} |")
lines += ["", "**W workers x R replicas vs one process with W*R replicas** (all-reduce of the "
          "bytes per replica, shared memory; in brackets: time / the one-process time)", "",
          "| bytes | 1 x 2 | 2 x 1 | 1 x 4 | 2 x 2 | 4 x 1 |", "|---:|---:|---:|---:|---:|---:|"]
for n in sizes:
    row = [fmt_bytes(n)]
    for W, R in ((1, 2), (2, 1), (1, 4), (2, 2), (4, 1)):
        t = med(("shm", W, R, "on", "cluster", n))
        base = med(("shm", 1, W * R, "on", "cluster", n))
        if t is None:
            row.append("-")
        elif W == 1 or base is None:
            row.append(fmt_time(t))
        else:
            row.append(f"{fmt_time(t)} ({t / base:.1f}x)")
    lines.append("| " + " | ".join(row) + " |")
text = "\n".join(lines) + "\n"
open(md, "w").write(text)
print(text, end="")
EOF
