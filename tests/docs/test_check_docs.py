#!/usr/bin/env python3
"""test_check_docs.py - the docs checker on a small synthetic repository: what it must
accept (existing paths, globs, placeholders, build folders, fenced code, anchors) and
what it must report (missing paths, links and anchors). Standard library only."""

import contextlib
import io
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_docs  # noqa: E402

GOOD = """# Title

## Two words, `code`!

See [the other page](other.md), [a heading](other.md#second-part),
[this page's heading](#two-words-code), [a folder](../src/) and [web](https://example.org).
Paths: `src/a.c`, `src/`, `src/kernels/*/x.h`, `src/kernels/<isa>/`, `Makefile`,
`build/tools/rmsnorm`, `python/build/cache/`, `.venv/bin/python`, `make test`,
`not/a/top/dir.c`, `x.npy`, `--opt`.

```
src/missing.c  `src/missing.c`  [x](missing.md)
```
"""

OTHER = """# Other

## Second part
"""

BAD = """# Bad

`src/missing.c` and `src/a.c/` (not a folder) and `docs/` is fine,
[gone](gone.md), [no anchor](other.md#nowhere), `src/kernels/*/y.h`, `CMakeLists.txt`.
"""


def make_repo(root):
    for d in ("src/kernels/avx2", "docs"):
        os.makedirs(os.path.join(root, d))
    for f in ("src/a.c", "src/kernels/avx2/x.h", "Makefile"):
        open(os.path.join(root, f), "w").close()
    files = {"docs/good.md": GOOD, "docs/other.md": OTHER, "docs/bad.md": BAD}
    for name, text in files.items():
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            f.write(text)


def main():
    with tempfile.TemporaryDirectory() as root:
        make_repo(root)
        good = check_docs.check_file(root, "docs/good.md")
        assert good == [], good
        bad = check_docs.check_file(root, "docs/bad.md")
        expected = [
            "docs/bad.md:3: path `src/missing.c` does not exist",
            "docs/bad.md:3: path `src/a.c/` does not exist",
            "docs/bad.md:4: path `src/kernels/*/y.h` does not exist",
            "docs/bad.md:4: path `CMakeLists.txt` does not exist",
            "docs/bad.md:4: link target gone.md does not exist",
            "docs/bad.md:4: link other.md#nowhere: no heading with anchor #nowhere",
        ]
        assert sorted(bad) == sorted(expected), bad
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert check_docs.main(["--root", root, "docs/good.md", "docs/other.md"]) == 0
            assert check_docs.main(["--root", root, "docs/bad.md"]) == 1
        assert "6 broken reference(s)" in out.getvalue(), out.getvalue()
    assert check_docs.slug("The `rmsnorm` command") == "the-rmsnorm-command"
    assert check_docs.slug("Python: numpy and PyTorch") == "python-numpy-and-pytorch"
    print("test_check_docs: passed")


if __name__ == "__main__":
    main()
