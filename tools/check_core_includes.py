#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Core never includes a backend (docs/design.md#layers).

  check_core_includes.py ROOT

Fails when a header under ROOT/mirror/
  - includes <mirror/backends/...>  (only the umbrella mirror/mirror.hpp may: it pulls in the
    threads backend), or
  - includes a CUDA, NCCL or MPI header (cuda*.h, cuda/..., nccl*.h, mpi*.h, ...).
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
TOOLKIT = re.compile(r'^(cuda[^/]*\.h|cuda/.*|cub/.*|thrust/.*|nccl[^/]*\.h|mpi[^/]*\.h|mpi\.h|openmpi/.*)$')
UMBRELLA = 'mirror/mirror.hpp'


def main(argv):
    if len(argv) != 1:
        sys.exit(__doc__)
    root = argv[0]
    problems = []
    checked = 0
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, 'mirror')):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(('.hpp', '.hpp.in')):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, '/')
            checked += 1
            with open(path, encoding='utf-8', errors='replace') as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc.startswith(('backends/', 'mirror/backends/')) and rel != UMBRELLA:
                        problems.append(f'{rel}:{lineno}: core header includes a backend: <{inc}>')
                    elif TOOLKIT.match(inc):
                        problems.append(f'{rel}:{lineno}: core header includes a toolkit header: <{inc}>')
    for p in problems:
        print(p)
    if problems:
        print('fix: move the code into backends/<name>/ (core needs only the standard library and Hana)')
        return 1
    print(f'{checked} core headers: no backend or toolkit includes')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
