#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Peer for examples/fashion_mnist --device cuda: the same training in PyTorch on one GPU.

Same model (MLP 784-256-128-10, ReLU, softmax cross-entropy, He-normal weights, zero biases),
optimiser (torch.optim.SGD, momentum 0.9: v = 0.9 v + g; p -= lr v; lr 0.1 with a per-step
cosine decay to 0), data handling (pixels / 255, a fresh shuffle each epoch, batches of
--batch-size, a ragged last one) and output lines as the C++ trainer ("samples/s" per epoch,
training time only, shuffle included; "test_accuracy=0.xxxx" last). The whole data set sits in
device memory, as in mirror's GPU trainer, so the figure is the training loop's own.

  bench/fashion_mnist_torch.py [--epochs 10] [--batch-size 256] [--lr 0.1] [--seed 1]
                               [--data /usr/share/datasets/fashion-mnist] [--device cuda|cpu]

Run by the GPU kit (tools/gpu_kit/run.sh) when its python3 has torch; exits 77 without torch or,
with --device cuda, without a GPU.
"""
import argparse
import gzip
import math
import os
import sys
import time


def load_idx(path):
    if not os.path.exists(path) and os.path.exists(path[:-3]):
        path = path[:-3]
    with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
        data = f.read()
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(data[3])]
    return bytearray(data[4 + 4 * len(dims):]), dims


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=10)
    p.add_argument('--batch-size', type=int, default=256)
    p.add_argument('--lr', type=float, default=0.1)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--data', default='/usr/share/datasets/fashion-mnist')
    p.add_argument('--device', default='cuda')
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print('SKIP: fashion_mnist_torch.py: python3 has no torch')
        sys.exit(77)
    if args.device == 'cuda' and not torch.cuda.is_available():
        print('SKIP: fashion_mnist_torch.py: torch sees no CUDA device')
        sys.exit(77)
    dev = torch.device(args.device)

    def tensor(name, images):
        raw, dims = load_idx(os.path.join(args.data, name))
        t = torch.frombuffer(raw, dtype=torch.uint8).to(dev)
        return t.reshape(-1, 784).float() / 255 if images else t.long()

    x_train, y_train = tensor('train-images-idx3-ubyte.gz', True), tensor('train-labels-idx1-ubyte.gz', False)
    x_test, y_test = tensor('t10k-images-idx3-ubyte.gz', True), tensor('t10k-labels-idx1-ubyte.gz', False)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(dev)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity='relu')
            torch.nn.init.zeros_(m.bias)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    n, batch = len(y_train), args.batch_size
    total_steps = (n + batch - 1) // batch * args.epochs
    name = torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'
    print(f'fashion_mnist_torch: torch {torch.__version__} on {name}; {n} training images; MLP 784-256-128-10, '
          f'SGD momentum 0.9, lr {args.lr:g} (cosine), batch {batch}', flush=True)

    def sync():
        if dev.type == 'cuda':
            torch.cuda.synchronize(dev)

    step = 0
    for epoch in range(1, args.epochs + 1):
        sync()
        start = time.perf_counter()
        order = torch.randperm(n, device=dev)
        loss_sum = torch.zeros((), device=dev)
        for first in range(0, n, batch):
            idx = order[first:first + batch]
            for group in opt.param_groups:
                group['lr'] = args.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            step += 1
            loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach() * len(idx)
        sync()
        seconds = time.perf_counter() - start
        print(f'epoch {epoch}/{args.epochs}  loss {float(loss_sum) / n:.4f}  samples/s {n / seconds:.0f}', flush=True)
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(dim=1) == y_test).float().mean())
    print(f'test_accuracy={accuracy:.4f}')


if __name__ == '__main__':
    main()
