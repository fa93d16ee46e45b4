#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks README.md and docs/*.md so that they cannot drift from the code:

* README.md has at most 250 lines;
* README.md and docs/ name no commit hash and no date (figures say what is true now; the
  history of how they were reached lives in git and bench/results/), and do not speak of how
  the project is developed (sessions, lent machines, issue numbers);
* every ```cpp block is preceded by a marker: `<!-- snippet: examples/FILE.cpp -->` (the block
  is that whole file) or `<!-- snippet: examples/FILE.cpp#NAME -->` (the block is the part of
  the file between the lines `// [NAME]` and `// [/NAME]`, dedented), which CI compiles and
  runs; or `<!-- sketch -->` for a fragment that does not claim to compile (a signature, a
  schematic loop);
* every relative link (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`) resolves to an
  existing file, and its anchor to a heading of that Markdown file (GitHub's slugs);
* every comment in the sources (files under mirror/, backends/, tests/, bench/, examples/,
  tools/ and cmake/ ending in .hpp .cpp .cu .cuh .h .py .sh .cmake, also with .in after it,
  meson.build and CMakeLists.txt; the top-level meson.build, meson_options.txt and dev.sh) that
  cites a Markdown document names it by its path from the repository root, optionally with an
  anchor: `docs/design.md`, `docs/design.md#compile-time`, `bench/results/hand_blocked.md` (in a
  Doxygen comment, `///`, the anchor is written `\\#compile-time`, which Doxygen prints as `#`). The
  file must exist inside the repository and the anchor must be one of its headings (GitHub's
  slug, as for links), so a bare file name or a document kept outside the repository is an
  error. Comments are `//` and `/* */` in C and C++ (string and character literals skipped),
  `#` comments and docstrings in Python, and `#` comments in shell, Meson and CMake.

