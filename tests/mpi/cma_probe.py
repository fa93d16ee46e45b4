#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Whether Open MPI's single-copy transport between ranks of one host (CMA: process_vm_readv)
works here; exit 0 if it does. It fails in containers without the ptrace permission it needs,
and Open MPI then aborts the job at the first large message instead of falling back, so
mpi_env.sh turns it off only where this probe fails. As Open MPI does, the process read from
declares any process its tracer (PR_SET_PTRACER_ANY); the reader is not its parent, as two ranks
are not each other's."""
import ctypes
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(2**64 - 1)


class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]


text = b'mirror: single-copy probe'
source = ctypes.create_string_buffer(text, 4096)
libc.prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)
parent = os.getpid()
child = os.fork()
if child == 0:  # the reader: the child reads its parent, which is not its descendant
    into = ctypes.create_string_buffer(4096)
    local = iovec(ctypes.cast(into, ctypes.c_void_p), 4096)
    remote = iovec(ctypes.addressof(source), 4096)
    n = libc.process_vm_readv(parent, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    os._exit(0 if n == 4096 and into.value == text else 1)
_, status = os.waitpid(child, 0)
ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
if '-v' in sys.argv:
    print('single-copy (CMA) between processes:', 'works' if ok else 'does not work')
sys.exit(0 if ok else 1)
