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
  existing file, and its anchor to a heading of that Markdown file (GitHub's slugs).

Usage: check_docs.py [--update] [REPO_ROOT]
  exit 0 when everything holds, else one line per problem; --update first rewrites every
  snippet block from the file it names (for writing pages: put the marker and an empty
  ```cpp block, then run --update).
"""
import pathlib
import re
import sys

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
    for p in problems:
        print(p)
    print(f'check_docs: {len(pages)} pages, {len(problems)} problem(s)')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
