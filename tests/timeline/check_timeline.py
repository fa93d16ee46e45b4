#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs tests/timeline/write_timeline.cpp's program and checks the Chrome trace it writes
(docs/debugging.md#the-timeline): valid JSON in the object format that Perfetto and
chrome://tracing read; a named track per replica (and per worker, its MPI calls);
complete events, in time order and properly nested on each track; every phase the page names,
the collectives with their call sites, and the slow replica's imbalance showing as waits.

With --end exit, throw or signal the program ends abnormally with its strategy alive (std::exit,
an uncaught exception, SIGSEGV), and the file must be just as whole.

Usage: check_timeline.py PROGRAM OUTDIR [--replicas R] [--workers W --launch 'run_mpi.sh 2'] [--end E]
Exit 0 when the trace holds, 1 with one line per problem otherwise.
"""
import argparse
import collections
import json
import os
import shlex
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument('program')
ap.add_argument('outdir')
ap.add_argument('--replicas', type=int, default=2)
ap.add_argument('--workers', type=int, default=1)
ap.add_argument('--launch', default='')
ap.add_argument('--runs', type=int, default=3)
ap.add_argument('--end', default='close', choices=['close', 'exit', 'throw', 'signal'])
args = ap.parse_args()

os.makedirs(args.outdir, exist_ok=True)
path = os.path.join(args.outdir, 'trace.json')
cmd = shlex.split(args.launch) + [args.program, path, str(args.replicas), str(args.runs), args.end]
done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
if done.returncode == 77:  # run_mpi.sh: no mpirun here
    print(done.stdout.strip())
    sys.exit(77)
if (done.returncode != 0) != (args.end in ('throw', 'signal')):
    print(done.stdout, done.stderr)
    sys.exit(f'check_timeline: {cmd} exited {done.returncode}')
lines = [l for l in done.stdout.splitlines() if l.startswith('lines ')][0].split()[1:]
reduce_line, broadcast_line, scalar_line = (int(x) for x in lines)

problems = []
def problem(text):
    problems.append(text)

W, R = args.workers, args.replicas
files = [path] if W == 1 else [path.replace('.json', f'.worker{w}.json') for w in range(W)]
events = []
for f in files:
    with open(f) as fh:
        doc = json.load(fh)  # a JSON error fails the test here
    if set(doc) != {'displayTimeUnit', 'traceEvents'}:
        problem(f'{f}: top-level keys {sorted(doc)}')
    events += doc['traceEvents']

# Track names.
names = {(e['pid'], e['tid']): e['args']['name'] for e in events if e['ph'] == 'M' and e['name'] == 'thread_name'}
processes = {e['pid']: e['args']['name'] for e in events if e['ph'] == 'M' and e['name'] == 'process_name'}
for w in range(W):
    if processes.get(w) != f'worker {w}':
        problem(f'process {w} is named {processes.get(w)!r}')
    for r in range(R):
        if names.get((w, r)) != f'replica {w * R + r}':
            problem(f'track ({w}, {r}) is named {names.get((w, r))!r}, not replica {w * R + r}')
    if W > 1 and names.get((w, R)) != 'cross-worker MPI calls':
        problem(f'worker {w} has no "cross-worker MPI calls" track: {names}')

# Complete events, in time order and nested on each track.
tracks = collections.defaultdict(list)
for e in events:
    if e['ph'] == 'M':
        continue
    if e['ph'] != 'X' or not all(k in e for k in ('name', 'cat', 'ts', 'dur', 'pid', 'tid')):
        problem(f'not a complete event: {e}')
        continue
    if e['dur'] < 0:
        problem(f'negative duration: {e}')
    tracks[(e['pid'], e['tid'])].append(e)
EPS = 0.002  # the file's timestamps have 1 ns resolution (3 decimals of a microsecond)
for key, evs in tracks.items():
    for a, b in zip(evs, evs[1:]):
        if b['ts'] + EPS < a['ts']:
            problem(f'track {key}: {b["name"]} at {b["ts"]} written after {a["name"]} at {a["ts"]}')
            break
    stack = []
    for e in evs:
        while stack and e['ts'] >= stack[-1]['ts'] + stack[-1]['dur'] - EPS:
            stack.pop()
        if stack and e['ts'] + e['dur'] > stack[-1]['ts'] + stack[-1]['dur'] + EPS:
            problem(f'track {key}: {e["name"]} [{e["ts"]}, +{e["dur"]}] overlaps {stack[-1]["name"]} '
                    f'[{stack[-1]["ts"]}, +{stack[-1]["dur"]}] without nesting in it')
            break
        stack.append(e)

# The phases, on every replica's track.
def named(key, name):
    return [e for e in tracks[key] if e['name'] == name]
for w in range(W):
    for r in range(R):
        key = (w, r)
        for name, count in (('fn', args.runs), ('all_reduce(sum)', args.runs), ('all_reduce(max)', args.runs),
                            (f'broadcast(from = {W * R - 1})', args.runs)):
            if len(named(key, name)) != count:
                problem(f'replica {w * R + r}: {len(named(key, name))} "{name}" spans, expected {count}')
        for name in ('compute', 'agreement check, waiting for peers', 'copy / combine'):
            if not named(key, name):
                problem(f'replica {w * R + r}: no "{name}" span')
        sites = {e['name']: e['args']['site'] for e in tracks[key] if e['cat'] == 'collective'}
        for name, line in (('all_reduce(sum)', reduce_line), ('all_reduce(max)', scalar_line)):
            if not sites.get(name, '').endswith(f'write_timeline.cpp:{line}'):
                problem(f'replica {w * R + r}: {name} has site {sites.get(name)!r}, expected line {line}')
        reduces = named(key, 'all_reduce(sum)')
        if reduces and reduces[0]['args'].get('bytes') != 4 << 16:
            problem(f'replica {w * R + r}: all_reduce(sum) of {reduces[0]["args"].get("bytes")} bytes')
    if W > 1:
        if not named((w, 0), 'cross-worker step'):
            problem(f'worker {w}: replica {w * R} has no "cross-worker step" span')
        comm = (w, R)
        for name in ('all-reduce (MPI)', 'broadcast (MPI)', 'agreement check'):
            if not named(comm, name):
                problem(f'worker {w}: no "{name}" span on its "cross-worker MPI calls" track')

# The imbalance: the last replica computes 20 ms, the others 2 ms, so a replica of its worker
# waits for it in the first collective of each run (its agreement check), for far longer than
# the last replica ever waits in one.
if R >= 2:
    def longest_check(key):
        return max((e['dur'] for e in named(key, 'agreement check, waiting for peers')), default=0)
    fast, slow = longest_check((W - 1, 0)), longest_check((W - 1, R - 1))
    if not fast > 10_000 > slow:
        problem(f'replica {(W - 1) * R} waited at most {fast:.0f} us for the slow replica, which itself waited '
                f'{slow:.0f} us: the imbalance does not show')

for p in problems:
    print('check_timeline:', p)
print(f'check_timeline: {len(files)} file(s), {sum(len(v) for v in tracks.values())} spans, {len(problems)} problem(s)')
sys.exit(1 if problems else 0)
