#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws a mirror timeline (a Chrome trace from Strategy::set_timeline or MIRROR_TIMELINE) as a
PNG, for readers who will not open Perfetto: one row per track (replica, communication thread),
each span a bar at its nesting depth, coloured by what it is (docs/debugging.md#the-timeline).

Usage: timeline_png.py TRACE.json [MORE.json ...] -o OUT.png [--from MS] [--to MS] [--title T]
  Several files (one per worker) are drawn together. --from/--to cut a window, in milliseconds
  from the first span. Needs matplotlib (pip install matplotlib).
"""
import argparse
import collections
import json
import sys

try:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
except ImportError:
    sys.exit('timeline_png: needs matplotlib (pip install matplotlib)')

# What a span is, by its name, and its colour.
KINDS = [
    ('fn', '#d9d9d9', lambda n, c: n == 'fn'),
    ('compute (your fn)', '#a6a6a6', lambda n, c: n == 'compute'),
    ('collective', '#4e79a7', lambda n, c: c == 'collective'),
    ('waiting for peers', '#e15759', lambda n, c: 'waiting for peers' in n),
    ('copy / combine', '#59a14f', lambda n, c: n == 'copy / combine'),
    ('cross-worker step', '#b07aa1', lambda n, c: n == 'cross-worker step'),
    ('agreement check (MPI)', '#f28e2b', lambda n, c: c == 'mpi' and 'agreement' in n),
    ('MPI collective', '#76b7b2', lambda n, c: c == 'mpi'),
]


def kind_of(e):
    for label, colour, test in KINDS:
        if test(e['name'], e.get('cat', '')):
            return label, colour
    return 'other', '#edc948'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('traces', nargs='+')
    ap.add_argument('-o', '--output', required=True)
    ap.add_argument('--from', dest='start', type=float, default=None)
    ap.add_argument('--to', dest='stop', type=float, default=None)
    ap.add_argument('--title', default='')
    args = ap.parse_args()

    events, names, processes = [], {}, {}
    for path in args.traces:
        with open(path) as f:
            doc = json.load(f)
        for e in doc['traceEvents']:
            if e['ph'] == 'M' and e['name'] == 'thread_name':
                names[(e['pid'], e['tid'])] = e['args']['name']
            elif e['ph'] == 'M' and e['name'] == 'process_name':
                processes[e['pid']] = e['args']['name']
            elif e['ph'] == 'X':
                events.append(e)
    if not events:
        sys.exit('timeline_png: no spans in ' + ', '.join(args.traces))
    origin = min(e['ts'] for e in events)
    lo = args.start if args.start is not None else 0.0
    hi = args.stop if args.stop is not None else (max(e['ts'] + e['dur'] for e in events) - origin) / 1000.0

    # Nesting depth of each span on its track (spans are written parents first, in time order).
    tracks = collections.defaultdict(list)
    for e in events:
        tracks[(e['pid'], e['tid'])].append(e)
    rows = sorted(tracks)
    fig, ax = plt.subplots(figsize=(13, 0.55 * len(rows) + 1.6))
    used = {}
    for row, key in enumerate(rows):
        stack = []
        depth_max = 1
        placed = []
        for e in sorted(tracks[key], key=lambda e: (e['ts'], -e['dur'])):
            while stack and e['ts'] >= stack[-1]['ts'] + stack[-1]['dur'] - 1e-3:
                stack.pop()
            placed.append((e, len(stack)))
            stack.append(e)
            depth_max = max(depth_max, len(stack))
        lane = 0.8 / depth_max
        for e, depth in placed:
            start = (e['ts'] - origin) / 1000.0
            end = start + e['dur'] / 1000.0
            if end < lo or start > hi:
                continue
            label, colour = kind_of(e)
            used[label] = colour
            y = len(rows) - 1 - row + 0.1 + (depth_max - 1 - depth) * lane
            ax.broken_barh([(max(start, lo), min(end, hi) - max(start, lo))], (y, lane * 0.95), facecolors=colour,
                           edgecolor='none')
    labels = []
    for key in rows:
        track = names.get(key, f'track {key[1]}')
        labels.append(f'{processes.get(key[0], "")}: {track}' if len(processes) > 1 else track)
    ax.set_yticks([len(rows) - 1 - i + 0.5 for i in range(len(rows))])
    ax.set_yticklabels(labels)
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, len(rows))
    ax.set_xlabel('milliseconds')
    if args.title:
        ax.set_title(args.title)
    order = [k[0] for k in KINDS] + ['other']
    ax.legend(handles=[Patch(color=used[k], label=k) for k in order if k in used], loc='upper center',
              bbox_to_anchor=(0.5, -0.18), ncol=4, frameon=False)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f'timeline_png: {len(events)} spans on {len(rows)} tracks -> {args.output}')


if __name__ == '__main__':
    main()
