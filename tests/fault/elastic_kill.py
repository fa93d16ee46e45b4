#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The elastic kill harness (docs/multi-worker.md#losing-a-worker): randomized, seeded and
replayable trials of a mirror::elastic loop (tests/fault/elastic_kill.cpp) in which one or two
workers die by SIGKILL at random points: in fn before the step's collective, during the
collective, between the run and the commit, during the commit, during the survivors' recovery
from an earlier loss, or killed from outside (kill -9 by this script) at a random
moment. Every trial checks, on every survivor, the parameters against a serial replay (bit for
bit), the rows trained (none lost or repeated) and the step reached; and that the job ends: no
hang, no abort.

Usage: elastic_kill.py --program PATH --mpirun PATH [--trials N] [--seed S] [--workers 3,4]
                       [--replicas 1,2] [--trial K] [--timeout SECONDS] [--quiet]
--trial K replays trial K of seed S alone (its plan is printed with every failure). Exit 0 when
every trial passed; one line per trial that did not, and a summary line. Exit 77 (skipped) where
the program is missing.
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

POINTS = ['fn', 'collective', 'between', 'commit', 'external']
STEPS = 40  # of 5 ms each: an outside kill within the first 0.4 s lands mid-training


def plan_of(seed, trial, workers_choices, replicas_choices):
    """The trial's configuration and kills, from (seed, trial) alone."""
    rng = random.Random(seed * 1_000_003 + trial)
    workers = rng.choice(workers_choices)
    replicas = rng.choice(replicas_choices)
    victims = rng.sample(range(workers), 2 if workers >= 3 and rng.random() < 0.3 else 1)
    kills = []
    for n, rank in enumerate(victims):
        point = rng.choice(POINTS if n == 0 else POINTS + ['recovery', 'recovery'])
        step = rng.randrange(0, STEPS)
        delay = rng.choice([0, rng.randrange(0, 200), rng.randrange(0, 5000)])
        kills.append((rank, point, step, delay))
    external_delay = rng.uniform(0.0, 0.4)
    return workers, replicas, kills, external_delay


def run_trial(args, trial):
    workers, replicas, kills, external_delay = plan_of(args.seed, trial, args.workers, args.replicas)
    plan = ','.join(f'{r}:{p}:{s}:{d}' for (r, p, s, d) in kills if p != 'external')
    external = [r for (r, p, _, _) in kills if p == 'external']
    description = (f'trial {trial} (seed {args.seed}): {workers} workers x {replicas} replicas, kills '
                   + ', '.join(f'rank {r} {p} step {s} delay {d} us' if p != 'external' else
                               f'rank {r} from outside after {external_delay:.3f} s' for (r, p, s, d) in kills))
    with tempfile.TemporaryDirectory(prefix='mirror_elastic_kill_') as pid_dir:
        command = [args.mpirun, '--with-ft', 'ulfm', '--oversubscribe', '--bind-to', 'none', '-np', str(workers),
                   args.program, '--replicas', str(replicas), '--steps', str(STEPS), '--plan', plan or '-1:fn:0:0',
                   '--pid-dir', pid_dir]
        if os.getuid() == 0:
            command.insert(1, '--allow-run-as-root')
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1')
        start = time.monotonic()
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                               start_new_session=True)
        if external:
            # Every rank has written its pid once the job runs; kill the victim after the delay.
            deadline = time.monotonic() + 20
            paths = [os.path.join(pid_dir, f'rank{r}.pid') for r in range(workers)]
            while time.monotonic() < deadline and not all(os.path.exists(p) for p in paths):
                time.sleep(0.005)
            time.sleep(external_delay)
            for r in external:
                try:
                    with open(os.path.join(pid_dir, f'rank{r}.pid')) as f:
                        os.kill(int(f.read().strip()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass  # the job ended before
        try:
            output, _ = job.communicate(timeout=args.timeout)
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            output, _ = job.communicate()
            hung = True
        seconds = time.monotonic() - start
    results = {}
    for m in re.finditer(r'^RESULT rank=(\d+) ok=(\d) steps=(\d+) rows=(\d+) epochs=(\S*)(?: why=(.*))?$', output,
                         re.MULTILINE):
        results[int(m.group(1))] = m
    victims = {r for (r, _, _, _) in kills}
    problems = []
    if hung:
        problems.append(f'hung: no end within {args.timeout} s')
    elif job.returncode != 0:
        problems.append(f'mpirun exited {job.returncode}')
    for r in range(workers):
        m = results.get(r)
        if m is None:
            if r not in victims:
                problems.append(f'rank {r} (not a victim) printed no result')
        elif m.group(2) != '1':
            problems.append(f'rank {r}: {m.group(6)}')
    if not results:
        problems.append('no survivor printed a result')
    finalize_hangs = output.count('FINALIZE-HANG')
    # Workers lost: the world against the last strategy's workers (a loss during a construction
    # leaves no epoch of its own).
    losses = max((workers - int(m.group(5).split(',')[-1].split('@')[0]) for m in results.values() if m.group(5)),
                 default=0)
    return description, problems, seconds, finalize_hangs, losses, output


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--program', required=True)
    p.add_argument('--mpirun', required=True)
    p.add_argument('--trials', type=int, default=100)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--workers', default='3,4')
    p.add_argument('--replicas', default='1,2')
    p.add_argument('--trial', type=int, default=None)
    p.add_argument('--timeout', type=float, default=90)
    p.add_argument('--quiet', action='store_true')
    args = p.parse_args()
    args.workers = [int(x) for x in args.workers.split(',')]
    args.replicas = [int(x) for x in args.replicas.split(',')]
    if not os.path.exists(args.program) or not os.path.exists(args.mpirun):
        print(f'SKIP: {args.program} or {args.mpirun} missing: the elastic kill harness did NOT run')
        return 77
    trials = [args.trial] if args.trial is not None else range(args.trials)
    failed = hangs = finalize_hangs = with_loss = 0
    durations = []
    for t in trials:
        description, problems, seconds, fh, losses, output = run_trial(args, t)
        durations.append(seconds)
        finalize_hangs += 1 if fh else 0
        with_loss += 1 if losses else 0
        if problems:
            failed += 1
            hangs += any(x.startswith('hung') for x in problems)
            print(f'FAILED {description}: ' + '; '.join(problems))
            print('\n'.join('    ' + line for line in output.splitlines()[-40:]))
            print(f'    replay: {sys.argv[0]} --program {args.program} --mpirun {args.mpirun} --seed {args.seed} '
                  f'--workers {",".join(map(str, args.workers))} --replicas {",".join(map(str, args.replicas))} '
                  f'--trial {t}')
        elif not args.quiet:
            print(f'ok {description} ({seconds:.1f} s, {losses} {"loss" if losses == 1 else "losses"} survived)')
        sys.stdout.flush()
    durations.sort()
    print(f'elastic_kill: {len(durations)} trials (seed {args.seed}, workers {args.workers}, replicas '
          f'{args.replicas}): {len(durations) - failed} passed, {failed} failed ({hangs} hangs); {with_loss} '
          f'survived a loss; Open MPI\'s MPI_Finalize hung after the verdict in {finalize_hangs} (left after 5 s); '
          f'median {durations[len(durations) // 2]:.1f} s per trial')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
