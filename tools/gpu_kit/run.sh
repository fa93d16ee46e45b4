#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU kit's runner: everything mirror has for a GPU, run on one machine in a few minutes.
#
#   run.sh OUTDIR [--data DIR]
#
# Prints nvidia-smi and the versions found, then runs, each under its own time limit: every GPU
# test (Catch2; one line per test case with its result), the multi-rank step (Cluster<Cuda> on 2
# and 3 MPI processes of GPU 0 under the Open MPI the kit carries, a dead worker, memcheck inside
# mpirun, mirror against raw NCCL), the trainer (examples/fashion_mnist
# --device cuda: test_accuracy must reach 0.88), the all-reduce benchmark (a fixed time budget)
# the same MLP in PyTorch when python3 has torch (bench/fashion_mnist_torch.py), and
# compute-sanitizer: memcheck over every test program, racecheck and synccheck over part of one. OUTDIR receives few files
# (a device check returns at most 8): summary.txt, versions.txt, tests.log, trainer.log,
# bench.txt, sanitizer.log. Exit status 0 when nothing failed (skips included), 1 otherwise.
#
# Libraries: the programs link the CUDA runtime, libstdc++ and zlib statically; libnccl.so.2 and
# libcublas.so.13 come from this machine: $MIRROR_KIT_LIB_DIRS (colon-separated) first, then the
# CUDA toolkit's folders, then the Python packages nvidia-nccl-cu13 / nvidia-cublas (nvidia/*/lib
# under the site-packages of python3 on PATH). The data set: --data, $FASHION_MNIST_DATA,
# KIT/../fashion-mnist, KIT/data, /usr/share/datasets/fashion-mnist.
# Time limits: $MIRROR_KIT_BUDGET seconds in all (default 330), shared out as the steps go: each
# step keeps back time for the ones after it, and one that would get under 15 s is skipped.
set -uo pipefail

KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $# -ge 1 ]] || { echo "usage: $0 OUTDIR [--data DIR]" >&2; exit 2; }
OUTDIR=$1
shift
DATA=${FASHION_MNIST_DATA:-}
if [[ ${1:-} == --data && -n ${2:-} ]]; then DATA=$2; fi
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
SUMMARY=$OUTDIR/summary.txt
: >"$SUMMARY"
for f in versions.txt tests.log trainer.log bench.txt sanitizer.log; do : >"$OUTDIR/$f"; done

DEADLINE=$((SECONDS + ${MIRROR_KIT_BUDGET:-330}))
PASSED=0 FAILED=0 SKIPPED=0

say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
# limit MAX RESERVE: seconds for the next step, keeping RESERVE for the steps after it; 0 when
# that leaves under 15 (the step is then skipped).
limit() {
  local left=$((DEADLINE - SECONDS - $2))
  if ((left < 15)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}
no_time() {
  say "  SKIP $1: no time left in the ${MIRROR_KIT_BUDGET:-330} s budget"
  SKIPPED=$((SKIPPED + 1))
}
PY=$(command -v python3 || true)

# ---- libraries ----
lib_dirs() {
  local IFS=:
  for d in ${MIRROR_KIT_LIB_DIRS:-}; do echo "$d"; done
  echo /usr/local/cuda/lib64
  echo /usr/local/cuda/lib
  echo /usr/local/cuda/targets/x86_64-linux/lib
  if [[ -n $PY ]]; then
    "$PY" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + [p for p in sys.path if p.endswith('-packages')]
seen = set()
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, 'nvidia', '*', 'lib'))):
        if d not in seen:
            seen.add(d)
            print(d)
