#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Assembles and checks the GPU kit (tools/gpu_kit/meson.build).

  assemble.py --out DIR --run-sh RUN_SH [--mpi-env SH --mpi-program NAME...] [--data DATA_DIR]
              [--run] PROGRAM...

Copies the programs into DIR (stripped) with run.sh, then checks what another machine needs to
run them: every NEEDED library must be glibc's, the driver's, NCCL's or cuBLAS's (libstdc++,
libgcc_s, the CUDA runtime, zlib, Boost, Catch2, Google Benchmark, Eigen and BLAS must not be;
libmpi.so.40 only for the --mpi-program ones), no RUNPATH may point into this machine, and the
folder must stay under LIMIT. Prints the sizes and the newest glibc symbol version the programs
need. With --mpi-env, copies this machine's Open MPI 4.1 runtime (Debian's packages) into
DIR/mpi/ (carry_mpi below), with SH as DIR/mpi/env.sh, and checks that it runs 2 processes from
there with the system's copy hidden where a mount namespace allows. With --data, copies the
Fashion-MNIST files into DIR/../fashion-mnist (beside the kit). With --run, runs DIR/run.sh into
a scratch folder and requires exit 0 and a result line (SKIP where there is no GPU) for every
program. Exit status 1 on any failed check.
"""
import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

# A device check carries at most 64 MiB: the kit and the 29.5 MiB data set beside it.
LIMIT = 34 << 20
# glibc's libraries (libdl, librt, libpthread are stubs since glibc 2.34, still named by programs
# linked against them): never carried (the GPU machine's is newer).
GLIBC_NAMES = r'libc|libm|libdl|librt|libpthread|ld-linux-x86-64'
# What the programs may need: glibc, the driver, and the two vendor libraries the kit finds on the machine.
ALLOWED = re.compile(rf'^({GLIBC_NAMES})\.so\.\d+$|^libcuda\.so\.1$|^libnccl\.so\.2$|^libcublas\.so\.\d+$')
# What the --mpi-program ones may also need: MPI's C library, from DIR/mpi (run.sh's env.sh).
ALLOWED_MPI = re.compile(r'^libmpi\.so\.40$')
# What Open MPI's own files may need and the kit does not carry: glibc (libutil included).
GLIBC = re.compile(rf'^({GLIBC_NAMES}|libutil)\.so\.\d+$')
# Open MPI's transports for networks a single host does not have (UCX, libfabric, verbs, PSM),
# netlink's reachability and OpenSHMEM: a plugin that needs one of these libraries is left out
# (Open MPI skips a component it does not find), so the libraries are not carried either.
MPI_UNNEEDED = re.compile(r'^lib(ucp|ucs|uct|fabric|ibverbs|psm_infinipath|psm2|nl-3|nl-route-3|oshmem|'
                          r'mca_common_(ucx|ofi|verbs))\.so')
MPI_PACKAGES = ['libopenmpi3', 'openmpi-bin', 'openmpi-common', 'libpmix2']
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


def ldd(path):
    """{soname: resolved path} of path's libraries, as this machine's loader finds them."""
    out = subprocess.run(['ldd', path], capture_output=True, text=True, check=True).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r'^\s*(\S+) => (/\S+)', out, re.M)}


def carry_mpi(dest, env_sh):
    """Copies this machine's Open MPI 4.1 runtime (Debian: prefix /usr, libdir
    /usr/lib/x86_64-linux-gnu/openmpi/lib, PMIx under .../pmix2) into dest as dest/usr/..., the
    same tree under another root, which Open MPI finds with OPAL_PREFIX and PMIx with PMIX_PREFIX
    (env.sh). Only what one host needs: mpirun, orted, ompi_info, the MCA plugins whose libraries
    are carried, their libraries (everything beyond glibc, in Open MPI's libdir, which
    LD_LIBRARY_PATH names), the help texts and the MCA defaults. Returns its size in bytes."""
    files = []
    for pkg in MPI_PACKAGES:
        r = subprocess.run(['dpkg', '-L', pkg], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f'the kit carries Open MPI 4.1 from Debian\'s packages: {pkg} is not installed '
                 f'(apt-get install openmpi-bin libopenmpi-dev)')
        files += [f for f in r.stdout.split('\n') if os.path.isfile(f)]
    libdir = '/usr/lib/x86_64-linux-gnu/openmpi/lib'
    pkglibdir = libdir + '/openmpi3'
    pmix = '/usr/lib/x86_64-linux-gnu/pmix2'
    bins = {'/usr/bin/orterun': 'mpirun', '/usr/bin/orted': 'orted', '/usr/bin/ompi_info': 'ompi_info'}
    for b in bins:
        if b not in files:
            fail(f'{b} is not in {", ".join(MPI_PACKAGES)}: not the Open MPI 4.1 layout the kit carries')
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    plugins = [f for f in files if re.match(rf'^({re.escape(pkglibdir)}|{re.escape(pmix)}/lib/pmix)/[^/]+\.so$', f)]
    copies = {b: f'/usr/bin/{n}' for b, n in bins.items()}
    dropped = []
    libs = {}
    for f in list(bins) + plugins:
        deps = ldd(f)
        if any(MPI_UNNEEDED.match(n) for n in deps):
            dropped.append(os.path.basename(f))
            continue
        copies.setdefault(f, f)
        for n, where in deps.items():
            if not GLIBC.match(n):
                libs[n] = where
    for n, where in libs.items():  # each library's own libraries are in ldd's list already
        copies[where] = f'{libdir}/{n}'
    copies.update({f: f for f in files if f.startswith(('/usr/share/openmpi/help-', pmix + '/share/pmix/help-'))})
    copies['/etc/openmpi/openmpi-mca-params.conf'] = '/etc/openmpi/openmpi-mca-params.conf'
    size = 0
    for src, rel in copies.items():
        dst = dest + rel
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(os.path.realpath(src), dst)
        size += os.path.getsize(dst)
    shutil.copy(env_sh, os.path.join(dest, 'env.sh'))
    size += os.path.getsize(os.path.join(dest, 'env.sh'))
    nplugins = sum(1 for d in copies.values() if re.search(r'/(pmix_)?mca_[^/]*\.so$', d))
    print(f'  {"mpi/ (Open MPI " + mpi_version() + ")":40s} {size / 2**20:6.2f} MiB  {len(copies)} files: '
          f'mpirun, orted, ompi_info, {len(libs)} libraries, {nplugins} plugins; left out {len(dropped)} plugins '
          f'for networks one host lacks: {" ".join(sorted(dropped))}')
    return size


def mpi_version():
    r = subprocess.run(['dpkg-query', '-W', '-f', '${Version}', 'libopenmpi3'], capture_output=True, text=True)
    return r.stdout.strip() or '?'


def mpi_smoke(out):
    """Starts 2 processes with the kit's mpirun (run.sh's env) and checks, with the system's Open
    MPI hidden when a mount namespace is available (unshare), that they ran from DIR/mpi."""
    env_sh = os.path.join(out, 'mpi', 'env.sh')
    hide = ['/usr/lib/x86_64-linux-gnu/openmpi', '/usr/lib/x86_64-linux-gnu/pmix2', '/usr/share/openmpi',
            '/etc/openmpi'] + [f'/usr/lib/x86_64-linux-gnu/{n}' for n in
                               ('libmpi.so.40', 'libopen-rte.so.40', 'libopen-pal.so.40', 'libpmix.so.2')] + \
           ['/usr/bin/orterun', '/usr/bin/orted', '/usr/bin/ompi_info']
    empty = tempfile.mkdtemp()
    mounts = ''.join(f'mount --bind {empty} {h}; ' if os.path.isdir(h) else f'mount --bind /dev/null {h}; '
                     for h in hide if os.path.exists(h))
    # Each rank prints where its Open MPI plugins come from, then (when the kit has it) runs the
    # MPI test program's listing, which needs no GPU but calls MPI_Init and MPI_Allreduce.
    prog = os.path.join(out, 'mpi_cluster_cuda_test')
    # (an empty listing: Catch2 returns the number of tests listed, and mpi_main fails on non-zero)
    listing = f' && {prog} --list-test-names-only "[no such tag]" && echo listed' if os.path.exists(prog) else ''
    check = (f'. {env_sh} && ompi_info --path prefix --parsable | grep -q "{out}/mpi/usr" '
             f'&& mpirun --oversubscribe --bind-to none -np 2 bash -c \'echo "rank $OMPI_COMM_WORLD_RANK: '
             f'$(ompi_info --path pkglibdir --parsable | cut -d: -f3-)"{listing}\'')
    hidden = subprocess.run(['unshare', '-m', '-r', 'true'], capture_output=True).returncode == 0
    cmd = ['unshare', '-m', '-r', 'bash', '-c', mounts + check] if hidden else ['bash', '-c', check]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    os.rmdir(empty)
    lines = sorted(l for l in r.stdout.split('\n') if l.startswith('rank '))
    if (r.returncode != 0 or len(lines) != 2 or not all(f'{out}/mpi/usr' in l for l in lines)
            or (listing and r.stdout.count('listed') != 2)):
        fail(f'the kit\'s mpirun did not start 2 processes from {out}/mpi (exit {r.returncode}):\n'
             f'{r.stdout}{r.stderr}')
    how = "with the system's Open MPI hidden (unshare -m)" if hidden else '(the system copy not hidden: no unshare)'
    what = ' (each ran MPI_Init and MPI_Allreduce in mpi_cluster_cuda_test)' if listing else ''
    print(f'gpu kit: mpi/: mpirun started 2 processes from the kit{what} {how}')


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', required=True)
    p.add_argument('--run-sh', required=True)
    p.add_argument('--script', action='append', default=[], help='a script to carry beside run.sh')
    p.add_argument('--mpi-env', help='carry Open MPI in DIR/mpi, with this file as DIR/mpi/env.sh')
    p.add_argument('--mpi-program', action='append', default=[], help='a program that may need libmpi.so.40')
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
    if a.mpi_env:
        total += carry_mpi(os.path.join(out, 'mpi'), a.mpi_env)
    elif a.mpi_program:
        fail(f'{", ".join(a.mpi_program)} need the MPI runtime: pass --mpi-env')
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if name == 'mpi':
            continue
        size = os.path.getsize(path)
        total += size
        if name in scripts:
            print(f'  {name:40s} {size / 2**20:6.2f} MiB')
            continue
        needed, runpath = dynamic(path)
        bad = [n for n in needed if not ALLOWED.match(n) and not (name in a.mpi_program and ALLOWED_MPI.match(n))]
        if bad:
            fail(f'{name} needs {", ".join(bad)} at run time (the kit links it statically or not at all); '
                 f'NEEDED: {", ".join(needed)}')
        for rp in runpath:
            for d in rp.split(':'):
                if d and not d.startswith('$ORIGIN'):
                    fail(f'{name} has RUNPATH {rp}: a folder of this machine')
        glibc.append(newest_glibc(path))
        print(f'  {name:40s} {size / 2**20:6.2f} MiB  needs {" ".join(n for n in needed)}')
    if a.mpi_env:
        mpi_smoke(out)
        # Packed: Open MPI and the two MPI programs as they are take 16 MiB, which the 64 MiB a
        # device check carries cannot spare beside the data set; gzip makes it about 5 MiB, and
        # run.sh unpacks it into a temporary folder.
        for prog in a.mpi_program:
            shutil.move(os.path.join(out, prog), os.path.join(out, 'mpi', prog))
        packed = os.path.join(out, 'mpi.tar.gz')
        subprocess.run(['tar', 'czf', packed, '-C', out, 'mpi'], check=True)
        shutil.rmtree(os.path.join(out, 'mpi'))
        print(f'  {"mpi.tar.gz (mpi/ and " + " ".join(a.mpi_program) + ")":40s} '
              f'{os.path.getsize(packed) / 2**20:6.2f} MiB')
    unpacked = total
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print(f'gpu kit: {out}: {total / 2**20:.1f} MiB in {len(os.listdir(out))} files'
          f'{f" ({unpacked / 2**20:.1f} MiB unpacked)" if a.mpi_env else ""} '
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
