# SPDX-License-Identifier: Apache-2.0
"""What the peer scripts (tf_peer.py, torch_peer.py) share: the command line, the timing loop,
the Fashion-MNIST files and the JSON lines they print.

Every result is one JSON object on one line of stdout, prefixed with 'PEER ' so that the
frameworks' own chatter can share the stream:
  PEER {"peer": "torch", "measure": "all_reduce", "bytes": 4096, "seconds": [per-call, ...]}
  PEER {"peer": "torch", "measure": "train", "samples_per_s": 21000.0, "test_accuracy": 0.85, ...}
bench/peers/table.py reads them.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time


def parse_args(description, extra=None):
    p = argparse.ArgumentParser(description=description)
    p.add_argument('--what', default='all', choices=['all', 'micro', 'train'],
                   help='micro: the 1-float step and the all-reduces; train: the Fashion-MNIST MLP')
    p.add_argument('--replicas', type=int, default=2, help='replicas (threads or processes) in sync')
    p.add_argument('--sizes', default='4096,1048576,67108864', help='all-reduce bytes per replica')
    p.add_argument('--repetitions', type=int, default=5)
    p.add_argument('--min-time', type=float, default=0.2, help='seconds per repetition (at least)')
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--batch-size', type=int, default=128, help='global batch size')
    p.add_argument('--lr', type=float, default=0.1, help='initial learning rate, cosine-decayed to 0')
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--data', default='/usr/share/datasets/fashion-mnist')
    p.add_argument('--limit', type=int, default=0, help='train on the first N images only')
    p.add_argument('--label', default='', help='a tag copied into every result line')
    if extra is not None:
        extra(p)
    return p.parse_args()


def emit(**fields):
    print('PEER ' + json.dumps(fields), flush=True)


def calibrate(timed, min_time, agree=lambda n: n):
    """Iterations so that timed(iters) takes about min_time; `agree` makes every process use the
    same count (each passes its own, all get the same)."""
    iters = 1
    while True:
        dt = timed(iters)
        if dt >= min_time / 4 or iters > (1 << 24):
            return agree(max(1, int(iters * min_time / max(dt, 1e-9))))
        iters *= 8


def repeat(timed, iters, repetitions):
    """Seconds per call, one figure per repetition."""
    return [timed(iters) / iters for _ in range(repetitions)]


def load_idx(path, np):
    if not os.path.exists(path) and os.path.exists(path[:-3]):
        path = path[:-3]
    opener = gzip.open if path.endswith('.gz') else open
    try:
        with opener(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        sys.exit(f'{path}: {e}. Install the data set: apt-get install dataset-fashion-mnist')
    ndims = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndims).reshape(dims)


def fashion_mnist(args, np):
    """(x_train, y_train, x_test, y_test): pixels / 255 as float32 rows of 784, labels int64."""
    d = args.data
    x_train = load_idx(os.path.join(d, 'train-images-idx3-ubyte.gz'), np).reshape(-1, 784).astype(np.float32) / 255
    y_train = load_idx(os.path.join(d, 'train-labels-idx1-ubyte.gz'), np).astype(np.int64)
    x_test = load_idx(os.path.join(d, 't10k-images-idx3-ubyte.gz'), np).reshape(-1, 784).astype(np.float32) / 255
    y_test = load_idx(os.path.join(d, 't10k-labels-idx1-ubyte.gz'), np).astype(np.int64)
    if args.limit > 0:
        x_train, y_train = x_train[:args.limit], y_train[:args.limit]
    return x_train, y_train, x_test, y_test


def he_normal(np, seed):
    """The MLP 784-256-128-10's initial parameters: He-normal weights, zero biases (as
    examples/fashion_mnist and bench/fashion_mnist_numpy.py)."""
    rng = np.random.default_rng(seed)
    sizes = [784, 256, 128, 10]
    params = []
    for i in range(3):
        params.append((rng.standard_normal((sizes[i], sizes[i + 1])) * math.sqrt(2 / sizes[i])).astype(np.float32))
        params.append(np.zeros(sizes[i + 1], np.float32))
    return params


def cosine_lr(args, step, total_steps):
    return args.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))


def train_summary(epoch_seconds, epoch_samples):
    """Samples/s over every epoch but the first (the warm-up: tracing, first touches); over all
    of them when there is only one."""
    s, n = (epoch_seconds[1:], epoch_samples[1:]) if len(epoch_seconds) > 1 else (epoch_seconds, epoch_samples)
    return sum(n) / sum(s)


now = time.perf_counter