EOF
  fi
  ls -d /usr/lib/python3*/*-packages/nvidia/*/lib /usr/local/lib/python3*/*-packages/nvidia/*/lib \
    /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null
  echo /usr/lib/x86_64-linux-gnu
  echo /usr/lib64
}
find_lib() {
  local d
  while read -r d; do
    [[ -n $d && -e $d/$1 ]] && { echo "$d"; return 0; }
  done < <(lib_dirs)
  return 1
}
LIBPATH=
for lib in libnccl.so.2 libcublas.so.13; do
  if dir=$(find_lib "$lib"); then
    case ":$LIBPATH:" in *":$dir:"*) ;; *) LIBPATH=${LIBPATH:+$LIBPATH:}$dir ;; esac
    echo "$lib: found in $dir" >>"$OUTDIR/versions.txt"
  else
    echo "$lib: NOT FOUND (searched: $(lib_dirs | tr '\n' ' ')); set MIRROR_KIT_LIB_DIRS" \
      | tee -a "$OUTDIR/versions.txt"
  fi
done
export LD_LIBRARY_PATH=${LIBPATH}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

say "mirror GPU kit: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n) ($(uname -m)), kit $KIT"
{
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null 2>&1; then timeout 20 nvidia-smi 2>&1; else echo "nvidia-smi: not found"; fi
  echo "== gpu_info"
} >>"$OUTDIR/versions.txt"
timeout 30 "$KIT/gpu_info" >"$OUTDIR/gpu_info.tmp" 2>&1
GPU_STATUS=$?
cat "$OUTDIR/gpu_info.tmp" >>"$OUTDIR/versions.txt"
sed 's/^/  /' "$OUTDIR/gpu_info.tmp" | tee -a "$SUMMARY"
rm -f "$OUTDIR/gpu_info.tmp"
case $GPU_STATUS in
  0) HAVE_GPU=1 ;;
  77) HAVE_GPU=0 ;;
  *) HAVE_GPU=0
     say "FAIL gpu_info: exit $GPU_STATUS (a library missing? see versions.txt)"
     FAILED=$((FAILED + 1)) ;;
esac
if command -v nvidia-smi >/dev/null 2>&1; then
  say "  nvidia-smi: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4 | paste -sd ';')"
fi

# ---- tests: one line per Catch2 test case ----
# cases XML EXE: "PASS|FAIL <exe>: <case> (<s> s)" per case, and the failed assertions.
cases() {
  if [[ -n $PY ]]; then
    "$PY" - "$1" "$2" <<'EOF'
import html, re, sys
text = open(sys.argv[1], encoding='utf-8', errors='replace').read()
exe = sys.argv[2]
for m in re.finditer(r'<TestCase name="([^"]*)"(.*?)(?:<OverallResult success="(true|false)"(?: durationInSeconds="([^"]*)")?|$)', text, re.S):
    name, body, ok, secs = html.unescape(m.group(1)), m.group(2), m.group(3), m.group(4)
    verdict = {'true': 'PASS', 'false': 'FAIL'}.get(ok, 'FAIL (did not finish)')
    print(f'  {verdict} {exe}: {name}' + (f' ({float(secs):.2f} s)' if secs else ''))
    if ok != 'true':
        for e in re.finditer(r'<Expression success="false"[^>]*filename="([^"]*)" line="(\d+)">.*?<Expanded>\s*(.*?)\s*</Expanded>', body, re.S):
            print(f'      {e.group(1).split("/")[-1]}:{e.group(2)}: {html.unescape(e.group(3)).strip()[:300]}')
        for e in re.finditer(r'<(?:Exception|FatalErrorCondition)[^>]*>\s*(.*?)\s*</(?:Exception|FatalErrorCondition)>', body, re.S):
            print(f'      {html.unescape(e.group(1)).strip()[:300]}')
EOF
  else
    grep -o '<TestCase name="[^"]*"\|<OverallResult success="[a-z]*"' "$1" | paste - - \
      | sed -e 's/<TestCase name="\([^"]*\)".*success="true"/  PASS '"$2"': \1/' \
            -e 's/<TestCase name="\([^"]*\)".*success="false"/  FAIL '"$2"': \1/'
  fi
}

