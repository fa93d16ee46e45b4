#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The meson test of examples/fashion_mnist (suite 'examples').

  run_fashion_mnist.py FASHION_MNIST_BINARY DATA_DIR

1. With a data folder that does not exist, the trainer must fail (exit 1) with a message that
   names the missing file and the package to install.
2. When DATA_DIR lacks the data set, the test is SKIPPED (exit 77) with a loud message.
3. Otherwise a short run (1 epoch on 6000 training images, 2 replicas, the full test set) must
   exit 0 with the last line exactly "test_accuracy=0.xxxx", above chance; --optimizer
   replicated must reach the default sharded optimiser's accuracy within 0.01.
4. --device auto (with a policy every device accepts) learns exactly what step 3 learned on
   threads where there is no GPU; where there is one it trains the GPU model (cuBLAS: other
   roundings), whose test accuracy must be within 0.02 of step 3's. --device cuda trains where
   there is a GPU and otherwise fails with the device's error (exit 1; exit 2 in builds without
   CUDA).
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
    lines = train(cmd)
    if not re.fullmatch(r'epoch 1/1  loss \d+\.\d{4}  train_accuracy \d\.\d{4}  samples/s \d+', lines[-2]):
        fail(f'unexpected epoch line: {lines[-2]!r}')
    m = re.fullmatch(r'test_accuracy=(\d\.\d{4})', lines[-1])
    if not m:
        fail(f'the last line is not test_accuracy=0.xxxx: {lines[-1]!r}')
    accuracy = float(m.group(1))
    if accuracy < 0.70:  # chance is 0.10; one epoch on 6000 images gives about 0.78
        fail(f'test accuracy {accuracy} after one short epoch: the model does not learn')
    print(f'ok: test accuracy {accuracy}')

    # 3b. The replicated optimiser learns the same model as the default sharded one, up to
    # rounding (the same step on cuts instead of whole leaves); an unknown one is a usage error.
    if '(sharded)' not in lines[0]:
        fail(f'the first line does not name the sharded optimiser as the default: {lines[0]!r}')
    replicated = train(cmd + ['--optimizer', 'replicated'])
    m = re.fullmatch(r'test_accuracy=(\d\.\d{4})', replicated[-1])
    if not m or abs(float(m.group(1)) - accuracy) > 0.01:
        fail(f'--optimizer replicated: {replicated[-1]!r}, against {accuracy} with the sharded optimiser')
    r = subprocess.run(cmd + ['--optimizer', 'adam'], capture_output=True, text=True, timeout=60)
    if r.returncode != 2 or "unknown --optimizer 'adam'" not in r.stderr:
        fail(f'--optimizer adam: exit {r.returncode}, stderr {r.stderr!r}')
    print(f'ok: --optimizer replicated: {m.group(1)}')

    # 4. Device selection.
    auto = train(cmd + ['--device', 'auto', '--policy', 'reduction_to_one_device'])
    device = re.search(r'\((devices::\w+)', auto[0])
    if device is None:
        fail(f'the first line does not name the device: {auto[0]!r}')
    if device.group(1) == 'devices::Cuda':
        m = re.fullmatch(r'test_accuracy=(\d\.\d{4})', auto[-1])
        if not m or abs(float(m.group(1)) - accuracy) > 0.02:
            fail(f'--device auto (the GPU model) learned something else than step 3:\n{lines[-2:]}\n{auto[-2:]}')
        print(f'ok: --device auto ran the GPU model: test accuracy {m.group(1)} against {accuracy} on threads')
    elif not same_learning(lines, auto):
        fail(f'--device auto ({device.group(1)}) learned something else than step 3:\n{lines[-2:]}\n{auto[-2:]}')
    else:
        print(f'ok: --device auto ran on {device.group(1)} and learned the same')
    r = subprocess.run(cmd + ['--device', 'cuda', '--limit', '600'], capture_output=True, text=True, timeout=110)
    if r.returncode == 0:
        print('--device cuda: trained on the GPU')
    elif r.returncode == 1 and 'no usable CUDA device' in r.stderr:
        print(f'--device cuda without a GPU: exit 1, the device\'s error: ok\n  {r.stderr.strip()}')
    elif r.returncode == 2 and 'needs a build with CUDA' in r.stderr:
        print(f'--device cuda in a build without CUDA: exit 2: ok\n  {r.stderr.strip().splitlines()[0]}')
    else:
        fail(f'--device cuda: exit {r.returncode}\n{r.stdout}{r.stderr}')
    return 0


def train(cmd):
    """Runs the trainer; its stdout lines (exit 0 required)."""
    print('$', ' '.join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=110)
    sys.stdout.write(r.stdout)
    sys.stdout.write(r.stderr)
    if r.returncode != 0:
        fail(f'exit {r.returncode}')
    return r.stdout.rstrip('\n').split('\n')


def same_learning(a, b):
    """The same loss, train and test accuracy (the samples/s figure differs)."""
    def strip(lines):
        return [re.sub(r'  samples/s \d+', '', line) for line in lines[1:]]
    return strip(a) == strip(b)


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
