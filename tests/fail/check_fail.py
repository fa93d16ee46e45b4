#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compile-fail check for one source file (docs/design.md#tests: compile-fail tests).

  check_fail.py SOURCE --flags FLAG... --cxx COMPILER...

SOURCE is tests/fail/NAME.fail.cpp or tests/fail/NAME.pass.cpp. It is compiled with
`COMPILER... FLAG... -fsyntax-only SOURCE` (templates are instantiated, so static_asserts
and constraint failures fire).

  NAME.fail.cpp  must NOT compile, and the compiler output must match the Python regex on
                 its first line:  // expected-error: <regex>
  NAME.pass.cpp  must compile (it differs from its twin only in the line under test).

The compiler runs with LC_ALL=C and colours off, so its quotes are plain ASCII ('x');
typographic quotes are also folded to ASCII before matching. The regex is searched
(re.search) in the whole output, with re.MULTILINE.
"""
import os
import re
import subprocess
import sys

MARKER = re.compile(r'^\s*//\s*expected-error:\s*(.+?)\s*$')


def parse(argv):
    if len(argv) < 4 or '--cxx' not in argv or '--flags' not in argv:
        sys.exit(__doc__)
    source = argv[0]
    i_flags, i_cxx = argv.index('--flags'), argv.index('--cxx')
    if i_flags < i_cxx:
        flags, cxx = argv[i_flags + 1:i_cxx], argv[i_cxx + 1:]
    else:
        cxx, flags = argv[i_cxx + 1:i_flags], argv[i_flags + 1:]
    if not cxx:
        sys.exit('check_fail.py: no compiler after --cxx')
    return source, flags, cxx


def main(argv):
    source, flags, cxx = parse(argv)
    name = os.path.basename(source)
    if name.endswith('.fail.cpp'):
        expect_fail = True
    elif name.endswith('.pass.cpp'):
        expect_fail = False
    else:
        sys.exit(f'{source}: name must end with .fail.cpp or .pass.cpp')

    pattern = None
    if expect_fail:
        with open(source, encoding='utf-8') as f:
            first = f.readline()
        m = MARKER.match(first)
        if not m:
            print(f'FAIL {source}: first line must be "// expected-error: <regex>", got {first!r}')
            return 1
        try:
            pattern = re.compile(m.group(1), re.MULTILINE)
        except re.error as e:
            print(f'FAIL {source}: bad expected-error regex {m.group(1)!r}: {e}')
            return 1

    cmd = cxx + flags + ['-fsyntax-only', '-fdiagnostics-color=never', source]
    env = dict(os.environ, LC_ALL='C', LANG='C')
    print('$ ' + ' '.join(cmd), flush=True)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    except OSError as e:
        print(f'FAIL {source}: cannot run the compiler: {e}')
        return 1
    output = proc.stdout.decode('utf-8', errors='replace')
    output = output.replace('\u2018', "'").replace('\u2019', "'")
    output = output.replace('\u201c', '"').replace('\u201d', '"')

    if not expect_fail:
        if proc.returncode == 0:
            print(f'PASS {source}: compiles, as it should')
            return 0
        print(output)
        print(f'FAIL {source}: does not compile, but it is the passing twin')
        return 1

    if proc.returncode == 0:
        print(output)
        print(f'FAIL {source}: compiled, but it must not')
        return 1
    if not pattern.search(output):
        print(output)
        print(f'FAIL {source}: did not compile, as expected, but no output matches the '
              f'expected-error regex {pattern.pattern!r}')
        return 1
    print(f'PASS {source}: fails to compile with the expected error ({pattern.pattern!r})')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