# report_cases LABEL XML STATUS SECS: one program's cases into tests.log and the summary, and the
# counts; a non-zero exit with no failed case (a crash, the time limit) counts as one failure.
report_cases() {
  local label=$1 xml=$2 status=$3 secs=$4 lines ok bad note=
  lines=$([[ -s $xml ]] && cases "$xml" "$label")
  printf '%s\n' "$lines" >>"$OUTDIR/tests.log"
  ok=$(grep -c '^  PASS' <<<"$lines")
  bad=$(grep -c '^  FAIL' <<<"$lines")
  if [[ $status -ne 0 && $bad -eq 0 ]]; then
    bad=1
    note=" (exit $status$([[ $status -eq 124 ]] && echo ": timed out after $secs s"))"
  fi
  say "  $label: $ok passed, $bad failed$note"
  [[ -z $lines ]] || printf '%s\n' "$lines" | sed 's/^/  /' | tee -a "$SUMMARY"
  PASSED=$((PASSED + ok))
  FAILED=$((FAILED + bad))
}

TESTS=(cuda_device cuda_reduction_to_one_device cuda_hierarchical_copy cuda_nccl_all_reduce cuda_gather_scatter)
say "tests:"
for t in "${TESTS[@]}"; do
  exe=$KIT/${t}_test
  [[ -x $exe ]] || { say "  SKIP $t: not in this kit (built without NCCL?)"; SKIPPED=$((SKIPPED + 1)); continue; }
  xml=$OUTDIR/$t.xml.tmp
  secs=$(limit 90 220)  # kept back: the multi-rank step, a trainer run, the benchmark, the sanitizer
  ((secs > 0)) || { no_time "$t"; continue; }
  start=$SECONDS
  timeout --kill-after=10 "$secs" "$exe" -r xml -d yes >"$xml" 2>"$OUTDIR/$t.err.tmp"
  status=$?
  {
    echo "== $t (exit $status, $((SECONDS - start)) s, limit $secs s)"
    cat "$OUTDIR/$t.err.tmp"
  } >>"$OUTDIR/tests.log"
  if [[ $status -eq 77 ]]; then
    say "  SKIP $t: $(grep -m1 '^SKIP' "$xml" | sed 's/^SKIP: //')"
    SKIPPED=$((SKIPPED + 1))
  else
    report_cases "$t" "$xml" "$status" "$secs"
  fi
  rm -f "$xml" "$OUTDIR/$t.err.tmp"
done

# ---- multi-rank: Cluster<Cuda> across 2 and 3 processes on GPU 0 ----
# The kit carries Open MPI (KIT/mpi, its env.sh). NCCL 2.28 refuses two ranks of one host on one
# GPU, but takes its host identity from NCCL_HOSTID: each rank gets its own, so NCCL sees N hosts
# and connects them with its socket transport over loopback (NCCL_NET=Socket,
# NCCL_SOCKET_IFNAME=lo; no InfiniBand probing). P2P and shared memory need one host hash, so
# they are ruled out by the distinct ids already and stay enabled; NVLink SHARP and multi-node
# NVLink would look for a fabric between the "hosts", so they are off.
mpi_launch() {  # mpi_launch SECS NP [MPIRUN OPTIONS --] PROGRAM ARGS...: stdout and stderr as mpirun's
  local secs=$1 np=$2 opts=()
  shift 2
  if [[ " $* " == *" -- "* ]]; then while [[ $1 != -- ]]; do opts+=("$1"); shift; done; shift; fi
  (
    . "$MPIKIT/env.sh"
    export NCCL_SOCKET_IFNAME=lo NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
    exec timeout --kill-after=10 "$secs" mpirun --oversubscribe --bind-to none "${opts[@]}" -np "$np" \
      bash -c 'export NCCL_HOSTID=mirror-kit-$OMPI_COMM_WORLD_RANK; exec "$@"' mirror-kit-rank "$@"
  )
}
MR=mpi_cluster_cuda
say "multi-rank (Cluster<Cuda> over MPI: 2 and 3 processes on GPU 0, each its own NCCL host):"
# KIT/mpi.tar.gz: Open MPI, its env.sh and the two MPI programs, packed to fit (assemble.py).
MPIKIT=
if [[ -f $KIT/mpi.tar.gz ]]; then
  MPITMP=$(mktemp -d "${TMPDIR:-/tmp}/mirror-kit-mpi.XXXXXX") && trap 'rm -rf "$MPITMP"' EXIT \
    && tar xzf "$KIT/mpi.tar.gz" -C "$MPITMP" && MPIKIT=$MPITMP/mpi