Usage: check_docs.py [--update] [REPO_ROOT]
  exit 0 when everything holds, else one line per problem; --update first rewrites every
  snippet block from the file it names (for writing pages: put the marker and an empty
  ```cpp block, then run --update).
"""
import io
import pathlib
import re
import sys
import tokenize

UPDATE = '--update' in sys.argv[1:]
_args = [a for a in sys.argv[1:] if a != '--update']
ROOT = pathlib.Path(_args[0] if _args else pathlib.Path(__file__).parent.parent).resolve()
README_MAX_LINES = 250

FENCE = re.compile(r'^(\s*)(```+|~~~+)(.*)$')
MARKER = re.compile(r'^<!--\s*(snippet:\s*(?P<path>[^#\s]+)(#(?P<region>[\w.-]+))?|sketch)\s*-->\s*$')
LINK = re.compile(r'(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
IMAGE = re.compile(r'!\[[^\]]*\]\(\s*([^)\s]+)\s*\)')
DATE = re.compile(r'\b(19|20)\d\d-[01]\d-[0-3]\d\b')
HASH = re.compile(r'(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])')
DEVELOPMENT_WORDS = re.compile(r'\b(sessions?|lent|this task|issue \d+|issues? #\d+)\b', re.IGNORECASE)

# Source comments: where they are read, and what a citation of a document looks like there.
SOURCE_DIRS = ('mirror', 'backends', 'tests', 'bench', 'examples', 'tools', 'cmake')
SOURCE_TOP = ('meson.build', 'meson_options.txt', 'dev.sh')
C_SUFFIXES = ('.hpp', '.cpp', '.cu', '.cuh', '.h')
HASH_SUFFIXES = ('.sh', '.cmake')
DOC_REF = re.compile(r'(?<![\w./:-])((?:[\w.-]+/)*[\w.-]+\.md)(?:\\?#([\w-]+))?(?![\w/-])')
RAW_STRING = re.compile(r'(?:u8|u|U|L)?R"([^()\\\s"]{0,16})\(')


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lower-cased, punctuation dropped, spaces
    as hyphens."""
    # code spans keep their text (their < and > are punctuation, not HTML, and are dropped anyway)
    text = re.sub(r'`([^`]*)`', lambda m: m.group(1).replace('<', '').replace('>', ''), heading)
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)    # links keep their text
    text = re.sub(r'<[^>]+>', '', text)                     # inline HTML
    text = text.strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def headings(path: pathlib.Path) -> set:
    anchors, seen, in_fence = set(), {}, False
    for line in path.read_text(encoding='utf-8').splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            anchors.add(base if n == 0 else f'{base}-{n}')
            seen[base] = n + 1
    return anchors


def region(path: pathlib.Path, name):
    lines = path.read_text(encoding='utf-8').splitlines()
    if name is None:
        return lines
    begin = [i for i, l in enumerate(lines) if l.strip() == f'// [{name}]']
    end = [i for i, l in enumerate(lines) if l.strip() == f'// [/{name}]']
    if len(begin) != 1 or len(end) != 1 or end[0] < begin[0]:
        return None
    body = lines[begin[0] + 1:end[0]]
    indent = min((len(l) - len(l.lstrip(' ')) for l in body if l.strip()), default=0)
    return [l[indent:] for l in body]


def update_snippets(md: pathlib.Path) -> None:
    """Replaces the body of every snippet block with the text it names."""
    lines = md.read_text(encoding='utf-8').split('\n')
    out, i = [], 0
    while i < len(lines):
        out.append(lines[i])
        mm = MARKER.match(lines[i].strip())
        if mm and mm.group('path') and i + 1 < len(lines) and FENCE.match(lines[i + 1]):
            path = ROOT / mm.group('path')
            body = region(path, mm.group('region')) if path.is_file() else None
            j = i + 2
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            if body is not None and j < len(lines):
                out.append(lines[i + 1])
                out.extend(body)
                out.append(lines[j])
                i = j + 1
                continue
        i += 1
    md.write_text('\n'.join(out), encoding='utf-8')


def check_file(md: pathlib.Path, problems: list, anchors_of) -> None:
    rel = md.relative_to(ROOT)
    text = md.read_text(encoding='utf-8')
    lines = text.splitlines()

    def problem(lineno, msg):
        problems.append(f'{rel}:{lineno}: {msg}')

    in_fence, fence_start, fence_lang, block, last_text = False, 0, '', [], (0, '')
    for no, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if m and not in_fence:
            in_fence, fence_start, fence_lang, block = True, no, m.group(3).strip(), []
            marker_line = last_text[1]
            if fence_lang in ('cpp', 'c++', 'cuda'):
                mm = MARKER.match(marker_line.strip())
                if not mm:
                    problem(no, 'a ```cpp block needs `<!-- snippet: examples/... -->` (compiled) or '
                                '`<!-- sketch -->` (a fragment) on the line before it')
                    fence_marker = None
                else:
                    fence_marker = mm
            else:
                fence_marker = None
            continue
        if m and in_fence:
            in_fence = False
            if m.group(3).strip():
                problem(no, 'text after a closing fence: Markdown renders the rest of the page as code')
            if fence_marker is not None and fence_marker.group('path'):
                path = ROOT / fence_marker.group('path')
                if not fence_marker.group('path').startswith('examples/'):
                    problem(fence_start, f'snippet {fence_marker.group("path")}: compiled snippets live under examples/')
                elif not path.is_file():
                    problem(fence_start, f'snippet {fence_marker.group("path")}: no such file')
                else:
                    want = region(path, fence_marker.group('region'))
                    if want is None:
                        problem(fence_start, f'snippet {fence_marker.group("path")}#{fence_marker.group("region")}: '
                                             f'no single `// [{fence_marker.group("region")}]` ... '
                                             f'`// [/{fence_marker.group("region")}]` pair in that file')
                    elif [l.rstrip() for l in want] != [l.rstrip() for l in block]:
                        for i, (a, b) in enumerate(zip(want + [None] * len(block), block + [None] * len(want))):
                            if (a or '').rstrip() != (b or '').rstrip():
                                problem(fence_start + 1 + i,
                                        f'differs from {fence_marker.group("path")}'
                                        f'{"#" + fence_marker.group("region") if fence_marker.group("region") else ""}: '
                                        f'the file has {a!r}, the page {b!r}')
                                break
            continue
        if in_fence:
            block.append(line)
            continue
        if line.strip():
            last_text = (no, line)
        # links outside code
        prose = re.sub(r'`[^`]*`', '', line)
        for target in LINK.findall(prose) + IMAGE.findall(prose):
            if re.match(r'^[a-z][a-z0-9+.-]*:', target):   # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition('#')
            dest = md if not path_part else (md.parent / path_part).resolve()
            if not dest.exists():
                problem(no, f'link {target}: {path_part} does not exist')
                continue
            if anchor:
                if dest.suffix != '.md':
                    problem(no, f'link {target}: an anchor into a file that is not Markdown')
                elif anchor not in anchors_of(dest):
                    problem(no, f'link {target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}')
        if DATE.search(prose):
            problem(no, f'a date ({DATE.search(prose).group(0)}): say what is true now; history goes in git and bench/results/')
        if HASH.search(prose):
            problem(no, f'a commit hash? ({HASH.search(prose).group(0)}): say what is true now')
        if DEVELOPMENT_WORDS.search(prose):
            problem(no, f'"{DEVELOPMENT_WORDS.search(prose).group(0)}": the docs speak to users, not of how mirror is developed')
    if in_fence:
        problem(fence_start, 'unterminated code block')


def c_comments(text: str) -> list:
    """(line, text) of every `//` and `/* */` comment of C or C++ source; string, raw string
    and character literals are skipped (a `'` after a digit is a digit separator)."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c == '\n':
            line, i = line + 1, i + 1
        elif text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split('\n')):
                out.append((line + k, part))
            line, i = line + text.count('\n', i, j), j + 2
        elif (m := RAW_STRING.match(text, i)) and not (i and (text[i - 1].isalnum() or text[i - 1] == '_')):
            j = text.find(')' + m.group(1) + '"', m.end())
            j = n if j < 0 else j + len(m.group(1)) + 2
            line, i = line + text.count('\n', i, j), j
        elif c in '"\'':
            word = re.search(r'\w*$', text[max(0, i - 3):i]).group(0)
            if c == "'" and word and word not in ('u8', 'u', 'U', 'L'):
                i += 1                                  # 1'000: a digit separator
                continue
            j = i + 1
            while j < n and text[j] not in (c, '\n'):
                j += 2 if text[j] == '\\' else 1
            j = min(j, n)
            line, i = line + text.count('\n', i, j), j + 1 if j < n and text[j] == c else j
        else:
            i += 1
    return out


