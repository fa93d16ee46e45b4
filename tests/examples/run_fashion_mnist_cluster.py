#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Fashion-MNIST trainer on two MPI workers learns what one process with the same global
replica count learns (issue 6): run_fashion_mnist_cluster.py BINARY DATA_DIR RUN_MPI

Runs a short training (1 epoch, 6000 images) twice: one process with --replicas 2, and
`run_mpi.sh 2 BINARY --device cluster --replicas 1` (devices::Cluster<Threads>, 2 workers x 1).
Their epoch line (loss, train accuracy) and test accuracy must be equal: the gradient sum is
g0 + g1 in both, and every other step is the same arithmetic. Then --overlap (gradient buckets
started during backward) on one process and on two workers: with the sharded optimizer (buckets
reduce-scattered) the lines of the runs without it, and with the replicated optimizer (buckets
all-reduced) four equal lines, since a bucket's collective gives each element the bits the fused
one does. Exit 77 (skipped, loudly) without the data set or without mpirun.
"""
import os
import re
import shutil
import subprocess
import sys

FILES = ['train-images-idx3-ubyte', 'train-labels-idx1-ubyte', 't10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte']


def skip(why):
    banner = '!' * 78
    print(f'{banner}\nSKIPPED: {why}\n{banner}', flush=True)
    sys.exit(77)


def run(cmd):
    print('$', ' '.join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=140)
    sys.stdout.write(r.stdout[-2000:])
    sys.stdout.write(r.stderr[-2000:])
    if r.returncode == 77:
        skip('mpirun is missing (apt-get install openmpi-bin)')
    if r.returncode != 0:
        print(f'FAIL: exit {r.returncode}')
        sys.exit(1)
    epoch = re.findall(r'epoch 1/1  loss (\d+\.\d{4})  train_accuracy (\d\.\d{4})  samples/s', r.stdout)
    test = re.findall(r'^test_accuracy=(\d\.\d{4})$', r.stdout, re.M)
    if len(epoch) != 1 or len(test) != 1:
        print(f'FAIL: expected one epoch line and one test_accuracy line (from the chief only), got {epoch}, {test}')
        sys.exit(1)
    return epoch[0], test[0]


def main(binary, data_dir, run_mpi):
    if any(not any(os.path.exists(os.path.join(data_dir, f + e)) for e in ('.gz', '')) for f in FILES):
        skip(f'the Fashion-MNIST data set is not installed in {data_dir} (apt-get install dataset-fashion-mnist)')
    if shutil.which('mpirun') is None:
        skip('mpirun is missing (apt-get install openmpi-bin)')
    common = ['--data', data_dir, '--epochs', '1', '--limit', '6000', '--batch-size', '64']
    one = run([binary, '--replicas', '2'] + common)
    two = run(['sh', run_mpi, '2', binary, '--device', 'cluster', '--replicas', '1'] + common)
    print(f'one process x 2 replicas: loss, train accuracy {one[0]}, test accuracy {one[1]}')
    print(f'two workers x 1 replica:  loss, train accuracy {two[0]}, test accuracy {two[1]}')
    if one != two:
        print('FAIL: the two-worker run learned something else')
        return 1
    if float(two[1]) < 0.70:
        print(f'FAIL: test accuracy {two[1]}: the model does not learn')
        return 1
    # The sharded optimizer with its gradient reduce-scattered in buckets during backward
    # learns the same as without them.
    sharded = {
        'one process, sharded, --overlap 0.25': run([binary, '--replicas', '2', '--overlap', '0.25'] + common),
        'two workers, sharded, --overlap 0': run(['sh', run_mpi, '2', binary, '--device', 'cluster', '--replicas', '1',
                                                  '--overlap', '0'] + common),
    }
    for name, r in sharded.items():
        print(f'{name}: loss, train accuracy {r[0]}, test accuracy {r[1]}')
    if any(r != one for r in sharded.values()):
        print('FAIL: --overlap changed what the sharded optimizer learns')
        return 1
    replicated = common + ['--optimizer', 'replicated']
    runs = {
        'one process, replicated': run([binary, '--replicas', '2'] + replicated),
        'one process, replicated, --overlap 0.25': run([binary, '--replicas', '2', '--overlap', '0.25'] + replicated),
        'two workers, replicated': run(['sh', run_mpi, '2', binary, '--device', 'cluster', '--replicas', '1'] + replicated),
        'two workers, replicated, --overlap 0': run(['sh', run_mpi, '2', binary, '--device', 'cluster', '--replicas',
                                                     '1', '--overlap', '0'] + replicated),
    }
    for name, r in runs.items():
        print(f'{name}: loss, train accuracy {r[0]}, test accuracy {r[1]}')
    if len(set(runs.values())) != 1:
        print('FAIL: --overlap changed what the replicated optimizer learns')
        return 1
    print('ok: equal')
    return 0


if __name__ == '__main__':
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