fi
if [[ -z $MPIKIT || ! -f $MPIKIT/env.sh || ! -x $MPIKIT/${MR}_test ]]; then
  say "  SKIP $MR: not in this kit (built without MPI) or mpi.tar.gz does not unpack"
  say "  SKIP cluster_all_reduce_gpu_bench: not in this kit (built without MPI) or mpi.tar.gz does not unpack"
  SKIPPED=$((SKIPPED + 2))
else
  # Any machine: the kit's mpirun starts 2 processes of the test program, whose listing needs no
  # GPU but runs MPI_Init and MPI_Allreduce (tests/mpi/mpi_main.cpp), with distinct NCCL_HOSTIDs.
  # (An empty listing: Catch2's exit status is the number of tests listed.)
  mpi_launch 40 2 bash -c '"$0" --list-test-names-only "[no such tag]" && echo "rank $OMPI_COMM_WORLD_RANK: MPI ok"' \
    "$MPIKIT/${MR}_test" >"$OUTDIR/mr.tmp" 2>&1
  status=$?
  { echo "== kit mpirun -np 2 ${MR}_test --list-test-names-only (exit $status)"; cat "$OUTDIR/mr.tmp"; } >>"$OUTDIR/tests.log"
  MPI_STARTS=0
  if [[ $status -eq 0 && $(grep -c '^rank [01]: MPI ok' "$OUTDIR/mr.tmp") -eq 2 ]]; then
    say "  PASS kit mpirun: 2 processes started (MPI_Init, MPI_Allreduce; Open MPI from the kit's mpi.tar.gz, $(du -sm "$MPIKIT" | cut -f1) MB unpacked)"
    PASSED=$((PASSED + 1))
    MPI_STARTS=1
  else
    say "  FAIL kit mpirun: exit $status; 2 processes did not both start and list the tests (see tests.log)"
    tail -5 "$OUTDIR/mr.tmp" | sed 's/^/      /' | tee -a "$SUMMARY"
    FAILED=$((FAILED + 1))
  fi
  why=
  [[ $HAVE_GPU -eq 0 ]] && why="no CUDA device"
  [[ -z $why && $MPI_STARTS -eq 0 ]] && why="the kit's mpirun does not start (above)"
  if [[ -n $why ]]; then
    say "  SKIP $MR (2 and 3 ranks, the dead worker, compute-sanitizer): $why"
    say "  SKIP cluster_all_reduce_gpu_bench (2 ranks): $why"
    SKIPPED=$((SKIPPED + 2))
  else
    # Every case on 2 then 3 ranks; rank 0 writes the XML, the others theirs to stderr (the log).
    xml=$OUTDIR/mr.xml.tmp
    for np in 2 3; do
      label="$MR ($np ranks)"
      secs=$(limit 60 $((np == 2 ? 180 : 160)))  # kept back: the rest of this step, the trainer, bench, sanitizer
      ((secs > 0)) || { no_time "$label"; continue; }
      rm -f "$xml"
      start=$SECONDS
      mpi_launch "$secs" "$np" "$MPIKIT/${MR}_test" -r xml -d yes -o "$xml" >"$OUTDIR/mr.tmp" 2>&1
      status=$?
      { echo "== $label (exit $status, $((SECONDS - start)) s, limit $secs s)"; cat "$OUTDIR/mr.tmp"; } >>"$OUTDIR/tests.log"
      report_cases "$label" "$xml" "$status" "$secs"
      [[ $status -eq 0 ]] || grep -m3 'NCCL WARN\|error\|Error' "$OUTDIR/mr.tmp" | sed 's/^/      /' | tee -a "$SUMMARY"
    done

    # A worker that dies: rank 1 of 2 calls std::_Exit in fn; rank 0 must name it within the
    # Cluster timeout (5 s). --enable-recovery keeps mpirun from ending the job at the death.
    label="$MR (2 ranks): a dead worker is named"
    secs=$(limit 40 140)
    if ((secs == 0)); then
      no_time "$label"
    else
      rm -f "$xml"
      mpi_launch "$secs" 2 --enable-recovery -- "$MPIKIT/${MR}_test" '[.kill]' -r xml -d yes -o "$xml" >"$OUTDIR/mr.tmp" 2>&1
      status=$?
      { echo "== $label (exit $status)"; cat "$OUTDIR/mr.tmp"; } >>"$OUTDIR/tests.log"
      lines=$([[ -s $xml ]] && cases "$xml" "$MR (2 ranks)")
      if grep -q '^  PASS' <<<"$lines"; then
        say "  PASS $label (rank 0's error within the timeout; exit $status: the job cannot finalize without rank 1)"
        PASSED=$((PASSED + 1))
      elif [[ -z $lines ]] || grep -q '^  FAIL .*(did not finish)' <<<"$lines"; then
        # No verdict from rank 0: Open MPI ended the job when rank 1 died, before the timeout.
        say "  SKIP $label: no result from rank 0 (exit $status): Open MPI ended the job when rank 1 died; mpirun said: $(grep -m1 -i 'exited\|abort\|terminat' "$OUTDIR/mr.tmp" | cut -c1-160)"
        SKIPPED=$((SKIPPED + 1))
      else
        say "  FAIL $label (exit $status):"
        printf '%s\n' "$lines" | sed 's/^/  /' | tee -a "$SUMMARY"
        FAILED=$((FAILED + 1))
      fi
    fi

    # compute-sanitizer inside mpirun: memcheck on both ranks of one small NCCL case.
    SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
    label="compute-sanitizer --tool memcheck $MR (2 ranks, one case)"
    secs=$(limit 70 120)
    if [[ -z $SANITIZER ]]; then
      say "  SKIP $label: compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
      SKIPPED=$((SKIPPED + 1))
    elif ((secs == 0)); then
      no_time "$label"
    else
      mpi_launch "$secs" 2 "$SANITIZER" --tool memcheck --report-api-errors no --error-exitcode 99 \
        "$MPIKIT/${MR}_test" 'cluster<cuda>: one NCCL communicator*' --warn NoTests -r compact >"$OUTDIR/mr.tmp" 2>&1
      status=$?
      { echo "== $label (exit $status)"; cat "$OUTDIR/mr.tmp"; } >>"$OUTDIR/sanitizer.log"
      summary=$(grep 'ERROR SUMMARY' "$OUTDIR/mr.tmp" | sed 's/^=* *//' | sort | uniq -c | paste -sd ';')
      if [[ $status -eq 0 ]]; then
        say "  PASS $label: ${summary:-no summary line}"
        PASSED=$((PASSED + 1))
      else
        say "  FAIL $label: exit $status${summary:+, $summary}$([[ $status -eq 124 ]] && echo " (timed out after $secs s)")"
        grep -m5 '=========.*\(Invalid\|Error\|error\)\|No test' "$OUTDIR/mr.tmp" | sed 's/^/    /' | tee -a "$SUMMARY"
        FAILED=$((FAILED + 1))
      fi
    fi

    # The benchmark: mirror's Cluster<Cuda> all_reduce against raw ncclAllReduce on the same 2
    # ranks; the target is mirror >= 0.95x raw from 1 MiB.
    label=cluster_all_reduce_gpu_bench
    secs=$(limit 50 110)
    if ((secs == 0)); then
      no_time "$label (2 ranks)"
    else
      budget=$((secs > 30 ? secs - 20 : 10))
      mpi_launch "$secs" 2 "$MPIKIT/$label" --budget-seconds "$budget" --reps 5 >"$OUTDIR/mr.tmp" 2>&1
      status=$?
      { echo "== $label, 2 ranks on GPU 0 (exit $status, $budget s budget)"; cat "$OUTDIR/mr.tmp"; } >>"$OUTDIR/bench.txt"
      ratio=$(sed -n 's/^ratio_from_1MiB=\([0-9.]*\)$/\1/p' "$OUTDIR/mr.tmp")
      if [[ $status -ne 0 ]]; then
        say "  FAIL $label (2 ranks): exit $status"
        tail -5 "$OUTDIR/mr.tmp" | sed 's/^/    /' | tee -a "$SUMMARY"
        FAILED=$((FAILED + 1))
      elif [[ -z $ratio ]]; then
        say "  SKIP $label (2 ranks): no size from 1 MiB measured within $budget s"
        grep -v '^ratio' "$OUTDIR/mr.tmp" | sed 's/^/    /' | tee -a "$SUMMARY"
        SKIPPED=$((SKIPPED + 1))
      else
        if awk -v r="$ratio" 'BEGIN { exit !(r >= 0.95) }'; then
          say "  PASS $label (2 ranks): mirror/raw NCCL >= 0.95 from 1 MiB (worst $ratio)"
          PASSED=$((PASSED + 1))
        else
          say "  FAIL-ratio $label (2 ranks): mirror/raw NCCL $ratio from 1 MiB, under the target 0.95"
          FAILED=$((FAILED + 1))
        fi
        grep -v '^ratio' "$OUTDIR/mr.tmp" | sed 's/^/    /' | tee -a "$SUMMARY"
      fi
    fi
    rm -f "$xml"
  fi
  rm -f "$OUTDIR/mr.tmp"
