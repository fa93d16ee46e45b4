#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Fashion-MNIST trainer goes on after a worker dies (--elastic, suite 'elastic' of build-ft):
run_fashion_mnist_elastic.py BINARY DATA_DIR RUN_MPI

Under Open MPI 5 with --with-ft ulfm (run_mpi.sh with MIRROR_MPIRUN and MIRROR_MPI_ARGS from the
test's environment), 3 workers x 1 replica train 1 epoch on 12000 images with the replicated
optimiser, committing every 5 steps; the last worker kills itself at step 20 of 47. The
survivors must say which worker died, resume from step 20 on 2 workers, and end with a test
accuracy within 0.02 of the same training without a loss (the same global batches, split over
fewer replicas after the loss). Exit 77 (skipped, loudly) without the data set or mpirun.
"""
import os
import re
import subprocess
import sys

from run_fashion_mnist_cluster import FILES, skip  # the same data files, the same loud skip


def run(cmd):
    print('$', ' '.join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    sys.stdout.write(r.stdout[-3000:])
    sys.stdout.write(r.stderr[-2000:])
    if r.returncode == 77:
        skip('mpirun is missing')
    if r.returncode != 0:
        print(f'FAIL: exit {r.returncode}')
        sys.exit(1)
    accuracy = re.findall(r'^test_accuracy=(\d\.\d{4})$', r.stdout, re.MULTILINE)
    if len(accuracy) != 1:
        print('FAIL: expected one test_accuracy line (from the chief)')
        sys.exit(1)
    return r.stdout, float(accuracy[0])


def main():
    binary, data, run_mpi = sys.argv[1:4]
    if not all(os.path.exists(os.path.join(data, f + '.gz')) or os.path.exists(os.path.join(data, f)) for f in FILES):
        skip(f'the Fashion-MNIST data set is not in {data} (apt-get install dataset-fashion-mnist)')
    common = ['bash', run_mpi, '3', binary, '--data', data, '--device', 'cluster', '--replicas', '1', '--optimizer',
              'replicated', '--epochs', '1', '--limit', '12000', '--elastic', '1', '--commit-every', '5']
    _, clean = run(common)
    out, lost = run(common + ['--kill-at-step', '20'])
    problems = []
    if 'worker 2: killing itself (SIGKILL) at step 20' not in out:
        problems.append('worker 2 did not say it killed itself at step 20')
    if not re.search(r'mirror: worker 2 \(global replica \{2\}\) of 3 died', out):
        problems.append("no survivor named worker 2 as dead")
    if 'resuming at step 20 on 2 workers (2 replicas)' not in out:
        problems.append('the survivors did not resume at step 20 on 2 workers')
    if abs(lost - clean) > 0.02:
        problems.append(f'test accuracy {lost:.4f} after the loss, {clean:.4f} without: more than 0.02 apart')
    if problems:
        print('FAIL: ' + '; '.join(problems))
        return 1
    print(f'ok: test accuracy {lost:.4f} after losing worker 2 at step 20, {clean:.4f} without a loss')
    return 0


if __name__ == '__main__':
    sys.exit(main())
