#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch peer of mirror's benchmarks: DistributedDataParallel with the gloo backend on CPU,
--replicas processes on this machine (torch.multiprocessing, rendezvous over TCP on localhost),
one intra-op thread per process (as mirror runs one BLAS thread per replica).

  torch_peer.py [--what all|micro|train] [--replicas 2] [--sizes 4096,1048576,67108864]
                [--repetitions 5] [--min-time 0.2] [--epochs 2] [--batch-size 128] [--lr 0.1]
                [--momentum 0.9] [--seed 1] [--data DIR] [--limit N] [--threads 1]

micro: (1) dist.all_reduce of one float (torch has no replica function to run: a step is the
call); (2) dist.all_reduce (in place) of each --sizes bytes of float32 per process. Rank 0's
clock, every timed block opened by a barrier.
train: the MLP 784-256-128-10 (ReLU, softmax cross-entropy, He-normal weights) under DDP;
torch.optim.SGD with momentum (v = m v + g; p -= lr v), the learning rate cosine-decayed per step;
every process draws the same shuffle each epoch and takes its 1/R of each global batch.
samples/s: rank 0's, over the epochs after the first. Test accuracy: the whole test set on rank 0.
Prints 'PEER {json}' lines (peer_common.py).
"""
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402


def extra(p):
    p.add_argument('--threads', type=int, default=1, help='torch intra-op threads per process')


def timed_all_reduce(dist, t):
    def timed(iters):
        dist.barrier()
        t0 = pc.now()
        for _ in range(iters):
            dist.all_reduce(t)
        dt = pc.now() - t0
        # Every rank takes rank 0's figure, so all agree on the next iteration count.
        import torch
        x = torch.tensor([dt], dtype=torch.float64)
        dist.broadcast(x, 0)
        return float(x[0])
    return timed


def micro(args, rank, dist, torch):
    label = dict(peer='torch', framework=f'torch {torch.__version__} gloo', replicas=args.replicas, label=args.label)
    t = torch.ones(1)
    timed = timed_all_reduce(dist, t)
    timed(100)  # warm-up
    iters = pc.calibrate(timed, args.min_time)
    secs = pc.repeat(timed, iters, args.repetitions)
    if rank == 0:
        pc.emit(measure='step', bytes=4, iterations=iters, seconds=secs, **label)
    for b in [int(s) for s in args.sizes.split(',') if s]:
        t = torch.ones(max(1, b // 4))
        timed = timed_all_reduce(dist, t)
        timed(2)
        iters = pc.calibrate(timed, args.min_time)
        secs = pc.repeat(timed, iters, args.repetitions)
        if rank == 0:
            pc.emit(measure='all_reduce', bytes=b, iterations=iters, seconds=secs, **label)


def train(args, rank, dist, torch):
    import numpy as np
    from torch import nn
    world = args.replicas
    x_train, y_train, x_test, y_test = pc.fashion_mnist(args, np)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    init = pc.he_normal(np, args.seed)
    with torch.no_grad():
        for i, layer in enumerate([model[0], model[2], model[4]]):
            layer.weight.copy_(torch.from_numpy(init[2 * i].T.copy()))
            layer.bias.copy_(torch.from_numpy(init[2 * i + 1]))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    n, batch = len(y_train), args.batch_size
    steps_per_epoch = (n + batch - 1) // batch
    total_steps = steps_per_epoch * args.epochs
    gen = torch.Generator().manual_seed(args.seed)
    step = 0
    seconds, samples = [], []
    for epoch in range(1, args.epochs + 1):
        dist.barrier()
        start = pc.now()
        order = torch.randperm(n, generator=gen)  # the same on every rank
        xs, ys = x_train[order], y_train[order]
        loss_sum = correct = 0.0
        for first in range(0, n, batch):
            g = min(batch, n - first)
            lo, hi = first + g * rank // world, first + g * (rank + 1) // world
            x, y = xs[lo:hi], ys[lo:hi]
            for group in opt.param_groups:
                group['lr'] = pc.cosine_lr(args, step, total_steps)
            step += 1
            opt.zero_grad(set_to_none=True)
            logits = ddp(x)
            loss = loss_fn(logits, y)  # the mean over this rank's rows; DDP averages over ranks
            loss.backward()
            opt.step()
            loss_sum += loss.item() * (hi - lo)
            correct += float((logits.argmax(1) == y).sum())
        dt = pc.now() - start
        seconds.append(dt)
        samples.append(n)
        if rank == 0:
            print(f'torch epoch {epoch}/{args.epochs}  loss {loss_sum / (n / world):.4f}  '
                  f'train_accuracy {correct / (n / world):.4f}  samples/s {n / dt:.0f}', flush=True)
    if rank == 0:
        with torch.no_grad():
            acc = float((model(torch.from_numpy(x_test)).argmax(1) == torch.from_numpy(y_test)).float().mean())
        pc.emit(peer='torch', measure='train', framework=f'torch {torch.__version__} gloo', replicas=world,
                epochs=args.epochs, batch_size=batch, samples_per_s=pc.train_summary(seconds, samples),
                epoch_samples_per_s=[s / t for s, t in zip(samples, seconds)], test_accuracy=acc, label=args.label)


def worker(rank, args, port):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(args.threads)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=args.replicas)
    try:
        if args.what in ('all', 'micro'):
            micro(args, rank, dist, torch)
        if args.what in ('all', 'train'):
            train(args, rank, dist, torch)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    args = pc.parse_args(__doc__.split('\n')[0], extra)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        sys.exit(f'torch_peer.py: SKIP: {e} (bench/peers.sh --setup installs it)')
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    print(f'torch_peer: torch {torch.__version__}, gloo, {args.replicas} processes x {args.threads} thread', flush=True)
    mp.start_processes(worker, args=(args, port), nprocs=args.replicas, start_method='fork')


if __name__ == '__main__':
    main()