fi

# ---- the trainer ----
if [[ -z $DATA ]]; then
  for d in "$KIT/../fashion-mnist" "$KIT/data" /usr/share/datasets/fashion-mnist; do
    if [[ -e $d/train-images-idx3-ubyte.gz || -e $d/train-images-idx3-ubyte ]]; then DATA=$d; break; fi
  done
fi
say "trainer (examples/fashion_mnist --device cuda):"
if [[ $HAVE_GPU -eq 0 ]]; then
  if "$KIT/fashion_mnist" --help >/dev/null 2>&1; then
    say "  SKIP fashion_mnist: no CUDA device (the program starts: --help ok)"
    SKIPPED=$((SKIPPED + 1))
  else
    say "  FAIL fashion_mnist: does not start (--help: exit $?)"
    FAILED=$((FAILED + 1))
  fi
elif [[ -z $DATA ]]; then
  say "  SKIP fashion_mnist: no Fashion-MNIST data (pass --data DIR, or put it in $KIT/../fashion-mnist)"
  SKIPPED=$((SKIPPED + 1))
else
  # The defaults (10 epochs, 2 replicas on one GPU: ReductionToOneDevice), one replica per GPU
  # (NcclAllReduce), the same with gradient buckets started during backward on NCCL's
  # communication stream, and 4 replicas with HierarchicalCopy: each must reach the CPU
  # trainer's 0.88.
  for args in "" "--replicas 1" "--replicas 1 --overlap 0.25" "--replicas 4 --policy hierarchical_copy"; do
    secs=$(limit 75 150)  # kept back: the benchmark, the sanitizer
    ((secs > 0)) || { no_time "fashion_mnist --device cuda${args:+ $args}"; continue; }
    start=$SECONDS
    # shellcheck disable=SC2086
    timeout --kill-after=10 "$secs" "$KIT/fashion_mnist" --device cuda --data "$DATA" $args >"$OUTDIR/run.tmp" 2>&1
    status=$?
    { echo "== fashion_mnist --device cuda $args (exit $status, $((SECONDS - start)) s)"; cat "$OUTDIR/run.tmp"; } \
      >>"$OUTDIR/trainer.log"
    acc=$(sed -n 's/^test_accuracy=\([0-9.]*\)$/\1/p' "$OUTDIR/run.tmp")
    rate=$(grep '^epoch' "$OUTDIR/run.tmp" | tail -1 | sed 's/.*samples\/s //')
    label="fashion_mnist --device cuda${args:+ $args}"
    if [[ $status -eq 0 && -n $acc ]] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.88) }'; then
      say "  PASS $label: test_accuracy=$acc, last epoch $rate samples/s"
      PASSED=$((PASSED + 1))
    else
      say "  FAIL $label: exit $status, test_accuracy=${acc:-none} (needs >= 0.88); see trainer.log"
      tail -3 "$OUTDIR/run.tmp" | sed 's/^/      /' | tee -a "$SUMMARY"
      FAILED=$((FAILED + 1))
    fi
  done
  rm -f "$OUTDIR/run.tmp"
