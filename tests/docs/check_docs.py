#!/usr/bin/env python3
"""check_docs.py - checks that README.md and docs/*.md point only at things that exist:
every relative Markdown link (and its #anchor, in a .md file) and every repository path
written in backticks. Python 3 standard library only; run by `make test` (mk/docs.mk).

What counts as a repository path in backticks (inline code, outside fenced blocks):
  - a span without spaces that starts with a top-level folder of the repository
    (src/ include/ tools/ tests/ bench/ docs/ python/ examples/ mk/ cmake/ .ci/),
    or that is a file at the root (Makefile, CMakeLists.txt, README.md, ...);
  - paths are relative to the repository root; a trailing / asks for a folder;
  - `*`, `?` and `[...]` are globs, and a placeholder `<name>` counts as `*`:
    the pattern must match at least one path;
  - anything under a build or virtualenv folder (a component named build, build-*,
    .venv) is not checked: it exists only after a build.
Fenced code blocks (commands, example sessions) are not checked.

Usage: check_docs.py [--root DIR] [FILE.md ...]   (default: README.md docs/*.md)
Exit status 0 when everything exists, 1 otherwise (one line per problem).
"""

import argparse
import glob
import os
import re
import sys
import unicodedata

TOP_DIRS = ("src", "include", "tools", "tests", "bench", "docs", "python", "examples",
            "mk", "cmake", ".ci")
ROOT_FILES = ("Makefile", "CMakeLists.txt", "README.md", ".gitignore")
BUILD_PARTS = re.compile(r"^(build(-.*)?|\.venv)$")

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target ends at the first space or ')'.
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """(line number, line) for every line outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading):
    """The anchor GitHub gives a heading: lower case, inline markup and punctuation
    dropped (letters, digits, spaces, - and _ kept), spaces made hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(path):
    """Every anchor of a Markdown file's headings (repeats get -1, -2, ...)."""
    seen = {}
    result = set()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else "%s-%d" % (base, count))
    return result


def is_repo_path(span):
    if not span or any(c.isspace() for c in span):
        return False
    if span in ROOT_FILES:
        return True
    first = span.split("/", 1)[0]
    return "/" in span and first in TOP_DIRS


def under_build(span):
    return any(BUILD_PARTS.match(part) for part in span.split("/"))


def path_exists(root, span):
    want_dir = span.endswith("/")
    pattern = re.sub(r"<[^<>/]+>", "*", span.rstrip("/"))
    full = os.path.join(root, pattern)
    if glob.has_magic(pattern):
        hits = glob.glob(full)
    else:
        hits = [full] if os.path.lexists(full) else []
    if want_dir:
        hits = [h for h in hits if os.path.isdir(h)]
    return bool(hits)


def check_file(root, rel):
    """Problems found in one Markdown file, as 'file:line: message' strings."""
    problems = []
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    here = os.path.dirname(path)
    for n, line in prose_lines(text):
        # inline code first, so that a link inside backticks is not read as one
        for m in CODE_SPAN.finditer(line):
            span = m.group(2).strip()
            if is_repo_path(span) and not under_build(span) and not path_exists(root, span):
                problems.append("%s:%d: path `%s` does not exist" % (rel, n, span))
        prose = CODE_SPAN.sub("", line)
        for m in LINK.finditer(prose):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # http:, https:, mailto:, ...
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(here, file_part)) if file_part else path
            if file_part and not os.path.exists(dest):
                problems.append("%s:%d: link target %s does not exist" % (rel, n, file_part))
                continue
            if anchor and dest.endswith(".md") and os.path.isfile(dest):
                if anchor not in anchors(dest):
                    problems.append("%s:%d: link %s: no heading with anchor #%s"
                                    % (rel, n, target, anchor))
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("files", nargs="*", help="Markdown files relative to the root")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    files = args.files or (["README.md"] + sorted(
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md"))))
    problems = []
    for rel in files:
        if not os.path.isfile(os.path.join(root, rel)):
            problems.append("%s: no such file" % rel)
            continue
        problems += check_file(root, rel)
    for p in problems:
        print(p)
    if problems:
        print("check_docs: %d broken reference(s) in %d file(s)" % (len(problems), len(files)))
        return 1
    print("check_docs: %d file(s), every link and path exists" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
