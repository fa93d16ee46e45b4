#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The meson test of examples/fashion_mnist (suite 'examples').

  run_fashion_mnist.py FASHION_MNIST_BINARY DATA_DIR

1. With a data folder that does not exist, the trainer must fail (exit 1) with a message that
   names the missing file and the package to install.
2. When DATA_DIR lacks the data set, the test is SKIPPED (exit 77) with a loud message.
3. Otherwise a short run (1 epoch on 6000 training images, 2 replicas, the full test set) must
   exit 0 with the last line exactly "test_accuracy=0.xxxx", above chance.
"""
import os
import re
import subprocess
import sys
import tempfile

FILES = ['train-images-idx3-ubyte', 'train-labels-idx1-ubyte',
         't10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte']


def fail(msg):
    print(f'FAIL: {msg}', flush=True)
    sys.exit(1)


def main(binary, data_dir):
    # 1. The error for missing data.
    with tempfile.TemporaryDirectory() as empty:
        missing = os.path.join(empty, 'nowhere')
        r = subprocess.run([binary, '--data', missing, '--epochs', '1'],
                           capture_output=True, text=True, timeout=60)
        expected_file = os.path.join(missing, 'train-images-idx3-ubyte.gz')
        if r.returncode != 1:
            fail(f'with --data {missing}: exit {r.returncode}, expected 1\n{r.stdout}{r.stderr}')
        for needle in (expected_file, 'apt-get install dataset-fashion-mnist'):
            if needle not in r.stderr:
                fail(f'the error for missing data does not mention {needle!r}:\n{r.stderr}')
        print(f'missing data: exit 1, message names the file and the package: ok\n  {r.stderr.strip()}')

    # 2. Skip loudly without the data set.
    absent = [f for f in FILES
              if not any(os.path.exists(os.path.join(data_dir, f + ext)) for ext in ('.gz', ''))]
    if absent:
        banner = '!' * 78
        print(f'{banner}\nSKIPPED: the Fashion-MNIST data set is not installed in {data_dir} '
              f'(missing: {", ".join(absent)}).\nInstall it with: apt-get install dataset-fashion-mnist '
              f'(./dev.sh installs it).\n{banner}', flush=True)
        sys.exit(77)

    # 3. A short training run.
    cmd = [binary, '--data', data_dir, '--epochs', '1', '--limit', '6000', '--replicas', '2',
           '--batch-size', '64']
    print('$', ' '.join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=110)
    sys.stdout.write(r.stdout)
    sys.stdout.write(r.stderr)
    if r.returncode != 0:
        fail(f'exit {r.returncode}')
    lines = r.stdout.rstrip('\n').split('\n')
    if not re.fullmatch(r'epoch 1/1  loss \d+\.\d{4}  train_accuracy \d\.\d{4}  samples/s \d+', lines[-2]):
        fail(f'unexpected epoch line: {lines[-2]!r}')
    m = re.fullmatch(r'test_accuracy=(\d\.\d{4})', lines[-1])
    if not m:
        fail(f'the last line is not test_accuracy=0.xxxx: {lines[-1]!r}')
    accuracy = float(m.group(1))
    if accuracy < 0.70:  # chance is 0.10; one epoch on 6000 images gives about 0.78
        fail(f'test accuracy {accuracy} after one short epoch: the model does not learn')
    print(f'ok: test accuracy {accuracy}')
    return 0


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
