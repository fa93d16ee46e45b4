#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""List source files for the Meson build, or check that a configured list is still complete.

  list_headers.py DIR [SUFFIX]
      Print every file under DIR whose name ends with SUFFIX (default .hpp), one per line,
      as a path relative to DIR with '/' separators, sorted. Used by mirror/meson.build and
      backends/*/meson.build at configure time (run_command), so the header list is not
      written by hand. A header added later is picked up by the next configure
      (meson setup --reconfigure, which ./dev.sh always runs).

  list_headers.py --check ROOT SUFFIX HINT DIR... -- KNOWN...
      Compare the files ending with SUFFIX under ROOT/DIR... (paths relative to ROOT) with
      KNOWN (the list Meson was configured with). Exit 1 and say what to do when they differ;
      HINT names the file or command that fixes it.
"""
import os
import sys


def collect(base, suffix):
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in filenames:
            if name.endswith(suffix):
                rel = os.path.relpath(os.path.join(dirpath, name), base)
                found.append(rel.replace(os.sep, '/'))
    return sorted(found)


def check(argv):
    if '--' not in argv or len(argv) < 4:
        sys.exit('usage: list_headers.py --check ROOT SUFFIX HINT DIR... -- KNOWN...')
    sep = argv.index('--')
    root, suffix, hint, dirs = argv[0], argv[1], argv[2], argv[3:sep]
    known = {k.replace(os.sep, '/') for k in argv[sep + 1:]}
    present = set()
    for d in dirs:
        present.update(d.rstrip('/') + '/' + f for f in collect(os.path.join(root, d), suffix))
    new = sorted(present - known)
    gone = sorted(known - present)
    for f in new:
        print(f'not in the build: {f}')
    for f in gone:
        print(f'in the build but missing on disk: {f}')
    if new or gone:
        print(f'fix: {hint}')
        return 1
    print(f'{len(present)} *{suffix} files under {", ".join(dirs)}: all in the build')
    return 0


def main(argv):
    if argv and argv[0] == '--check':
        return check(argv[1:])
    if len(argv) not in (1, 2):
        sys.exit(__doc__)
    suffix = argv[1] if len(argv) == 2 else '.hpp'
    for f in collect(argv[0], suffix):
        print(f)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
