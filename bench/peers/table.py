#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/peers.sh's table: reads the raw output in DIR (bench/results/peers/) and writes the
markdown table to OUT (bench/results/peers.md) and gnuplot's data to DIR/plot.dat.

  table.py DIR OUT

Micro-benchmarks: the median over every repetition of every round, and the range (min-max).
Training: the median over rounds of each run's samples/s (the epochs after the first), the range,
and the median test accuracy. "x" columns: the peer's time over mirror's (samples/s: mirror's
over the peer's); above 1 mirror is ahead, below 1 the cell says "not ahead".
"""
import glob
import json
import os
import re
import statistics
import sys


def gbench(path, key):
    """{(impl, bytes): [seconds per call]} from a Google Benchmark (or mpi_cluster_bench) JSON."""
    unit = {'ns': 1e-9, 'us': 1e-6, 'ms': 1e-3, 's': 1.0}
    out = {}
    with open(path) as f:
        text = f.read()
    start = text.find('{')
    if start < 0:
        return out
    data = json.loads(text[start:])
    for b in data.get('benchmarks', []):
        if b.get('run_type', 'iteration') != 'iteration':
            continue
        m = re.search(r'impl:([^/]+)/.*bytes:(\d+)', b['name'])
        if not m:
            continue
        out.setdefault((key or m.group(1), int(m.group(2))), []).append(b['real_time'] * unit[b.get('time_unit', 'ns')])
    return out


def trainer(path):
    """(samples/s over the epochs after the first, test accuracy) from fashion_mnist's output."""
    with open(path) as f:
        text = f.read()  # under mpirun stdout is a terminal: progress bars share the epoch lines
    sps = [float(m.group(1)) for m in re.finditer(r'epoch \d+/\d+  loss \S+  train_accuracy \S+  samples/s (\d+)', text)]
    m = re.search(r'test_accuracy=([\d.]+)', text)
    acc = float(m.group(1)) if m else None
    if not sps or acc is None:
        return None
    rest = sps[1:] or sps
    return len(rest) / sum(1 / s for s in rest), acc  # every epoch has the same samples


def peer_lines(path):
    with open(path) as f:
        for line in f:
            if line.startswith('PEER '):
                yield json.loads(line[5:])


def collect(d):
    """{column: {row: [values]}}, {column: {'accuracy': [...]}}, {column: framework}."""
    times, train, frameworks = {}, {}, {}

    def add(col, row, vals):
        times.setdefault(col, {}).setdefault(row, []).extend(vals)

    for p in glob.glob(os.path.join(d, 'mirror_step_r*.json')):
        for (_, b), v in gbench(p, 'step').items():
            add('mirror', 'step', v)
    for p in glob.glob(os.path.join(d, 'mirror_all_reduce_r*.json')):
        for (_, b), v in gbench(p, None).items():
            add('mirror', b, v)
    for p in glob.glob(os.path.join(d, 'mirror_mw_all_reduce_r*.json')):
        for (impl, b), v in gbench(p, None).items():
            col = 'mirror_mw' if impl == 'cluster' else 'mpi_mw'
            add(col, 'step' if b == 4 else b, v)
    for col, pattern in (('mirror', 'mirror_train_r*.txt'), ('mirror_mw', 'mirror_mw_train_r*.txt')):
        for p in glob.glob(os.path.join(d, pattern)):
            r = trainer(p)
            if r:
                train.setdefault(col, []).append(r)
    for p in glob.glob(os.path.join(d, '*_r*.txt')):
        for e in peer_lines(p):
            col = e['peer']
            frameworks[col] = e.get('framework', col)
            if e['measure'] == 'train':
                train.setdefault(col, []).append((e['samples_per_s'], e['test_accuracy']))
            else:
                add(col, 'step' if e['measure'] == 'step' else e['bytes'], e['seconds'])
    return times, train, frameworks


def fmt_time(s):
    for unit, f in (('s', 1), ('ms', 1e-3), ('µs', 1e-6), ('ns', 1e-9)):
        if s >= f or unit == 'ns':
            v = s / f
            return f'{v:.3g} {unit}' if v < 1000 else f'{v:.0f} {unit}'


def cell_time(vals):
    if not vals:
        return ''
    return f'{fmt_time(statistics.median(vals))} ({fmt_time(min(vals))}-{fmt_time(max(vals))})'


def cell_train(runs):
    if not runs:
        return '', ''
    sps = [r[0] for r in runs]
    acc = [r[1] for r in runs]
    return (f'{statistics.median(sps):.0f} ({min(sps):.0f}-{max(sps):.0f})',
            f'{statistics.median(acc):.4f}')


def ratio(mirror, peer, higher_is_better=False):
    if not mirror or not peer:
        return '', None
    m, p = statistics.median(mirror), statistics.median(peer)
    x = m / p if higher_is_better else p / m
    text = f'{x:.3g}x' if x < 100 else f'{x:.0f}x'
    return (text if x >= 1 else f'**not ahead**: {text}'), x


def size_name(b):
    return {4: '4 B'}.get(b) or (f'{b >> 20} MiB' if b >= 1 << 20 else f'{b >> 10} KiB')


def table(times, train, mirror_col, peers, rows, step_label):
    head = ['measure', 'mirror'] + [name for _, name, _ in peers] + [f'vs {short}' for _, _, short in peers]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    plot = []
    for row in rows:
        label = step_label if row == 'step' else f'all-reduce, {size_name(row)} per replica'
        cells = [label, cell_time(times.get(mirror_col, {}).get(row))]
        cells += [cell_time(times.get(col, {}).get(row)) for col, _, _ in peers]
        xs = []
        for col, _, _ in peers:
            text, x = ratio(times.get(mirror_col, {}).get(row), times.get(col, {}).get(row))
            cells.append(text)
            xs.append(x)
        lines.append('| ' + ' | '.join(cells) + ' |')
        plot.append(('step' if row == 'step' else size_name(row), xs))
    sps = cell_train(train.get(mirror_col))
    peer_train = [cell_train(train.get(col)) for col, _, _ in peers]
    cells = ['Fashion-MNIST MLP, samples/s', sps[0]] + [t[0] for t in peer_train]
    xs = []
    for col, _, _ in peers:
        text, x = ratio([r[0] for r in train.get(mirror_col, [])], [r[0] for r in train.get(col, [])], True)
        cells.append(text)
        xs.append(x)
    lines.append('| ' + ' | '.join(cells) + ' |')
    plot.append(('training', xs))
    cells = ['the same, test accuracy', sps[1]] + [t[1] for t in peer_train] + [''] * len(peers)
    lines.append('| ' + ' | '.join(cells) + ' |')
    return lines, plot


def main():
    d, out = sys.argv[1], sys.argv[2]
    times, train, frameworks = collect(d)
    versions = open(os.path.join(d, 'versions.txt')).read().strip() if os.path.exists(os.path.join(d, 'versions.txt')) else ''
    config = dict(line.split(': ', 1) for line in versions.splitlines() if ': ' in line)
    sizes = sorted(b for b in times.get('mirror', {}) if b != 'step')
    md = ['# mirror against TensorFlow and PyTorch', '',
          'Written by `bench/peers.sh` from the raw output in `bench/results/peers/`. Cells: median '
          '(min-max) over every repetition of every round (training: over rounds). "vs X": '
          "X's time over mirror's (training: mirror's samples/s over X's); above 1 mirror is ahead.", '',
          '```', versions, '```', '']
    single = [('tf', 'TF MirroredStrategy', 'TF'), ('torch', 'torch DDP gloo', 'torch')]
    have_single = [p for p in single if p[0] in times or p[0] in train]
    missing = [p[1] for p in single if p not in have_single]
    md += ['## One process (mirror: devices::Threads, 2 replicas)', '']
    if missing:
        md += [f'**SKIPPED: {", ".join(missing)}** (not installed: `bench/peers.sh --setup`).', '']
    lines, plot = table(times, train, 'mirror', have_single, ['step'] + sizes,
                        'step: run + 1-float all-reduce (torch: `dist.all_reduce` of 1 float)')
    md += lines
    plot_rows = [(label, dict(zip([p[0] for p in have_single], xs))) for label, xs in plot]
    if 'mirror_mw' in times or 'mirror_mw' in train:
        mw = [('tf_mw', 'TF MultiWorkerMirrored', 'TF'), ('torch', 'torch DDP gloo', 'torch'),
              ('mpi_mw', "raw MPI_Allreduce (mirror's transport)", 'MPI')]
        mw = [p for p in mw if p[0] in times or p[0] in train]
        md += ['', '## Two processes (mirror: devices::Cluster, 2 workers x 1 replica under mpirun)', '',
               'torch DDP is one process per replica in both tables: its figures are the same runs as above. '
               'MPI_Allreduce: raw MPI on the same processes, in the same program as mirror\'s figures '
               '(bench/mpi_cluster_bench).', '']
        mw_sizes = sorted(b for b in times.get('mirror_mw', {}) if b != 'step')
        lines, _ = table(times, train, 'mirror_mw', mw, ['step'] + mw_sizes,
                         '1-float all-reduce (mirror: the collective, inside one `run`; MPI, torch: '
                         'the call; TF: a step, `strategy.run`)')
        md += lines
    if frameworks:
        md += ['', 'Peers: ' + '; '.join(f'{c}: {f}' for c, f in sorted(frameworks.items())) + '.']
    with open(out, 'w') as f:
        f.write('\n'.join(md) + '\n')
    if not have_single:
        print(f'table.py: wrote {out} (no peer: no plot data)', file=sys.stderr)
        return
    with open(os.path.join(d, 'plot.dat'), 'w') as f:
        f.write('# measure  tf_x  torch_x  (peer time / mirror time; training: mirror samples/s / peer)\n')
        for label, xs in plot_rows:
            f.write('"{}" {} {}\n'.format(label,
                                          xs.get('tf') or 'NaN', xs.get('torch') or 'NaN'))
    print(f'table.py: wrote {out}', file=sys.stderr)


if __name__ == '__main__':
    main()
