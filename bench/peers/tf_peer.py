#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""TensorFlow peer of mirror's benchmarks: tf.distribute.MirroredStrategy on --replicas logical
CPU devices of one process, or (--workers W) MultiWorkerMirroredStrategy on W processes on
localhost (TF_CONFIG; this script starts the workers), one replica each.

  tf_peer.py [--workers 0] [--what all|micro|train] [--replicas 2] [--sizes 4096,1048576,67108864]
             [--repetitions 5] [--min-time 0.2] [--epochs 2] [--batch-size 128] [--lr 0.1]
             [--momentum 0.9] [--seed 1] [--data DIR] [--limit N] [--threads 0]

micro: (1) a step: a tf.function calling strategy.run(fn) where fn all-reduces one float in
replica context (ctx.all_reduce(SUM, 1.0)); (2) the same with fn all-reducing its replica's
float32 tensor of each --sizes bytes. TF's collectives return a new tensor (there is no in-place
all-reduce), and every call goes through the tf.function: the figure is what a user's call
costs. On CPU devices both strategies all-reduce with TF's collective ops (CommunicationImplementation.RING).
Timed on worker 0's clock; each timed block opens with a collective (a barrier).
train: the MLP 784-256-128-10 (ReLU, softmax cross-entropy, He-normal weights) as tf.Variables
under the strategy; a tf.function step: strategy.run(fn), fn computes the gradients of its rows
with a GradientTape, all-reduces them (SUM; the loss is divided by the global batch) and applies
SGD with momentum in PyTorch's form (v = m v + g; p -= lr v) through merge_call and
strategy.extended.update, the learning rate cosine-decayed per step (a tensor argument).
Input (--input): numpy by default, every worker drawing the same shuffle each epoch and each
replica's rows of each global batch fed through experimental_distribute_values_from_function
(as torch_peer.py and mirror's trainer take theirs); tf.data (shuffle, batch of the global size,
experimental_distribute_dataset) cost more than the step itself on this machine. samples/s: over the epochs after the first (the first traces).
Prints 'PEER {json}' lines (peer_common.py).
"""
import json
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402


def extra(p):
    p.add_argument('--workers', type=int, default=0,
                   help='0: MirroredStrategy in one process; W: MultiWorkerMirroredStrategy on W processes')
    p.add_argument('--worker-index', type=int, default=-1, help=argparse_hidden())
    p.add_argument('--input', default='numpy', choices=['numpy', 'tf.data'],
                   help='numpy: each epoch shuffled in numpy, each replica\'s rows fed through '
                        'experimental_distribute_values_from_function (the faster here); tf.data: '
                        'shuffle and batch in tf.data, through experimental_distribute_dataset')
    p.add_argument('--threads', type=int, default=-1,
                   help='TF intra-op threads per process (default: TF decides with --workers 0, 1 otherwise)')


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


def make_strategy(args, tf):
    threads = args.threads if args.threads >= 0 else (0 if args.workers == 0 else 1)
    if threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    if args.workers == 0:
        cpu = tf.config.list_physical_devices('CPU')[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
        strategy = tf.distribute.MirroredStrategy([f'/cpu:{i}' for i in range(args.replicas)])
        name = f'MirroredStrategy, {args.replicas} CPU logical devices'
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        name = f'MultiWorkerMirroredStrategy, {args.workers} workers x 1 replica'
    return strategy, name, threads


def micro(args, tf, strategy, label, chief):
    SUM = tf.distribute.ReduceOp.SUM

    @tf.function
    def mean_all(x):
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, tf.identity(x)))

    def agree(n):  # every worker takes the mean over the replicas (and it is a barrier)
        return int(strategy.experimental_local_results(mean_all(tf.constant(float(n), tf.float64)))[0].numpy())

    def timer(call):
        def timed(iters):
            agree(0)
            t0 = pc.now()
            for _ in range(iters):
                out = call()
            for t in strategy.experimental_local_results(out):
                t.numpy()  # the last call's results are there (ops run in order)
            return agree(int((pc.now() - t0) * 1e9)) / 1e9
        return timed

    @tf.function
    def step():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(SUM, tf.constant(1.0)))

    timed = timer(step)
    timed(20)
    iters = pc.calibrate(timed, args.min_time, agree)
    secs = pc.repeat(timed, iters, args.repetitions)
    if chief:
        pc.emit(measure='step', bytes=4, iterations=iters, seconds=secs, **label)

    @tf.function
    def all_reduce(v):
        return strategy.run(lambda x: tf.distribute.get_replica_context().all_reduce(SUM, tf.identity(x)), args=(v,))

    for b in [int(s) for s in args.sizes.split(',') if s]:
        n = max(1, b // 4)
        values = strategy.experimental_distribute_values_from_function(lambda ctx: tf.ones([n], tf.float32))
        timed = timer(lambda: all_reduce(values))
        timed(2)
        iters = pc.calibrate(timed, args.min_time, agree)
        secs = pc.repeat(timed, iters, args.repetitions)
        if chief:
            pc.emit(measure='all_reduce', bytes=b, iterations=iters, seconds=secs, **label)


def train(args, tf, strategy, label, chief):
    import numpy as np
    x_train, y_train, x_test, y_test = pc.fashion_mnist(args, np)
    n, batch = len(y_train), args.batch_size
    with strategy.scope():
        params = [tf.Variable(p) for p in pc.he_normal(np, args.seed)]
        velocity = [tf.Variable(tf.zeros_like(p)) for p in params]

    def forward(x):
        w1, b1, w2, b2, w3, b3 = params
        a1 = tf.nn.relu(x @ w1 + b1)
        a2 = tf.nn.relu(a1 @ w2 + b2)
        return a2 @ w3 + b3

    momentum = args.momentum

    def apply(v, g, vel, lr):  # on each device's copy (strategy.extended.update)
        vel.assign(momentum * vel + g)
        return v.assign_sub(lr * vel)

    def replica_step(x, y, lr, global_rows):
        with tf.GradientTape() as tape:
            logits = forward(x)
            per_row = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            loss = tf.reduce_sum(per_row) / global_rows
        grads = tape.gradient(loss, params)
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)

        def update(strategy, grads):
            for p, g, vel in zip(params, grads, velocity):
                strategy.extended.update(p, apply, args=(g, vel, lr))
        ctx.merge_call(update, args=(grads,))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int64), y), tf.float32))
        return tf.reduce_sum(per_row), correct

    @tf.function
    def train_step(xy, lr, global_rows):
        return strategy.run(replica_step, args=(xy[0], xy[1], lr, global_rows))

    def batches():  # this epoch's global batches, each replica's share as a tensor
        order = rng.permutation(n)
        xs, ys = x_train[order], y_train[order]
        for first in range(0, n, batch):
            g = min(batch, n - first)

            def share(ctx, first=first, g=g):
                r, R = ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync
                lo, hi = first + g * r // R, first + g * (r + 1) // R
                return tf.constant(xs[lo:hi]), tf.constant(ys[lo:hi])
            yield g, strategy.experimental_distribute_values_from_function(share)

    if args.input == 'tf.data':
        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(n, seed=args.seed,
                                                                           reshuffle_each_iteration=True)
        dist_ds = strategy.experimental_distribute_dataset(ds.batch(batch).prefetch(2))

        def batches():  # noqa: F811
            for k, xy in enumerate(dist_ds):
                yield min(batch, n - k * batch), xy
    rng = np.random.default_rng(args.seed)  # the same shuffle on every worker
    steps_per_epoch = (n + batch - 1) // batch
    total_steps = steps_per_epoch * args.epochs
    step = 0
    seconds, samples = [], []
    for epoch in range(1, args.epochs + 1):
        start = pc.now()
        loss_sum = correct = 0.0
        outs = []
        for g, xy in batches():
            lr = tf.constant(pc.cosine_lr(args, step, total_steps), tf.float32)
            step += 1
            outs.append(train_step(xy, lr, tf.constant(float(g))))
        for l, c in outs:  # this worker's replicas' sums (waits for the last step)
            loss_sum += sum(float(t) for t in strategy.experimental_local_results(l))
            correct += sum(float(t) for t in strategy.experimental_local_results(c))
        dt = pc.now() - start
        seconds.append(dt)
        samples.append(n)
        local = n / args.workers if args.workers else n  # the rows this worker's replicas saw
        if chief:
            print(f'tf epoch {epoch}/{args.epochs}  loss {loss_sum / local:.4f}  train_accuracy {correct / local:.4f}  '
                  f'samples/s {n / dt:.0f}  steps {len(outs)}', flush=True)
    if chief:
        logits = forward(tf.constant(x_test))  # cross-replica context: the first replica's copy
        acc = float(np.mean(np.argmax(logits.numpy(), 1) == y_test))
        pc.emit(measure='train', epochs=args.epochs, batch_size=batch, samples_per_s=pc.train_summary(seconds, samples),
                epoch_samples_per_s=[s / t for s, t in zip(samples, seconds)], test_accuracy=acc, **label)


def run_worker(args):
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    try:
        import tensorflow as tf
    except ImportError as e:
        sys.exit(f'tf_peer.py: SKIP: {e} (bench/peers.sh --setup installs it)')
    strategy, name, threads = make_strategy(args, tf)
    chief = args.workers == 0 or args.worker_index == 0
    peer = 'tf' if args.workers == 0 else 'tf_mw'
    label = dict(peer=peer, framework=f'tensorflow {tf.__version__}, {name}', replicas=strategy.num_replicas_in_sync,
                 threads=threads or 'default', label=args.label)
    if chief:
        print(f'tf_peer: tensorflow {tf.__version__}, {name}, intra-op threads {threads or "default"}', flush=True)
    if args.what in ('all', 'micro'):
        micro(args, tf, strategy, label, chief)
    if args.what in ('all', 'train'):
        train(args, tf, strategy, label, chief)


def launch_workers(args):
    """Starts args.workers copies of this script with TF_CONFIG on localhost; returns the first
    failing exit status (0 when all succeed)."""
    ports = []
    socks = []
    for _ in range(args.workers):
        s = socket.socket()
        s.bind(('127.0.0.1', 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    cluster = {'worker': [f'localhost:{p}' for p in ports]}
    procs = []
    for i in range(args.workers):
        env = dict(os.environ, TF_CONFIG=json.dumps({'cluster': cluster, 'task': {'type': 'worker', 'index': i}}))
        env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
        out = None if i == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), '--worker-index', str(i)] + sys.argv[1:],
                                      env=env, stdout=out))
    rc = 0
    for p in procs:
        rc = p.wait() or rc
    return rc


def main():
    args = pc.parse_args(__doc__.split('\n')[0], extra)
    if args.workers > 0 and args.worker_index < 0:
        sys.exit(launch_workers(args))
    run_worker(args)


if __name__ == '__main__':
    main()
