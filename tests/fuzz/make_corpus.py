#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/), from the formats
as documented (mirror/checkpoint.hpp, examples/fashion_mnist/idx.hpp), not from mirror's code:

  tests/fuzz/make_corpus.py [OUT_DIR]     (default: tests/fuzz/corpus beside this file)

restore: for each variable set of restore_fuzz.cpp, a valid version-2 checkpoint (as is, and
marked to have its CRC recomputed after mutation), a version-1 one, and a few broken ones.
idx: IDX files of 1-3 dimensions, one gzip-compressed, and broken headers.
split: a few choices of W, w, R, leaf shape, columns, steps and batch sizes.
"""
import gzip
import os
import struct
import sys
import zlib

FLOAT, SIGNED, UNSIGNED = 0, 1, 2


def kind(cat, size):
    return cat << 8 | size


def leaf(cat, size, fmt, values):
    return struct.pack('<QQ', kind(cat, size), len(values)) + b''.join(struct.pack('<' + fmt, v) for v in values)


def v2(variables, payload):
    header = b'MIRRORC2' + struct.pack('<IIQQ', 2, 0, len(payload), variables)
    body = header + payload
    return body + struct.pack('<I', zlib.crc32(body) & 0xffffffff)


def v1(variables, payload):
    return b'MIRRORC1' + struct.pack('<Q', variables) + payload


# The variable sets of restore_fuzz.cpp: (number of variables, payload of some values).
SETS = [
    (1, leaf(FLOAT, 4, 'f', [1.5, -2.0, 0.25, 3.0, 1e-3])),
    (2, leaf(FLOAT, 8, 'd', [0.5, -7.0]) + leaf(SIGNED, 4, 'i', [42]) + leaf(SIGNED, 2, 'h', [1, -2, 3]) +
        leaf(UNSIGNED, 1, 'B', [9, 8, 7, 6])),
    (3, leaf(FLOAT, 4, 'f', [2.5]) + leaf(UNSIGNED, 8, 'Q', []) + leaf(SIGNED, 8, 'q', [-123456789])),
    (1, leaf(FLOAT, 8, 'd', [3.25]) + leaf(SIGNED, 1, 'b', [-1, 0, 1])),
]


def restore_seeds():
    seeds = {}
    for s, (n, payload) in enumerate(SETS):
        choice = s << 1
        seeds[f'set{s}_v2'] = bytes([choice]) + v2(n, payload)
        seeds[f'set{s}_v2_fixcrc'] = bytes([choice | 1]) + v2(n, payload)
        seeds[f'set{s}_v1'] = bytes([choice]) + v1(n, payload)
        seeds[f'set{s}_v2_truncated'] = bytes([choice | 1]) + v2(n, payload)[:-9]
    seeds['not_a_checkpoint'] = b'\x00not a checkpoint'
    seeds['v3'] = bytes([1]) + b'MIRRORC3' + struct.pack('<IIQQ', 3, 0, 0, 0) + b'\0\0\0\0'
    return seeds


def idx(dims, data):
    return bytes([0, 0, 8, len(dims)]) + b''.join(struct.pack('>I', d) for d in dims) + bytes(data)


def idx_seeds():
    return {
        'one_dim': idx([5], range(5)),
        'images': idx([2, 3, 3], range(18)),
        'labels_gz': gzip.compress(idx([10], [i % 10 for i in range(10)])),
        'empty_dim': idx([0, 28], []),
        'bad_type': bytes([0, 0, 0x0d, 1]) + struct.pack('>I', 1) + b'\0\0\0\0',
        'truncated': idx([4, 4], range(16))[:-3],
    }


def split_seeds():
    # W-1, w, R-1, shape, cols, steps-1, ragged, then per step: (0, G) or (k, G small)
    def seed(W, w, R, shape, cols, ragged, batches):
        out = [W - 1, w, R - 1, shape, cols, len(batches) - 1, 1 if ragged else 0]
        for small, g in batches:
            out += [1, g] if small else [0, g]
        return bytes(out)
    return {
        'one_worker': seed(1, 0, 3, 0, 1, False, [(True, 7), (True, 4)]),
        'two_workers_matrix': seed(2, 1, 2, 1, 3, False, [(False, 10), (True, 5)]),
        'tuple_ragged_end': seed(3, 2, 4, 2, 2, False, [(False, 25), (True, 0)]),
        'partial_row': seed(2, 0, 2, 1, 3, True, [(False, 4)]),
        'no_columns': seed(1, 0, 2, 2, 0, False, [(True, 3)]),
    }


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
    for target, seeds in (('restore', restore_seeds()), ('idx', idx_seeds()), ('split', split_seeds())):
        folder = os.path.join(out, target)
        os.makedirs(folder, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(folder, name), 'wb') as f:
                f.write(data)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