fi

# ---- the same MLP in PyTorch on the same GPU (a peer for the trainer's samples/s) ----
say "peer (bench/fashion_mnist_torch.py: the same MLP, optimiser and batch in PyTorch):"
if [[ $HAVE_GPU -eq 0 ]]; then
  say "  SKIP fashion_mnist_torch: no CUDA device"
  SKIPPED=$((SKIPPED + 1))
elif [[ -z $PY || ! -f $KIT/fashion_mnist_torch.py || -z $DATA ]]; then
  say "  SKIP fashion_mnist_torch: needs python3, the script beside run.sh and the data set"
  SKIPPED=$((SKIPPED + 1))
elif (($(limit 45 150) == 0)); then
  no_time fashion_mnist_torch
else
  secs=$(limit 45 150)  # kept back: the benchmark, the sanitizer
  timeout --kill-after=10 "$secs" "$PY" "$KIT/fashion_mnist_torch.py" --data "$DATA" >"$OUTDIR/run.tmp" 2>&1
  status=$?
  { echo "== fashion_mnist_torch.py (exit $status)"; cat "$OUTDIR/run.tmp"; } >>"$OUTDIR/trainer.log"
  acc=$(sed -n 's/^test_accuracy=\([0-9.]*\)$/\1/p' "$OUTDIR/run.tmp")
  rate=$(grep '^epoch' "$OUTDIR/run.tmp" | tail -1 | sed 's/.*samples\/s //')
  if [[ $status -eq 77 ]]; then
    say "  SKIP fashion_mnist_torch: $(grep -m1 '^SKIP' "$OUTDIR/run.tmp" | sed 's/^SKIP: //')"
    SKIPPED=$((SKIPPED + 1))
  elif [[ $status -eq 0 && -n $acc ]]; then
    say "  PASS fashion_mnist_torch: $(head -1 "$OUTDIR/run.tmp" | sed 's/^fashion_mnist_torch: //')"
    say "       test_accuracy=$acc, last epoch $rate samples/s"
    PASSED=$((PASSED + 1))
  else
    say "  FAIL fashion_mnist_torch: exit $status; see trainer.log"
    tail -3 "$OUTDIR/run.tmp" | sed 's/^/      /' | tee -a "$SUMMARY"
    FAILED=$((FAILED + 1))
  fi
  rm -f "$OUTDIR/run.tmp"
