"""_torch_build.py - rmsnorm._torch, the torch module, for the torch that is running: the one
`pip install` compiled into the package (rmsnorm/_torch<EXT_SUFFIX>, with _torch_prebuilt.json
naming the torch and sources it was built from) when it fits, else one compiled on first use
(from the sources in rmsnorm/_torch_src/) and kept in a per-user cache, one build per torch
build and installed package (cache_key). `python -m rmsnorm._torch_build` says which it loads,
builds it ahead of time when needed and shows the compiler's output. python/CMakeLists.txt
runs this file for the install-time build (_cmake): where torch is, and the record.
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
_EXT = importlib.machinery.EXTENSION_SUFFIXES[0]
# What the package's build writes when torch was importable (python/CMakeLists.txt).
_PREBUILT = os.path.join(_PKG, "_torch" + _EXT)
_PREBUILT_RECORD = os.path.join(_PKG, "_torch_prebuilt.json")
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


def torch_paths(info: dict) -> tuple:
    """(include folders, library folder) of the torch that torch_info described."""
    includes = [os.path.join(info["root"], sub)
                for sub in ("include", "include/torch/csrc/api/include")]
    return [p for p in includes if os.path.isdir(p)], os.path.join(info["root"], "lib")


def _digest(paths) -> str:
    h = hashlib.sha256()
    for path in sorted(paths, key=os.path.basename):
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read() + b"\0")
    return h.hexdigest()


def sources_digest(src_dir: str = _SRC) -> str:
    """sha256 over the names and contents of the sources and headers."""
    return _digest([os.path.join(src_dir, name) for name in os.listdir(src_dir)])


def cache_key(torch: dict, package_dir: str, digest: str,
              ext_suffix: str = _EXT,
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
    torch_includes, torch_lib = torch_paths(info)
    for path in torch_includes:
        includes += ["-isystem", path]
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


def _read_record():
    """The package's _torch_prebuilt.json, or None when there is none (an older install)."""
    try:
        with open(_PREBUILT_RECORD) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def why_not_prebuilt(record, info: dict, digest: str):
    """None when the module compiled at install time fits: its record names the torch that
    is running (torch_info, all of it) and the sources installed (their digest); else why not,
    in words."""
    if not record:
        return "the package holds no torch module compiled at install time"
    built = record.get("torch")
    if not built:
        return ("the package's build compiled no torch module ("
                + record.get("reason", "torch was not importable") + ")")
    if built != info:
        diff = ", ".join(f"{k} {built.get(k)!r} -> {info.get(k)!r}"
                         for k in sorted(set(built) | set(info)) if built.get(k) != info.get(k))
        return f"the package's torch module was compiled for another torch ({diff})"
    if record.get("sources") != digest:
        return "the package's torch module was compiled from other sources than _torch_src/"
    return None


def load(verbose: bool = False):
    """rmsnorm._torch for the torch that is running: the package's own, compiled at install
    time, when it was compiled for this torch and these sources (why_not_prebuilt); else from
    the cache, compiled first when it is not there. ImportError, saying why, when it cannot be
    compiled or loaded."""
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    import torch

    info = torch_info(torch)
    digest = sources_digest()
    why, say_why = why_not_prebuilt(_read_record(), info, digest), verbose
    if why is None:
        try:
            module = _import(_PREBUILT)
        except ImportError as err:  # unexpected, hence said even when not verbose
            why, say_why = f"the package's torch module {_PREBUILT} cannot be loaded ({err})", True
        else:
            if verbose:
                print(f"rmsnorm.torch: the torch module for torch {info['version']} was compiled "
                      f"at install time: {_PREBUILT}", file=sys.stderr)
            return module
    if say_why:
        print(f"rmsnorm.torch: {why}; using the per-user cache", file=sys.stderr)
    key = cache_key(info, _PKG, digest)
    entry = os.path.join(cache_root(), f"torch-{info['version']}-{key}")
    path = os.path.join(entry, "_torch" + _EXT)
    if not os.path.exists(path):
        try:
            _build(entry, path, info, find_compiler(), verbose)
        except (BuildError, OSError) as err:
            raise ImportError(
                f"rmsnorm.torch: the torch module must be compiled once for torch "
                f"{info['version']} (C++20, into {entry}; {why}), and that failed: "
                f"{err}") from None
    elif verbose:
        print(f"rmsnorm.torch: the torch module for torch {info['version']} is in {entry}",
              file=sys.stderr)
    try:
        return _import(path)
    except ImportError as err:
        raise ImportError(f"rmsnorm.torch: the compiled torch module {path} cannot be loaded "
                          f"({err}); deleting {entry} makes the next import compile it "
                          "again") from None


def _write_if_changed(path: str, text: str) -> None:
    """Keeps the file's time when its text is the same (the build then does nothing)."""
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)


def _cmake(argv: list) -> None:
    """What python/CMakeLists.txt asks, run with the interpreter being installed into (not as
    part of the package: torch must not be found as rmsnorm/torch):
      query OUT          torch_info of the torch importable here into OUT (unchanged when
                         equal), and on stdout one JSON line for CMake: torch_info, include
                         folders, library folder, _FLAGS; or {"error": why not}
      record OUT INFO SOURCE...
                         the record load() checks: OUT holds {"torch": INFO's torch_info,
                         "sources": the digest of SOURCE... as installed in _torch_src/}
      none OUT REASON    the record of a build without the torch module: {"torch": null,
                         "reason": REASON}
    """
    cmd, out, *rest = argv
    if cmd == "query":
        try:
            import torch
            info = torch_info(torch)
        except Exception as err:  # torch missing or broken: the build goes on without it
            print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
            return
        _write_if_changed(out, json.dumps(info, sort_keys=True) + "\n")
        includes, lib = torch_paths(info)
        print(json.dumps({"info": info, "include": includes, "lib": lib, "flags": list(_FLAGS)}))
    elif cmd == "record":
        with open(rest[0]) as f:
            info = json.load(f)
        _write_if_changed(out, json.dumps({"torch": info, "sources": _digest(rest[1:])},
                                          sort_keys=True, indent=1) + "\n")
    elif cmd == "none":
        _write_if_changed(out, json.dumps({"torch": None, "reason": rest[0]},
                                          sort_keys=True, indent=1) + "\n")
    else:
        raise SystemExit(f"_torch_build.py: unknown command {cmd!r}")


if __name__ == "__main__":
    load(verbose=True)
elif __name__ == "rmsnorm-cmake":  # runpy.run_path(this file, run_name=...) from CMake
    _cmake(sys.argv[2:])  # after -c's "-c" and this file
