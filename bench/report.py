#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reads bench/results/raw/ (written by bench/report.sh) and writes the report and the plots
into OUT_DIR (bench/report.sh: bench/results/report.md and its PNGs).

   report.py RAW_DIR OUT_DIR [--command CMD] [--rounds N] [--repetitions N]

A figure is the median of every repetition of every round (Google Benchmark's per-repetition
entries; aggregates are ignored); "spread" is the interquartile range over the median. A ratio
divides two such medians, both from the same runs (the programs interleave their competitors).
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess

NAME = re.compile(r'^(?P<verb>[a-z_]+)/impl:(?P<impl>[a-z_]+)/type:(?P<type>\w+)/replicas:(?P<replicas>\d+)/bytes:(?P<bytes>\d+)')


def load(raw):
    """{(verb, impl, type, replicas, bytes): [seconds, ...]}, plus the contexts."""
    times, contexts = {}, {}
    for path in sorted(glob.glob(os.path.join(raw, '*.json'))):
        base = os.path.basename(path)
        if base.startswith('compile_time') or base.startswith('handoff'):
            continue
        with open(path, encoding='utf-8') as f:
            data = json.load(f)
        contexts.setdefault(base.rsplit('_', 1)[0], data.get('context', {}))
        for b in data.get('benchmarks', []):
            if b.get('run_type') == 'aggregate':
                continue
            m = NAME.match(b['name'])
            if not m:
                continue
            unit = {'ns': 1e-9, 'us': 1e-6, 'ms': 1e-3, 's': 1.0}[b.get('time_unit', 'ns')]
            key = (m['verb'], m['impl'], m['type'], int(m['replicas']), int(m['bytes']))
            times.setdefault(key, []).append(b['real_time'] * unit)
    compile_times = {'mirror': [], 'mirror_separate': [], 'std_thread': [], 'library': []}
    for path in sorted(glob.glob(os.path.join(raw, 'compile_time_*.json'))):
        with open(path, encoding='utf-8') as f:
            data = json.load(f)
        for k in compile_times:
            compile_times[k] += data.get(k, [])
        compile_times['flags'] = data.get('flags', '')
    return times, contexts, compile_times


def load_handoffs(raw):
    """Per round, in order: seconds per cache-line hand-off between two cores (handoff_bench's
    spin_two_cores), the host's cross-core latency while that round ran."""
    rounds = []
    for path in sorted(glob.glob(os.path.join(raw, 'handoff_*.json')),
                       key=lambda p: int(re.search(r'_(\d+)\.json$', p).group(1))):
        with open(path, encoding='utf-8') as f:
            data = json.load(f)
        xs = [b['per_handoff'] for b in data.get('benchmarks', [])
              if b.get('run_type') != 'aggregate' and 'spin_two_cores' in b['name'] and 'per_handoff' in b]
        if xs:
            rounds.append(statistics.median(xs))
    return rounds


# The bytes one step of bench/gather_scatter_bench moves, as its file comment counts them (R
# replicas, S bytes per replica's input): reduce_scatter reads every buffer once and writes each
# cut once; the in-place bound reads and writes every buffer once; all_gather, its hand-written
# baseline and the copy bound read and write R*S bytes per replica.
def gs_moved(verb, impl, R, S):
    if verb == 'all_gather':
        return 2 * R * R * S
    return 2 * R * S if impl == 'in_place' else (R + 1) * S


GS_MOVED_TEXT = {'reduce_scatter': '(R+1)·S bytes', 'in_place': '2·R·S', 'all_gather': '2·R²·S bytes',
                 'copy': '2·R²·S'}


def med(xs):
    return statistics.median(xs) if xs else None


def spread(xs):
    if len(xs) < 2:
        return None
    q = statistics.quantiles(xs, n=4, method='inclusive')
    return (q[2] - q[0]) / statistics.median(xs)


