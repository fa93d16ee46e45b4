#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Assembles and checks the GPU kit (tools/gpu_kit/meson.build).

  assemble.py --out DIR --run-sh RUN_SH [--data DATA_DIR] [--run] PROGRAM...

Copies the programs into DIR (stripped) with run.sh, then checks what another machine needs to
run them: every NEEDED library must be glibc's, the driver's, NCCL's or cuBLAS's (libstdc++,
libgcc_s, the CUDA runtime, zlib, Boost, Catch2, Google Benchmark, Eigen, BLAS and MPI must not
be), no RUNPATH may point into this machine, and the folder must stay under 40 MiB. Prints the
sizes and the newest glibc symbol version the programs need. With --data, copies the
Fashion-MNIST files into DIR/../fashion-mnist (beside the kit: 30 MB that the 40 MiB would not
hold). With --run, runs DIR/run.sh into a scratch folder and requires exit 0 and a result line
(SKIP where there is no GPU) for every program. Exit status 1 on any failed check.
"""
import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

LIMIT = 40 << 20
# glibc's libraries (libdl, librt, libpthread are stubs since glibc 2.34, still named by programs
# linked against them), the driver, and the two vendor libraries the kit finds on the machine.
ALLOWED = re.compile(r'^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64)\.so\.\d+$|^libcuda\.so\.1$'
                     r'|^libnccl\.so\.2$|^libcublas\.so\.\d+$')
DATA_FILES = ['train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz', 't10k-images-idx3-ubyte.gz',
              't10k-labels-idx1-ubyte.gz']


def fail(msg):
    print(f'gpu kit: FAIL: {msg}', flush=True)
    sys.exit(1)


def dynamic(path):
    out = subprocess.run(['readelf', '-d', path], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r'\(NEEDED\)\s+Shared library: \[([^\]]+)\]', out)
    runpath = re.findall(r'\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]', out)
    return needed, runpath


def newest_glibc(path):
    out = subprocess.run(['readelf', '-V', path], capture_output=True, text=True, check=True).stdout
    versions = {tuple(int(x) for x in v.split('.')) for v in re.findall(r'GLIBC_(\d+(?:\.\d+)+)', out)}
    return '.'.join(str(x) for x in max(versions)) if versions else '?'


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', required=True)
    p.add_argument('--run-sh', required=True)
    p.add_argument('--script', action='append', default=[], help='a script to carry beside run.sh')
    p.add_argument('--data')
    p.add_argument('--run', action='store_true')
    p.add_argument('programs', nargs='+')
    a = p.parse_args()

    out = os.path.abspath(a.out)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    strip = shutil.which('strip')
    for src in a.programs:
        dst = os.path.join(out, os.path.basename(src))
        shutil.copy2(src, dst)
        if strip:
            subprocess.run([strip, '--strip-all', dst], check=True)
    run_sh = os.path.join(out, 'run.sh')
    shutil.copy2(a.run_sh, run_sh)
    os.chmod(run_sh, os.stat(run_sh).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    scripts = {'run.sh'}
    for src in a.script:
        shutil.copy2(src, os.path.join(out, os.path.basename(src)))
        scripts.add(os.path.basename(src))

    total = 0
    glibc = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        size = os.path.getsize(path)
        total += size
        if name in scripts:
            print(f'  {name:40s} {size / 2**20:6.2f} MiB')
            continue
        needed, runpath = dynamic(path)
        bad = [n for n in needed if not ALLOWED.match(n)]
        if bad:
            fail(f'{name} needs {", ".join(bad)} at run time (the kit links it statically or not at all); '
                 f'NEEDED: {", ".join(needed)}')
        for rp in runpath:
            for d in rp.split(':'):
                if d and not d.startswith('$ORIGIN'):
                    fail(f'{name} has RUNPATH {rp}: a folder of this machine')
        glibc.append(newest_glibc(path))
        print(f'  {name:40s} {size / 2**20:6.2f} MiB  needs {" ".join(n for n in needed)}')
    print(f'gpu kit: {out}: {total / 2**20:.1f} MiB in {len(os.listdir(out))} files '
          f'(limit {LIMIT >> 20} MiB); programs need glibc >= {max(glibc, key=lambda v: tuple(map(int, v.split(".")))) if glibc else "?"}')
    if total >= LIMIT:
        fail(f'the kit is {total / 2**20:.1f} MiB, over {LIMIT >> 20} MiB')

    if a.data:
        dest = os.path.join(os.path.dirname(out), 'fashion-mnist')
        missing = [f for f in DATA_FILES if not os.path.exists(os.path.join(a.data, f))]
        if missing:
            print(f'gpu kit: no Fashion-MNIST data in {a.data} (missing {", ".join(missing)}): the trainer '
                  f'will need run.sh --data DIR on the GPU machine')
        else:
            os.makedirs(dest, exist_ok=True)
            size = 0
            for f in DATA_FILES:
                shutil.copy2(os.path.join(a.data, f), os.path.join(dest, f))
                size += os.path.getsize(os.path.join(dest, f))
            print(f'gpu kit: data: {dest}: {size / 2**20:.1f} MiB (run.sh finds it beside the kit)')

    if a.run:
        info = subprocess.run([os.path.join(out, 'gpu_info')], capture_output=True, text=True, timeout=60)
        if info.returncode == 0:
            print('gpu kit: a GPU is visible here: run.sh (minutes) is not run as part of this check; run '
                  f'{run_sh} OUTDIR')
            return 0
        with tempfile.TemporaryDirectory() as scratch:
            r = subprocess.run([run_sh, scratch], capture_output=True, text=True, timeout=420)
            sys.stdout.write(r.stdout)
            sys.stdout.write(r.stderr)
            if r.returncode != 0:
                fail(f'run.sh exited {r.returncode}')
            names = [os.path.basename(n) for n in a.programs if os.path.basename(n) != 'gpu_info']
            for n in names:
                key = n[:-len('_test')] if n.endswith('_test') else n
                if not re.search(rf'^\s*(SKIP|PASS|FAIL) {re.escape(key)}\b|^\s*{re.escape(key)}: \d+ passed',
                                 r.stdout, re.M):
                    fail(f'run.sh printed no result line for {n}')
            files = sorted(os.listdir(scratch))
            if len(files) > 8:
                fail(f'run.sh wrote {len(files)} files; a device check returns at most 8: {files}')
            print(f'gpu kit: run.sh exit 0; it wrote {", ".join(files)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