fi

# ---- the benchmark ----
say "bench (bench/gpu/all_reduce_gpu_bench):"
secs=$(limit 75 90)  # kept back: the sanitizer
budget=$((secs > 30 ? secs - 20 : 10))
status=0
if ((secs > 0)); then
  timeout --kill-after=10 "$secs" "$KIT/all_reduce_gpu_bench" --budget-seconds "$budget" >"$OUTDIR/bench.txt" 2>&1
  status=$?
fi
if ((secs == 0)); then
  no_time all_reduce_gpu_bench
elif [[ $status -eq 77 ]]; then
  say "  SKIP all_reduce_gpu_bench: $(grep -m1 '^SKIP' "$OUTDIR/bench.txt" | sed 's/^SKIP: //')"
  SKIPPED=$((SKIPPED + 1))
elif [[ $status -eq 0 ]]; then
  say "  PASS all_reduce_gpu_bench ($budget s budget):"
  sed 's/^/    /' "$OUTDIR/bench.txt" | tee -a "$SUMMARY"
  PASSED=$((PASSED + 1))
else
  say "  FAIL all_reduce_gpu_bench: exit $status"
  tail -5 "$OUTDIR/bench.txt" | sed 's/^/    /' | tee -a "$SUMMARY"
  FAILED=$((FAILED + 1))