def fmt_time(s):
    if s is None:
        return 'n/a'
    for unit, f in (('s', 1), ('ms', 1e-3), ('µs', 1e-6), ('ns', 1e-9)):
        if s >= f:
            return f'{s / f:.3g} {unit}'
    return f'{s / 1e-9:.3g} ns'


def fmt_bytes(b):
    for unit, f in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if b >= f and b % f == 0:
            return f'{b // f} {unit}'
    return f'{b} B'


def fmt_bw(bps):
    return 'n/a' if bps is None else f'{bps / 1e9:.2f} GB/s'


def fmt_ratio(x):
    return 'n/a' if x is None else f'{x:.2f}x'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('raw')
    ap.add_argument('out')
    ap.add_argument('--command', default='bench/report.sh')
    ap.add_argument('--rounds', default='?')
    ap.add_argument('--repetitions', default='?')
    a = ap.parse_args()
    times, contexts, ctimes = load(a.raw)

    def t(verb, impl, replicas, nbytes, typ='float'):
        return med(times.get((verb, impl, typ, replicas, nbytes), []))

    def n(verb, impl, replicas, nbytes, typ='float'):
        return len(times.get((verb, impl, typ, replicas, nbytes), []))

    def sp(verb, impl, replicas, nbytes, typ='float'):
        s = spread(times.get((verb, impl, typ, replicas, nbytes), []))
        return 'n/a' if s is None else f'{100 * s:.0f} %'

    def ratio(num, den):
        return None if num is None or den is None or den == 0 else num / den

    def against_default(verb, impls, R, b):
        """The default's time, and a table cell per impl: its time, and for the others the ratio to
        the default's in brackets ('' where it was not measured)."""
        base = t(verb, 'default', R, b)
        cells = []
        for impl in impls:
            x = t(verb, impl, R, b)
            if x is None:
                cells.append('')
            elif impl == 'default':
                cells.append(fmt_time(x))
            else:
                cells.append(f'{fmt_time(x)} ({fmt_ratio(ratio(x, base))})')
        return base, cells

    def gs_bw(verb, impl, replicas, nbytes):
        """Bytes moved per second (gs_moved) of a gather_scatter_bench figure."""
        x = t(verb, impl, replicas, nbytes)
        return None if x is None else gs_moved(verb, impl, replicas, nbytes) / x

    ctx = contexts.get('all_reduce', {})
    lines = []
    w = lines.append
    w('<!-- generated by bench/report.py; do not edit -->')
    w(f'Command: `{a.command}` ({a.rounds} rounds x {a.repetitions} repetitions, randomly interleaved; MPI and '
      'compile time run between the rounds). Figures are medians over every repetition of every round; '
      '"spread" is the interquartile range over the median, a measure of how noisy the machine was.')
    w('')
    w(f'Machine: {ctx.get("host_name", "?")}, {ctx.get("num_cpus", "?")} CPUs at {ctx.get("mhz_per_cpu", "?")} MHz; '
      f'{ctx.get("compiler", "?")}; mirror {ctx.get("git_describe", "?")}; {ctx.get("device", "")}; build type '
      'debugoptimized (-O2 -g), the project default. MPI: '
      f'{contexts.get("mpi_2", {}).get("mpi", "not run")}.')
    w('')
    handoffs = load_handoffs(a.raw)
    if handoffs:
        w('Host state: a cache-line hand-off between two cores took '
          + ', '.join(f'{x * 1e9:.0f} ns' for x in handoffs)
          + ' in the successive rounds (`bench/handoff_bench`, spin_two_cores, measured before each round). '
          'The development VM shows about 32 ns in its fast state and 170-190 ns in its slow one; latency-bound '
          'figures (run, small all-reduces) move with it, mirror\'s more than OpenMP\'s.')
        w('')

    # ---- targets ----
    MiB = 1 << 20
    big = 64 * MiB
    d_big = t('all_reduce', 'default', 2, big)
    rows = []

    def target(what, value, goal, ok):
        rows.append((what, value, goal, 'yes' if ok else ('no' if ok is not None else 'n/a')))

    r = ratio(t('all_reduce', 'naive', 2, big), d_big)
    target('all_reduce 2 x 64 MiB float vs the naive std::thread chunk-owner loop (time ratio)', fmt_ratio(r), '>= 1.0x',
           None if r is None else r >= 1.0)
    # Issue 32: at least as fast as the hand-written blocked loop at every cell of 2, 4, 8, 16
    # replicas x 1, 16, 64 MiB; the row shows the lowest ratio and where.
    cells = [(ratio(t('all_reduce', 'hand_blocked', R, b), t('all_reduce', 'default', R, b)), R, b)
             for R in (2, 4, 8, 16) for b in (MiB, 16 * MiB, big)]
    cells = [c for c in cells if c[0] is not None]
    if cells:
        r, R, b = min(cells)
        target(f'all_reduce float vs hand_blocked (blocked std::thread chunk-owner), 2-16 replicas x 1-64 MiB: '
               f'lowest time ratio of {len(cells)} cells ({R} x {fmt_bytes(b)})', fmt_ratio(r), '>= 1.0x', r >= 1.0)
    else:
        target('all_reduce float vs hand_blocked, 2-16 replicas x 1-64 MiB (time ratio)', 'n/a', '>= 1.0x', None)
    r = ratio(t('all_reduce', 'copy', 2, big), d_big)
    target('all_reduce 2 x 64 MiB float vs copy-kernel bound (copy time / mirror time)',
           'n/a' if r is None else f'{100 * r:.0f} %', '>= 90 %', None if r is None else r >= 0.9)
    r = ratio(t('all_reduce', 'mpi', 2, big), d_big)
    target('all_reduce 2 x 64 MiB float vs MPI_Allreduce (time ratio)', fmt_ratio(r), '>= 5x',
           None if r is None else r >= 5)
    r = ratio(t('run', 'openmp', 2, 4), t('run', 'run_all_reduce', 2, 4))
    target(f'run + 1-float all_reduce, 2 replicas ({fmt_time(t("run", "run_all_reduce", 2, 4))}) vs OpenMP '
           f'region with reduction ({fmt_time(t("run", "openmp", 2, 4))})', fmt_ratio(r), '>= 2x',
           None if r is None else r >= 2)
    r = ratio(t('all_reduce', 'mpi', 2, 4), t('all_reduce', 'default', 2, 4))
    target(f'1-float all_reduce inside fn, 2 replicas ({fmt_time(t("all_reduce", "default", 2, 4))}) vs '
           f'MPI_Allreduce of 1 float ({fmt_time(t("all_reduce", "mpi", 2, 4))})', fmt_ratio(r), '>= 1.0x',
           None if r is None else r >= 1.0)
    def per_byte(R, b, R0, b0, impl='default'):
        """Time per byte reduced (R * b bytes in all) of R x b relative to R0 x b0."""
        x, y = t('all_reduce', impl, R, b), t('all_reduce', impl, R0, b0)
        return None if x is None or y is None else (x / (R * b)) / (y / (R0 * b0))

    for R in (8, 16):
        for b in (1 * MiB, 16 * MiB):
            # Against 2 replicas of the same size: the measure. With 16 MiB, 2 x 16 MiB fits
            # in a 32 MiB L3 while R x 16 MiB streams from DRAM, so it also measures the cache.
            # The in-place bound's own ratio (every byte read and written once, nothing combined)
            # says how much of it the memory hierarchy imposes on any in-place all-reduce.
            r = per_byte(R, b, 2, b)
            bound = per_byte(R, b, 2, b, 'in_place')
            target(f'{R} replicas x {fmt_bytes(b)}: time per byte reduced, relative to 2 replicas x {fmt_bytes(b)}'
                   + ('' if bound is None else f' (the in-place bound\'s own: {fmt_ratio(bound)})'),
                   fmt_ratio(r), '<= 2x', None if r is None else r <= 2)
            # Against 2 replicas moving the same bytes in all (2 x R*b/2): the same working set, so
            # what is left is the cost of R threads on 2 cores.
            r = per_byte(R, b, 2, R * b // 2)
            target(f'{R} replicas x {fmt_bytes(b)}: time per byte reduced, relative to 2 replicas x '
                   f'{fmt_bytes(R * b // 2)} (the same bytes in all)', fmt_ratio(r), '<= 2x',
                   None if r is None else r <= 2)
    for pol, label in (('one_device', 'ReductionToOneDevice'), ('hierarchical', 'HierarchicalCopy')):
        for R, b in ((2, big), (8, 16 * MiB)):
            r = ratio(t('all_reduce', pol, R, b), t('all_reduce', 'default', R, b))
            target(f'{label}, {R} x {fmt_bytes(b)}: time relative to the default', fmt_ratio(r), '<= 2x',
                   None if r is None else r <= 2)
    # Issue 31: reduce_scatter and all_gather against their bounds in bytes per second, each
    # counting the bytes it moves (gs_moved); and against the hand-written baselines in time.
    for verb, bound, label in (('reduce_scatter', 'in_place', 'the in-place bound'),
                               ('all_gather', 'copy', 'the copy bound')):
        r = ratio(gs_bw(verb, 'default', 2, big), gs_bw(verb, bound, 2, big))
        target(f'{verb} 2 x 64 MiB float: bytes per second against {label}\'s ({GS_MOVED_TEXT[verb]}; '
               f'{GS_MOVED_TEXT[bound]} for the bound)', 'n/a' if r is None else f'{100 * r:.0f} %', '>= 90 %',
               None if r is None else r >= 0.9)
    for verb, hand in (('reduce_scatter', 'hand_blocked'), ('all_gather', 'hand_memcpy')):
        for R, b in ((2, big), (8, 16 * MiB)):
            r = ratio(t(verb, hand, R, b), t(verb, 'default', R, b))
            rows.append((f'{verb} {R} x {fmt_bytes(b)} float vs {hand} (std::thread, time ratio)', fmt_ratio(r),
                         'none set', ''))
    cm, cs = med(ctimes['mirror']), med(ctimes['std_thread'])
    r = ratio(cm, cs)
    target(f'compile time, run/reduce/all_reduce on a 3-level nest: mirror header-only {fmt_time(cm)} vs '
           f'std::thread {fmt_time(cs)} ({len(ctimes["mirror"])} compiles each)', fmt_ratio(r), '<= 2x',
           None if r is None else r <= 2)
    if ctimes['mirror_separate']:
        cp, cl = med(ctimes['mirror_separate']), med(ctimes['library'])
        r = ratio(cp, cs)
        target(f'the same with MIRROR_SEPARATE_COMPILATION: {fmt_time(cp)} vs std::thread {fmt_time(cs)} '
               f'(libmirror_threads, compiled once per build of mirror: {fmt_time(cl)})', fmt_ratio(r), '<= 2x',
               None if r is None else r <= 2)
    w('### Targets (issues 4, 31 and 32)')
    w('')
    w('| measure | figure | target | met |')
    w('|---|---|---|---|')
    for row in rows:
        w('| ' + ' | '.join(row) + ' |')
    w('')

    # ---- all_reduce table ----
    w('### all_reduce (in place, `std::span<float>` leaf, inside a running fn)')
    w('')
    w('Time per all-reduce; in brackets the baseline\'s time divided by mirror\'s (above 1: mirror is faster). '
      'busbw as nccl-tests: algbw x 2(R-1)/R.')
    w('')
    impls = ['default', 'one_device', 'hierarchical', 'naive', 'hand_blocked', 'copy', 'in_place', 'mpi']
    w('| replicas | bytes | ' + ' | '.join(impls) + ' | default busbw | spread (default) |')
    w('|---|---|' + '---|' * len(impls) + '---|---|')
    keys = sorted({(k[3], k[4]) for k in times if k[0] == 'all_reduce' and k[2] == 'float'})
    for R, b in keys:
        base, cells = against_default('all_reduce', impls, R, b)
        busbw = None if base is None else b / base * 2 * (R - 1) / R
        w(f'| {R} | {fmt_bytes(b)} | ' + ' | '.join(cells) + f' | {fmt_bw(busbw)} | {sp("all_reduce", "default", R, b)} |')
    w('')
    other = sorted({(k[2], k[3], k[4]) for k in times if k[0] == 'all_reduce' and k[2] != 'float'})
    if other:
        w('Other element types (2 replicas):')
        w('')
        w('| type | bytes | default | naive | hand_blocked | copy |')
        w('|---|---|---|---|---|---|')
        for typ, R, b in other:
            base = t('all_reduce', 'default', R, b, typ)
            cells = [fmt_time(base)]
            for impl in ('naive', 'hand_blocked', 'copy'):
                x = t('all_reduce', impl, R, b, typ)
                cells.append('' if x is None else f'{fmt_time(x)} ({fmt_ratio(ratio(x, base))})')
            w(f'| {typ} | {fmt_bytes(b)} | ' + ' | '.join(cells) + ' |')
        w('')

    # ---- run latency ----
    w('### run latency (one `run` per step; its fn all-reduces one float)')
    w('')
    run_impls = ['run_all_reduce', 'run_mirrored', 'run_empty', 'openmp']
    w('| replicas | ' + ' | '.join(run_impls) + ' | openmp / run_all_reduce | spread (run_all_reduce) |')
    w('|---|' + '---|' * len(run_impls) + '---|---|')
    for R in sorted({k[3] for k in times if k[0] == 'run'}):
        cells = [fmt_time(t('run', i, R, 4)) for i in run_impls]
        w(f'| {R} | ' + ' | '.join(cells) +
          f' | {fmt_ratio(ratio(t("run", "openmp", R, 4), t("run", "run_all_reduce", R, 4)))} | {sp("run", "run_all_reduce", R, 4)} |')
    w('')

    # ---- reduce / broadcast / dataset ----
    for verb, title, base_impl in (('reduce', 'Strategy::reduce of PerReplica<std::vector>', 'serial_loop'),
                                   ('broadcast', 'ctx.broadcast of a std::span, inside fn', 'std_thread'),
                                   ('distribute_dataset', 'distribute_dataset + one run per step (64 global batches per pass)',
                                    'std_thread')):
        keys = sorted({(k[2], k[3], k[4]) for k in times if k[0] == verb})
        if not keys:
            continue
        w(f'### {verb}: {title}')
        w('')
        w(f'| type | replicas | bytes | mirror | {base_impl} | {base_impl} / mirror |')
        w('|---|---|---|---|---|---|')
        for typ, R, b in keys:
            m, x = t(verb, 'default', R, b, typ), t(verb, base_impl, R, b, typ)
            w(f'| {typ} | {R} | {fmt_bytes(b)} | {fmt_time(m)} | {fmt_time(x)} | {fmt_ratio(ratio(x, m))} |')
        w('')
    # ---- reduce_scatter / all_gather ----
    gs_keys = sorted({(k[0], k[3], k[4]) for k in times if k[0] in ('reduce_scatter', 'all_gather')},
                     key=lambda k: (k[0] != 'reduce_scatter', k[1], k[2]))
    if gs_keys:
        w('### reduce_scatter and all_gather (`std::span<float>` leaf, inside a running fn)')
        w('')
        w('reduce_scatter: the sum, in place into each replica\'s cut; hand-written: hand_blocked; bound: in_place '
          '(moves 2·R·S bytes against reduce_scatter\'s (R+1)·S). all_gather: the span form; hand-written: '
          'hand_memcpy; bound: copy (the same 2·R²·S bytes, no input shared between threads). Time per call; in '
          'brackets the other\'s time over the default\'s (above 1: the default is faster); GB/s: bytes moved '
          'per second; "of bound": the default\'s GB/s over the bound\'s.')
        w('')
        gs_impls = ['default', 'one_device', 'hierarchical']
        w('| verb | replicas | bytes | ' + ' | '.join(gs_impls) + ' | hand-written | bound | default GB/s | '
          'bound GB/s | of bound | spread (default) |')
        w('|---|---|---|' + '---|' * len(gs_impls) + '---|---|---|---|---|---|')
        for verb, R, b in gs_keys:
            hand, bound = ('hand_blocked', 'in_place') if verb == 'reduce_scatter' else ('hand_memcpy', 'copy')
            base, cells = against_default(verb, gs_impls + [hand, bound], R, b)
            d_bw, b_bw = gs_bw(verb, 'default', R, b), gs_bw(verb, bound, R, b)
            of = ratio(d_bw, b_bw)
            w(f'| {verb} | {R} | {fmt_bytes(b)} | ' + ' | '.join(cells) +
              f' | {fmt_bw(d_bw) if d_bw and b >= 4096 else ""} | {fmt_bw(b_bw) if b_bw else ""} | '
              f'{"" if of is None else f"{100 * of:.0f} %"} | {sp(verb, "default", R, b)} |')
        w('')
    w('Plots: [all_reduce bandwidth vs message size](all_reduce_bandwidth.png), '
      '[run latency vs replicas](run_latency.png).')
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, 'report.md'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines) + '\n')

    # ---- plots (gnuplot) ----
    if not shutil.which('gnuplot'):
        print('report.py: gnuplot not found (Debian: gnuplot-nox): no plots')
        return
    dat = os.path.join(a.out, 'plot')
    os.makedirs(dat, exist_ok=True)
    series = []
    for impl in impls:
        pts = sorted((b, b / t('all_reduce', impl, 2, b)) for (v, i, ty, R, b) in times
                     if v == 'all_reduce' and i == impl and ty == 'float' and R == 2)
        if pts:
            with open(os.path.join(dat, f'bw_{impl}.dat'), 'w') as f:
                f.writelines(f'{b} {bw / 1e9}\n' for b, bw in pts)
            series.append(f'"{dat}/bw_{impl}.dat" using 1:2 with linespoints title "{impl}"')
    lat = []
    for impl in run_impls:
        pts = sorted((R, t('run', impl, R, 4)) for (v, i, ty, R, b) in times if v == 'run' and i == impl)
        if pts:
            with open(os.path.join(dat, f'lat_{impl}.dat'), 'w') as f:
                f.writelines(f'{R} {s * 1e6}\n' for R, s in pts)
            lat.append(f'"{dat}/lat_{impl}.dat" using 1:2 with linespoints title "{impl}"')
    if not series or not lat:  # a partial raw folder (one program run by hand)
        print('report.py: no all_reduce or run figures: no plots')
        shutil.rmtree(dat)
        return
    script = f'''set terminal pngcairo size 900,560 noenhanced
set output "{a.out}/all_reduce_bandwidth.png"
set title "all_reduce, 2 replicas, float: algbw (bytes per replica / time)"
set logscale x 2
set logscale y 10
set xrange [3:190000000]
set xtics ("4 B" 4, "64 B" 64, "4 KiB" 4096, "64 KiB" 65536, "1 MiB" 1048576, "16 MiB" 16777216, "64 MiB" 67108864)
set xlabel "bytes per replica"
set ylabel "GB/s"
set key left top
set grid
plot {", ".join(series)}
set output "{a.out}/run_latency.png"
set title "run with a 1-float all_reduce: time per run vs replicas (2 cores)"
set logscale x 2
set logscale y 10
set xrange [0.9:18]
set xtics ("1" 1, "2" 2, "4" 4, "8" 8, "16" 16)
set xlabel "replicas"
set ylabel "microseconds"
plot {", ".join(lat)}
'''
    subprocess.run(['gnuplot'], input=script, text=True, check=True)
    shutil.rmtree(dat)


if __name__ == '__main__':
    main()
