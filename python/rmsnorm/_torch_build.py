"""_torch_build.py - rmsnorm._torch, the torch module, compiled on first use against the torch
that is running (from the sources in rmsnorm/_torch_src/) and kept in a per-user cache, one
build per torch build and installed package (cache_key). `python -m rmsnorm._torch_build`
builds it ahead of time and shows the compiler's output.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

_PKG = os.path.dirname(os.path.abspath(__file__))
_SRC = os.path.join(_PKG, "_torch_src")
_NAME = "rmsnorm._torch"
# As python/CMakeLists.txt compiles the numpy module (Release, hidden symbols, no FMA
# contraction); torch's headers are system headers, so their warnings stay out.
_FLAGS = ("-std=c++20", "-O2", "-DNDEBUG", "-fPIC", "-fvisibility=hidden",
          "-fvisibility-inlines-hidden", "-ffp-contract=off", "-Wall", "-Wextra")


class BuildError(Exception):
    """The torch module could not be compiled (the message says why)."""


def cache_root() -> str:
    """$RMSNORM_BUILD_CACHE, else $XDG_CACHE_HOME/rmsnorm, else ~/.cache/rmsnorm."""
    if root := os.environ.get("RMSNORM_BUILD_CACHE"):
        return os.path.abspath(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(xdg), "rmsnorm")


def torch_info(torch) -> dict:
    """What the compiled module depends on in the torch that is running."""
    return {
        "version": str(torch.__version__),
        "git": str(getattr(torch.version, "git_version", "")),
        "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
        "root": os.path.dirname(os.path.realpath(torch.__file__)),
    }


def sources_digest(src_dir: str = _SRC) -> str:
    """sha256 over the names and contents of the sources and headers."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(src_dir)):
        h.update(name.encode() + b"\0")
        with open(os.path.join(src_dir, name), "rb") as f:
            h.update(f.read() + b"\0")
    return h.hexdigest()


def cache_key(torch: dict, package_dir: str, digest: str,
              ext_suffix: str = importlib.machinery.EXTENSION_SUFFIXES[0],
              flags=_FLAGS) -> str:
    """16 hex digits naming one build: any change of torch (version, revision, C++ ABI,
    folder), of the package's folder or sources, of Python's ABI or of the flags gives
    another."""
    blob = json.dumps({"torch": torch, "package": package_dir, "sources": digest,
                       "ext": ext_suffix, "flags": list(flags)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def find_compiler() -> list:
    """$CXX (split as a shell would: `ccache g++` works), else c++, g++ or clang++ on PATH."""
    if cxx := os.environ.get("CXX", "").strip():
        argv = shlex.split(cxx)
        if shutil.which(argv[0]) is None:
            raise BuildError(f"the C++ compiler CXX={cxx!r} was not found")
        return argv
    for path in map(shutil.which, ("c++", "g++", "clang++")):
        if path:
            return [path]
    raise BuildError("no C++ compiler was found (CXX is not set, and none of c++, g++, clang++ "
                     "is on PATH); install one (Debian/Ubuntu: apt install g++)")


def _run(cmds: list) -> str:
    """Runs the commands at once (the sources compile in parallel); their output, or
    BuildError with the first failure's last 25 lines."""
    try:
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, errors="replace") for cmd in cmds]
    except OSError as err:
        raise BuildError(f"{cmds[0][0]} cannot run: {err}") from None
    out = [proc.communicate()[0] for proc in procs]
    for cmd, proc, text in zip(cmds, procs, out):
        if proc.returncode:
            tail = "\n".join("    " + line for line in text.rstrip().splitlines()[-25:])
            raise BuildError(f"`{shlex.join(cmd)}` failed (exit status {proc.returncode}):\n{tail}")
    return "".join(out)


def _compile(cxx: list, out: str, info: dict) -> str:
    """Compiles and links the module into `out`; the compiler's output."""
    py_include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(py_include, "Python.h")):
        raise BuildError(f"Python's C headers are missing ({py_include}/Python.h; "
                         "Debian/Ubuntu: apt install python3-dev)")
    includes = ["-I", _SRC, "-isystem", py_include]
    for sub in ("include", "include/torch/csrc/api/include"):
        path = os.path.join(info["root"], sub)
        if os.path.isdir(path):
            includes += ["-isystem", path]
    torch_lib = os.path.join(info["root"], "lib")
    libs = sorted(glob.glob(os.path.join(_PKG, "librmsnorm.so.*")))
    libs.append(os.path.join(_PKG, "librmsnorm_pyrt.so"))
    sources = sorted(glob.glob(os.path.join(_SRC, "*.cpp")))
    with tempfile.TemporaryDirectory(dir=os.path.dirname(out)) as tmp:
        objects = [os.path.join(tmp, os.path.basename(s) + ".o") for s in sources]
        log = _run([[*cxx, *_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={info['cxx11_abi']}", *includes,
                     "-c", s, "-o", o] for s, o in zip(sources, objects)])
        # The package's two libraries and torch's by their SONAMEs, found through RUNPATH.
        log += _run([[*cxx, "-shared", *objects, *libs, "-L", torch_lib, "-ltorch_python",
                      "-ltorch_cpu", "-ltorch", "-lc10", "-Xlinker", "-rpath", "-Xlinker", _PKG,
                      "-Xlinker", "-rpath", "-Xlinker", torch_lib, "-o", out]])
    return log


def _build(entry: str, path: str, info: dict, cxx: list, verbose: bool) -> None:
    """Compiles into entry/ under a lock (processes starting together compile once), through
    a temporary name and an atomic rename (an interrupted build leaves nothing)."""
    os.makedirs(entry, exist_ok=True)
    with open(os.path.join(entry, "lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"rmsnorm.torch: waiting for another process compiling the torch module "
                  f"into {entry}", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):
            return
        print(f"rmsnorm.torch: compiling the torch module for torch {info['version']} "
              f"(once; a minute or more) into {entry}", file=sys.stderr, flush=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            log = _compile(cxx, tmp, info)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        if verbose and log:
            print(log, end="", file=sys.stderr)


def _import(path: str):
    spec = importlib.util.spec_from_file_location(_NAME, path)  # an extension, by its suffix
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[_NAME] = module
    setattr(sys.modules["rmsnorm"], "_torch", module)
    return module


def load(verbose: bool = False):
    """rmsnorm._torch for the torch that is running: from the cache, compiled first when it is
    not there. ImportError, saying why, when it cannot be compiled or loaded."""
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    import torch

    info = torch_info(torch)
    key = cache_key(info, _PKG, sources_digest())
    entry = os.path.join(cache_root(), f"torch-{info['version']}-{key}")
    path = os.path.join(entry, "_torch" + importlib.machinery.EXTENSION_SUFFIXES[0])
    if not os.path.exists(path):
        try:
            _build(entry, path, info, find_compiler(), verbose)
        except (BuildError, OSError) as err:
            raise ImportError(
                f"rmsnorm.torch: the torch module must be compiled once for torch "
                f"{info['version']} (C++20, into {entry}), and that failed: {err}") from None
    elif verbose:
        print(f"rmsnorm.torch: the torch module for torch {info['version']} is in {entry}",
              file=sys.stderr)
    try:
        return _import(path)
    except ImportError as err:
        raise ImportError(f"rmsnorm.torch: the compiled torch module {path} cannot be loaded "
                          f"({err}); deleting {entry} makes the next import compile it "
                          "again") from None


if __name__ == "__main__":
    load(verbose=True)