fi

# ---- compute-sanitizer ----
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
# memcheck (with leak checking) over every GPU test program, whole; racecheck and synccheck over
# the conformance cases that launch every combine and divide kernel and every copy path. API
# errors are not counted: the suites provoke some on purpose (an allocation of 2^62 bytes, a GPU
# that does not exist), and NCCL probes kernels for other architectures at start; memory errors,
# leaks, races and barrier misuse are what the tools are run for. Catch2 takes one test spec,
# comma-separated; --warn NoTests makes a spec that matches nothing fail instead of passing empty.
KERNEL_CASES='conformance: span leaves*,conformance: a nest*,conformance: broadcast gives*,conformance: an exception in one replica*'
say "compute-sanitizer (memcheck over every test program; racecheck, synccheck over 4 conformance cases):"
matched=$("$KIT/cuda_reduction_to_one_device_test" --list-test-names-only "$KERNEL_CASES" 2>/dev/null | grep -c '^conformance')
if ((matched < 4)); then
  say "  FAIL compute-sanitizer: its test spec matches $matched test cases of cuda_reduction_to_one_device_test, not 4 or more"
  FAILED=$((FAILED + 1))
elif [[ $HAVE_GPU -eq 0 ]]; then
  say "  SKIP compute-sanitizer: no CUDA device (its test spec matches $matched test cases)"
  SKIPPED=$((SKIPPED + 1))
elif [[ -z $SANITIZER ]]; then
  say "  SKIP compute-sanitizer: not found (PATH, /usr/local/cuda/bin)"
  SKIPPED=$((SKIPPED + 1))
else
  runs=()
  for t in "${TESTS[@]}"; do [[ -x $KIT/${t}_test ]] && runs+=("memcheck ${t}_test"); done
  runs+=("racecheck cuda_reduction_to_one_device_test" "synccheck cuda_reduction_to_one_device_test")
  for run in "${runs[@]}"; do
    read -r tool exe <<<"$run"
    secs=$(limit 90 0)
    ((secs > 0)) || { no_time "compute-sanitizer --tool $tool $exe"; continue; }
    spec=()
    [[ $tool == memcheck ]] || spec=("$KERNEL_CASES")
    extra=()
    [[ $tool == memcheck ]] && extra=(--leak-check full)
    echo "== compute-sanitizer --tool $tool $exe ${spec[*]}" >>"$OUTDIR/sanitizer.log"
    start=$SECONDS
    timeout --kill-after=10 "$secs" "$SANITIZER" --tool "$tool" "${extra[@]}" --report-api-errors no \
      --error-exitcode 99 "$KIT/$exe" "${spec[@]}" --warn NoTests -r compact >"$OUTDIR/san.tmp" 2>&1
    status=$?
    cat "$OUTDIR/san.tmp" >>"$OUTDIR/sanitizer.log"
    summary=$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' "$OUTDIR/san.tmp" | sed 's/^=* *//')
    cases=$(grep -m1 -o '[0-9]* test cases\?' "$OUTDIR/san.tmp" | tail -1)
    if [[ $status -eq 0 ]]; then
      say "  PASS compute-sanitizer --tool $tool $exe: ${summary:-no summary line} (${cases:-? test cases}, $((SECONDS - start)) s)"
      PASSED=$((PASSED + 1))
    else
      say "  FAIL compute-sanitizer --tool $tool $exe: exit $status${summary:+, $summary}$([[ $status -eq 124 ]] && echo " (timed out after $secs s)")"
      grep -m5 '=========.*\(Invalid\|Error\|error\|Race\|hazard\)\|No test\|No tests' "$OUTDIR/san.tmp" | sed 's/^/    /' | tee -a "$SUMMARY"
      FAILED=$((FAILED + 1))
    fi
  done
  rm -f "$OUTDIR/san.tmp"
fi

say "total: $PASSED passed, $FAILED failed, $SKIPPED skipped ($SECONDS s)"
[[ $FAILED -eq 0 ]]
