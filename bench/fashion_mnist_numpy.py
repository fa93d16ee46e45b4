#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Baseline for examples/fashion_mnist: the same training in one process with numpy + OpenBLAS.

Same model (MLP 784-256-128-10, ReLU, softmax cross-entropy, He-normal initialisation), same
optimiser (SGD, momentum 0.9, PyTorch's form v = 0.9 v + g; p -= lr v, learning rate 0.1 with a
per-step cosine decay to 0), same data handling (pixels / 255, a fresh shuffle every epoch, global
batches of --batch-size, a ragged last batch), and the same output as the C++ trainer: one line
per epoch with "samples/s" (training time only, shuffling included) and, last,
"test_accuracy=0.xxxx".

  bench/fashion_mnist_numpy.py [--epochs 10] [--batch-size 256] [--lr 0.1] [--seed 1]
                               [--data /usr/share/datasets/fashion-mnist] [--limit N]
                               [--blas-threads N]

The matrix products run in OpenBLAS with its default thread count (one per core) unless
--blas-threads is given. Needs Debian's python3-numpy and libopenblas0-pthread; when numpy is
missing the script installs them with apt-get (as root, or through sudo) and restarts.
"""
import argparse
import gzip
import math
import os
import shutil
import subprocess
import sys
import time

PACKAGES = ['python3-numpy', 'libopenblas0-pthread']


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=10)
    p.add_argument('--batch-size', type=int, default=256)
    p.add_argument('--lr', type=float, default=0.1)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--data', default='/usr/share/datasets/fashion-mnist')
    p.add_argument('--limit', type=int, default=0, help='train on the first N images only')
    p.add_argument('--blas-threads', type=int, default=0,
                   help='OpenBLAS threads (default: OpenBLAS decides, one per core)')
    return p.parse_args()


def ensure_numpy():
    """Imports numpy; when it is missing, installs Debian's numpy + OpenBLAS and restarts."""
    try:
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    # Debian's numpy lives in /usr/bin/python3's path; another python3 (pyenv, venv) lacks it.
    system_python = '/usr/bin/python3'
    if os.path.realpath(sys.executable) != os.path.realpath(system_python) and os.path.exists(system_python):
        if subprocess.run([system_python, '-c', 'import numpy'], capture_output=True).returncode == 0:
            os.execv(system_python, [system_python] + sys.argv)
    if os.environ.get('FASHION_MNIST_NUMPY_INSTALLED') or not shutil.which('apt-get'):
        sys.exit('fashion_mnist_numpy.py: numpy not found; install it: apt-get install ' + ' '.join(PACKAGES))
    sudo = [] if os.geteuid() == 0 else ['sudo']
    print('fashion_mnist_numpy.py: installing ' + ' '.join(PACKAGES), file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    subprocess.run(sudo + ['apt-get', 'install', '-y', '-qq', '--no-install-recommends'] + PACKAGES,
                   check=True, env=env)
    os.environ['FASHION_MNIST_NUMPY_INSTALLED'] = '1'
    python = system_python if os.path.exists(system_python) else sys.executable
    os.execv(python, [python] + sys.argv)


def blas_library():
    """The BLAS shared library this process has loaded (after a numpy product)."""
    try:
        with open('/proc/self/maps') as f:
            libs = {line.split()[-1] for line in f if 'blas' in line.lower() and '.so' in line}
        return ', '.join(sorted(libs)) or 'unknown'
    except OSError:
        return 'unknown'


def load_idx(path, np):
    if not os.path.exists(path) and os.path.exists(path[:-3]):
        path = path[:-3]
    try:
        opener = gzip.open if path.endswith('.gz') else open
        with opener(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        sys.exit(f'fashion_mnist_numpy.py: {path}: {e}. Install the data set: apt-get install dataset-fashion-mnist')
    ndims = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndims).reshape(dims)


def main():
    args = parse_args()
    if args.blas_threads > 0:  # read by OpenBLAS when it loads, so before numpy is imported
        os.environ['OPENBLAS_NUM_THREADS'] = str(args.blas_threads)
    ensure_numpy()
    import numpy as np

    d = args.data
    x_train = load_idx(os.path.join(d, 'train-images-idx3-ubyte.gz'), np).reshape(-1, 784).astype(np.float32) / 255
    y_train = load_idx(os.path.join(d, 'train-labels-idx1-ubyte.gz'), np).astype(np.int64)
    x_test = load_idx(os.path.join(d, 't10k-images-idx3-ubyte.gz'), np).reshape(-1, 784).astype(np.float32) / 255
    y_test = load_idx(os.path.join(d, 't10k-labels-idx1-ubyte.gz'), np).astype(np.int64)
    if args.limit > 0:
        x_train, y_train = x_train[:args.limit], y_train[:args.limit]
    n, batch = len(x_train), args.batch_size

    rng = np.random.default_rng(args.seed)
    sizes = [784, 256, 128, 10]
    params = []
    for i in range(3):
        params.append((rng.standard_normal((sizes[i], sizes[i + 1])) * math.sqrt(2 / sizes[i])).astype(np.float32))
        params.append(np.zeros(sizes[i + 1], np.float32))
    velocity = [np.zeros_like(p) for p in params]
    w1, b1, w2, b2, w3, b3 = params

    def forward(x):
        a1 = np.maximum(x @ w1 + b1, 0)
        a2 = np.maximum(a1 @ w2 + b2, 0)
        return a1, a2, a2 @ w3 + b3

    threads = os.environ.get('OPENBLAS_NUM_THREADS', 'default')
    forward(x_test[:2])
    print(f'fashion_mnist_numpy: {n} training and {len(x_test)} test images from {d}; MLP 784-256-128-10, '
          f'SGD momentum 0.9, lr {args.lr:g} (cosine), batch {batch}; numpy {np.__version__}, '
          f'BLAS {blas_library()} (threads: {threads})', flush=True)

    steps_per_epoch = (n + batch - 1) // batch
    total_steps = steps_per_epoch * args.epochs
    step = 0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = rng.permutation(n)
        xs, ys = x_train[order], y_train[order]
        loss_sum = correct_sum = 0.0
        for first in range(0, n, batch):
            x, y = xs[first:first + batch], ys[first:first + batch]
            g = len(y)
            lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            step += 1
            a1, a2, z = forward(x)
            z -= z.max(axis=1, keepdims=True)
            e = np.exp(z)
            s = e.sum(axis=1, keepdims=True)
            rows = np.arange(g)
            loss_sum += float((np.log(s[:, 0]) - z[rows, y]).sum())
            correct_sum += float((z.argmax(axis=1) == y).sum())
            d3 = e / s
            d3[rows, y] -= 1
            d3 /= g
            grads = [None] * 6
            grads[4] = a2.T @ d3
            grads[5] = d3.sum(axis=0)
            d2 = (d3 @ w3.T) * (a2 > 0)
            grads[2] = a1.T @ d2
            grads[3] = d2.sum(axis=0)
            d1 = (d2 @ w2.T) * (a1 > 0)
            grads[0] = x.T @ d1
            grads[1] = d1.sum(axis=0)
            for p, v, gr in zip(params, velocity, grads):
                v *= 0.9
                v += gr
                p -= lr * v
        seconds = time.perf_counter() - start
        print(f'epoch {epoch}/{args.epochs}  loss {loss_sum / n:.4f}  train_accuracy {correct_sum / n:.4f}  '
              f'samples/s {n / seconds:.0f}', flush=True)

    accuracy = float((forward(x_test)[2].argmax(axis=1) == y_test).mean())
    print(f'test_accuracy={accuracy:.4f}')


if __name__ == '__main__':
    main()
