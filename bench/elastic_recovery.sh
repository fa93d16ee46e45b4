#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What a lost worker costs (docs/multi-worker.md#losing-a-worker), with bench/elastic_recovery
# (built in build-ft: ./dev.sh ft-test) under Open MPI 5's mpirun, W workers x 1 replica, the
# Fashion-MNIST MLP's 235,146 parameters, 5 ms of compute a step:
#  1. the time from a worker's death to the next completed step on the survivors
#     (mirror::elastic: found, rebuilt, resumed) against restarting the job from its checkpoint
#     (the job without --with-ft ends when a worker dies; then a new mpirun on W-1 workers
#     restores the checkpoint and completes the step): from the death to the end of the failed
#     job, plus from the relaunch to the restored step. The rounds alternate the two.
#  2. the steady cost of committing after every step (a copy of the parameters), as step times with
#     and without, alternated inside one job.
#
#   bench/elastic_recovery.sh [--build build-ft] [--workers 3] [--rounds 5]
#
# Writes bench/results/elastic_recovery.md and prints it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build-ft workers=3 rounds=5
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift ;;
    --workers) workers=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    *) echo "elastic_recovery.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
program=$build/bench/elastic_recovery
mpirun=$build/mpi-venv/bin/mpirun
[[ -x $program && -x $mpirun ]] || { echo "elastic_recovery.sh: build $program first (./dev.sh ft-test, then meson compile -C $build bench/elastic_recovery)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launch=("$mpirun" --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && launch+=(--allow-run-as-root)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=bench/results/elastic_recovery.md
python3 - "$work" "$rounds" "$workers" "$program" "${launch[@]}" <<'PYEOF'
import os, re, statistics, subprocess, sys, time
work, rounds, workers, program, launch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
stamp, ckpt = os.path.join(work, 'stamp'), os.path.join(work, 'ckpt')

def run(args, timeout=120):
    return subprocess.run(launch + args, capture_output=True, text=True, timeout=timeout)

elastic, restart, steady = [], [], []
for r in range(rounds):
    # mirror::elastic: the loss inside one job
    p = run(['--with-ft', 'ulfm', '-np', str(workers), program, '--mode', 'elastic', '--stamp', stamp])
    m = re.search(r'RECOVERY found_ms=(\S+) rebuilt_ms=(\S+) resumed_ms=(\S+) step_ms=(\S+)', p.stdout)
    if not m:
        sys.exit('elastic run printed no RECOVERY line:\n' + p.stdout + p.stderr)
    elastic.append(tuple(float(x) for x in m.groups()))
    # the restart: the job ends at the death, a new one restores and completes the step
    p = run(['-np', str(workers), program, '--mode', 'save', '--stamp', stamp, '--checkpoint', ckpt])
    ended = time.monotonic() * 1000
    with open(stamp) as f:
        died = float(f.read())
    start = time.monotonic()
    q = subprocess.Popen(launch + ['-np', str(workers - 1), program, '--mode', 'restore', '--checkpoint', ckpt],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    restored = None
    for line in q.stdout:
        if line.startswith('RESTORED'):
            restored = (time.monotonic() - start) * 1000
    q.wait()
    if restored is None:
        sys.exit('restore run printed no RESTORED line')
    restart.append((ended - died, restored))
    p = run(['-np', str(workers), program, '--mode', 'steady', '--rounds', '3'])
    m = re.search(r'STEADY commit_ms=(\S+) plain_ms=(\S+)', p.stdout)
    steady.append((float(m.group(1)), float(m.group(2))))

def fig(values):
    v = sorted(values)
    return f'{statistics.median(v):.0f} ms ({v[0]:.0f}-{v[-1]:.0f})'

lines = [f'# Losing a worker: recovery and its steady cost ({workers} workers x 1 replica, 235,146 float parameters, '
         f'5 ms compute a step; {rounds} alternated rounds, median (range))', '',
         '| | time from the death |', '|---|---|',
         f'| mirror::elastic: the survivors\' worker_lost_error | {fig(e[0] for e in elastic)} |',
         f'| mirror::elastic: the next strategy built on the survivors | {fig(e[1] for e in elastic)} |',
         f'| mirror::elastic: the failed step completed and committed on them | {fig(e[2] for e in elastic)} |',
         f'| restart: the failed job ended (mpirun without --with-ft) | {fig(r[0] for r in restart)} |',
         f'| restart: a new job on {workers - 1} workers restored the checkpoint and completed the step | '
         f'{fig(r[0] + r[1] for r in restart)} |', '',
         f'A step before the loss: {statistics.median(e[3] for e in elastic):.1f} ms. Elastic recovery against '
         f'restart: {statistics.median(r[0] + r[1] for r in restart) / statistics.median(e[2] for e in elastic):.1f}x '
         'faster (medians).', '',
         '| steady step | median (range) |', '|---|---|',
         f'| with a commit after every step | {statistics.median(s[0] for s in steady):.2f} ms '
         f'({min(s[0] for s in steady):.2f}-{max(s[0] for s in steady):.2f}) |',
         f'| without | {statistics.median(s[1] for s in steady):.2f} ms '
         f'({min(s[1] for s in steady):.2f}-{max(s[1] for s in steady):.2f}) |',
         f'| cost of committing every step | {statistics.median((s[0] / s[1] - 1) * 100 for s in steady):+.1f} % '
         f'({min((s[0] / s[1] - 1) * 100 for s in steady):+.1f} to {max((s[0] / s[1] - 1) * 100 for s in steady):+.1f}) |']
print('\n'.join(lines))
with open('bench/results/elastic_recovery.md', 'w') as f:
    f.write('\n'.join(lines) + '\n')
PYEOF
