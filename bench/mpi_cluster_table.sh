#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The multi-worker bench tables of docs/multi-worker.md ("What it costs"), from
# bench/mpi_cluster_bench:
#  1. mirror's cross-worker all-reduce (devices::Cluster<Threads>, 2 workers x 1 replica) against
#     raw MPI_Allreduce(MPI_IN_PLACE) of the same bytes on the same processes, alternated, over
#     shared memory and over TCP only (--mca btl self,tcp: two hosts' transport on one machine);
#  2. the same at 3 workers, and reduce_scatter / all_gather at 2 and 3 workers against
#     MPI_Reduce_scatter_block / MPI_Allgather (shared memory);
#  3. W workers x R replicas against 1 process x (W*R) replicas, the same bytes per replica.
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
[[ ${#sizes[@]} -gt 0 ]] || sizes=(4 4096 65536 1048576 16777216)

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
# transport W R shape-check verb extra-mpirun-args
configs=(
  "shm 2 1 on all_reduce"
  "shm 2 1 off all_reduce"
  "tcp 2 1 on all_reduce --mca btl self,tcp"
  "tcp 2 1 off all_reduce --mca btl self,tcp"
  "shm 3 1 on all_reduce"
  "shm 2 1 on reduce_scatter"
  "shm 3 1 on reduce_scatter"
  "shm 2 1 on all_gather"
  "shm 3 1 on all_gather"
  "shm 1 2 on all_reduce"
  "shm 1 4 on all_reduce"
  "shm 2 2 on all_reduce"
  "shm 4 1 on all_reduce"
)
for ((round = 0; round < rounds; ++round)); do
  for c in "${configs[@]}"; do
    read -r transport W R check verb extra <<<"$c"
    printf '==> round %d: %s, %s, %d workers x %d replicas, shape check %s\n' "$((round + 1))" "$verb" "$transport" \
      "$W" "$R" "$check" >&2
    flags=()
    [[ $check == on ]] || flags=(--no-validate)
    # shellcheck disable=SC2086 # $extra is a list of mpirun arguments
    timeout -k 10 600 mpirun "${mpi_root[@]}" --oversubscribe --bind-to none -np "$W" $extra \
      "$build/bench/mpi_cluster_bench" --verb "$verb" --replicas "$R" --repetitions "$reps" --min-time "$min_time" \
      "${flags[@]}" "${sizes[@]}" >"$raw/mpi_cluster_${verb}_${transport}_${W}x${R}_${check}_round${round}.json"
  done
done

python3 - "$raw" "$out/mpi_cluster.md" "$describe" <<'EOF'
import glob, json, os, re, statistics as st, sys
raw, md, git = sys.argv[1], sys.argv[2], sys.argv[3]
times = {}   # (verb, transport, W, R, check, impl, bytes) -> [ns]
ratios = {}  # (verb, transport, W, R, check, bytes) -> [cluster / mpi]
for path in sorted(glob.glob(os.path.join(raw, "mpi_cluster_*.json"))):
    verb, transport, W, R, check = re.match(
        r".*mpi_cluster_(all_reduce|reduce_scatter|all_gather)_(\w+?)_(\d+)x(\d+)_(on|off)_round", path).groups()
    W, R = int(W), int(R)
    doc = json.load(open(path))
    pairs = {}
    for b in doc["benchmarks"]:
        impl = b["name"].split("/")[1].split(":")[1]
        times.setdefault((verb, transport, W, R, check, impl, b["bytes"]), []).append(b["real_time"])
        pairs.setdefault((b["bytes"], b["repetition_index"]), {})[impl] = b["real_time"]
    for (nbytes, _), p in pairs.items():
        if "cluster" in p and "mpi" in p:
            ratios.setdefault((verb, transport, W, R, check, nbytes), []).append(p["cluster"] / p["mpi"])

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

def ratio(key):
    r = ratios.get(key)
    return f"{st.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]" if r else "-"

# reduce_scatter and all_gather round sizes to a multiple of 4 W R bytes (all_reduce keeps them):
# each table lists the sizes its configurations ran.
def sizes_of(W, verb):
    return sorted({k[6] for k in times if k[2] == W and k[0] == verb})
sizes = sorted(set(sizes_of(1, "all_reduce")) | set(sizes_of(2, "all_reduce")) | set(sizes_of(4, "all_reduce")))
lines = [f"mirror {git}, bench/mpi_cluster_table.sh; medians over all repetitions of all rounds.", ""]
lines += ["**Cross-worker all-reduce vs raw `MPI_Allreduce`** (2 workers x 1 replica, the same "
          "bytes on the same processes, alternated; ratio = median of per-repetition ratios, "
          "range in brackets; \"no check\": `Cluster{.validate_shapes = false}`, which skips the "
          "cross-worker shape check)", "",
          "| bytes | transport | mirror | raw MPI | mirror / MPI | mirror, no check | no check / MPI |",
          "|---:|:--|---:|---:|---:|---:|---:|"]
def cell(transport, check, n):
    c = med(("all_reduce", transport, 2, 1, check, "cluster", n))
    if c is None:
        return "-", "-"
    return fmt_time(c), ratio(("all_reduce", transport, 2, 1, check, n))
for transport in ("shm", "tcp"):
    for n in sizes:
        m = med(("all_reduce", transport, 2, 1, "on", "mpi", n))
        if m is None:
            continue
        name = "shared memory" if transport == "shm" else "TCP (`--mca btl self,tcp`)"
        on, off = cell(transport, "on", n), cell(transport, "off", n)
        lines.append(f"| {fmt_bytes(n)} | {name} | {on[0]} | {fmt_time(m)} | {on[1]} | {off[0]} | {off[1]} |")
baseline = {"all_reduce": "`MPI_Allreduce`", "reduce_scatter": "`MPI_Reduce_scatter_block`",
            "all_gather": "`MPI_Allgather`"}
lines += ["", "**3 workers, and reduce-scatter and all-gather** (W workers x 1 replica, shared memory, "
          "against the raw MPI call of the same bytes on the same processes, alternated; bytes: each "
          "replica's buffer, of which a reduce-scatter keeps 1/W and to which an all-gather gathers)", "",
          "| collective | workers | bytes | mirror | raw MPI | baseline | mirror / MPI |",
          "|:--|---:|---:|---:|---:|:--|---:|"]
for verb in ("all_reduce", "reduce_scatter", "all_gather"):
    for W in (2, 3):
        if verb == "all_reduce" and W == 2:
            continue  # the first table
        for n in sizes_of(W, verb):
            c, m = med((verb, "shm", W, 1, "on", "cluster", n)), med((verb, "shm", W, 1, "on", "mpi", n))
            if c is None or m is None:
                continue
            lines.append(f"| {verb} | {W} | {fmt_bytes(n)} | {fmt_time(c)} | {fmt_time(m)} | {baseline[verb]} | "
                         f"{ratio((verb, 'shm', W, 1, 'on', n))} |")
lines += ["", "**W workers x R replicas vs one process with W*R replicas** (all-reduce of the "
          "bytes per replica, shared memory; in brackets: time / the one-process time)", "",
          "| bytes | 1 x 2 | 2 x 1 | 1 x 4 | 2 x 2 | 4 x 1 |", "|---:|---:|---:|---:|---:|---:|"]
for n in sizes:
    row = [fmt_bytes(n)]
    for W, R in ((1, 2), (2, 1), (1, 4), (2, 2), (4, 1)):
        t = med(("all_reduce", "shm", W, R, "on", "cluster", n))
        base = med(("all_reduce", "shm", 1, W * R, "on", "cluster", n))
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