def python_comments(text: str) -> list:
    """(line, text) of every `#` comment and every docstring (a string that is a statement)."""
    out, previous = [], tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string[1:]))
            elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                out.extend((tok.start[0] + k, part) for k, part in enumerate(tok.string.split('\n')))
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                previous = tok.type
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


def hash_comments(text: str, triple_quotes: bool) -> list:
    """(line, text) of every `#` comment of shell, Meson or CMake: a `#` that starts a word,
    outside quotes. Quotes end with their line, except Meson's triple-quoted strings."""
    out, in_triple = [], False
    for no, line in enumerate(text.splitlines(), 1):
        quote, i = None, 0
        while i < len(line):
            if triple_quotes and quote is None and line.startswith("'" * 3, i):
                in_triple, i = not in_triple, i + 3
                continue
            c = line[i]
            if in_triple:
                pass
            elif quote:
                if c == '\\':
                    i += 1
                elif c == quote:
                    quote = None
            elif c in '"\'':
                quote = c
            elif c == '#' and (i == 0 or line[i - 1] in ' \t;(') and not (no == 1 and line.startswith('#!')):
                out.append((no, line[i + 1:]))
                break
            i += 1
    return out


def source_files() -> list:
    files = [ROOT / name for name in SOURCE_TOP if (ROOT / name).is_file()]
    for top in SOURCE_DIRS:
        files.extend(p for p in sorted((ROOT / top).rglob('*')) if p.is_file())
    return files


def comments_of(path: pathlib.Path):
    """The comments of a source file, or None for a file that is not one."""
    name = path.name[:-3] if path.name.endswith('.in') else path.name
    if name.endswith(C_SUFFIXES):
        extract = c_comments
    elif name.endswith('.py'):
        extract = python_comments
    elif name.endswith(HASH_SUFFIXES):
        extract = lambda text: hash_comments(text, triple_quotes=False)
    elif name in ('meson.build', 'meson_options.txt'):
        extract = lambda text: hash_comments(text, triple_quotes=True)
    elif name == 'CMakeLists.txt':
        extract = lambda text: hash_comments(text, triple_quotes=False)
    else:
        return None
    try:
        return extract(path.read_text(encoding='utf-8'))
    except UnicodeDecodeError:
        return None


def check_source_references(problems: list, anchors_of) -> int:
    """Every document a source comment cites is a file of the repository, and its anchor a
    heading of it. Returns how many source files were read."""
    checked = 0
    for path in source_files():
        comments = comments_of(path)
        if comments is None:
            continue
        checked += 1
        rel = path.relative_to(ROOT).as_posix()
        for no, text in comments:
            for m in DOC_REF.finditer(text):
                ref, anchor = m.group(1), m.group(2)
                dest = (ROOT / ref).resolve()
                if ROOT not in dest.parents or not dest.is_file():
                    problems.append(f'{rel}:{no}: cites {m.group(0)}, not a file of this repository: cite a '
                                    f'page by its path from the root, e.g. docs/design.md#compile-time')
                elif anchor and anchor not in anchors_of(dest):
                    problems.append(f'{rel}:{no}: cites {m.group(0)}: {ref} has no heading with anchor #{anchor}')
    return checked


def main() -> int:
    problems = []
    cache = {}

    def anchors_of(p):
        if p not in cache:
            cache[p] = headings(p)
        return cache[p]

    readme = ROOT / 'README.md'
    n = len(readme.read_text(encoding='utf-8').splitlines())
    if n > README_MAX_LINES:
        problems.append(f'README.md: {n} lines; at most {README_MAX_LINES} (the rest belongs in docs/)')
    pages = [readme] + sorted((ROOT / 'docs').glob('*.md'))
    if UPDATE:
        for md in pages:
            update_snippets(md)
    for md in pages:
        check_file(md, problems, anchors_of)
    sources = check_source_references(problems, anchors_of)
    for p in problems:
        print(p)
    print(f'check_docs: {len(pages)} pages, {sources} source files, {len(problems)} problem(s)')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
