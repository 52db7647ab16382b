"""test_install.py - the torch module compiled on first import: the cache key follows the torch
that is running, a missing or failing compiler gives a clear ImportError, and processes
importing together into an empty cache compile once."""

import glob
import os
import subprocess
import sys
import textwrap

import pytest

import rmsnorm

torch = pytest.importorskip("torch")

PKG_DIR = os.path.dirname(os.path.abspath(rmsnorm.__file__))
TORCH = {"version": "2.5.1", "git": "a8d6afb", "cxx11_abi": 1, "root": "/venv/torch"}


def _build_module():
    from rmsnorm import _torch_build

    return _torch_build


def test_cache_key_follows_torch_and_package():
    tb = _build_module()
    key = tb.cache_key(TORCH, "/venv/rmsnorm", "d1", ".cpython-311-x86_64-linux-gnu.so")
    assert key == tb.cache_key(dict(TORCH), "/venv/rmsnorm", "d1",
                               ".cpython-311-x86_64-linux-gnu.so")
    others = [
        tb.cache_key(dict(TORCH, version="2.5.2"), "/venv/rmsnorm", "d1",
                     ".cpython-311-x86_64-linux-gnu.so"),
        tb.cache_key(dict(TORCH, version="2.5.1+cpu"), "/venv/rmsnorm", "d1",
                     ".cpython-311-x86_64-linux-gnu.so"),
        tb.cache_key(dict(TORCH, cxx11_abi=0), "/venv/rmsnorm", "d1",
                     ".cpython-311-x86_64-linux-gnu.so"),
        tb.cache_key(dict(TORCH, git="0b1c2d3"), "/venv/rmsnorm", "d1",
                     ".cpython-311-x86_64-linux-gnu.so"),
        tb.cache_key(dict(TORCH, root="/other/torch"), "/venv/rmsnorm", "d1",
                     ".cpython-311-x86_64-linux-gnu.so"),
        tb.cache_key(TORCH, "/other/rmsnorm", "d1", ".cpython-311-x86_64-linux-gnu.so"),
        tb.cache_key(TORCH, "/venv/rmsnorm", "d2", ".cpython-311-x86_64-linux-gnu.so"),
        tb.cache_key(TORCH, "/venv/rmsnorm", "d1", ".cpython-312-x86_64-linux-gnu.so"),
    ]
    assert len(set(others)) == len(others) and key not in others
    assert len(key) == 16 and int(key, 16) >= 0


def test_op_table_is_shipped_and_in_the_cache_key(tmp_path):
    # the op table (src/ops.def) drives the torch module's registration: a change of it
    # must compile the module again
    import shutil

    tb = _build_module()
    src = os.path.join(PKG_DIR, "_torch_src")
    assert "ops.def" in os.listdir(src)
    copy = tmp_path / "src"
    shutil.copytree(src, copy)
    before = tb.sources_digest(str(copy))
    with open(copy / "ops.def", "a") as f:
        f.write("\n")
    assert tb.sources_digest(str(copy)) != before


def test_loaded_module_is_built_for_the_running_torch():
    import rmsnorm.torch  # noqa: F401

    tb = _build_module()
    info = tb.torch_info(torch)
    assert info["version"] == torch.__version__
    assert info["cxx11_abi"] == int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = tb.cache_key(info, PKG_DIR, tb.sources_digest())
    folder = os.path.dirname(os.path.abspath(rmsnorm._torch.__file__))
    assert os.path.basename(folder) == f"torch-{torch.__version__}-{key}"
    assert os.path.dirname(folder) == tb.cache_root()


def test_sources_digest_follows_the_sources(tmp_path):
    tb = _build_module()
    (tmp_path / "a.cpp").write_text("int a;\n")
    (tmp_path / "b.h").write_text("int b;\n")
    first = tb.sources_digest(str(tmp_path))
    assert first == tb.sources_digest(str(tmp_path))
    (tmp_path / "b.h").write_text("int c;\n")
    assert tb.sources_digest(str(tmp_path)) != first


def _env(cache, **extra):
    env = dict(os.environ, RMSNORM_BUILD_CACHE=str(cache))
    env.pop("CXX", None)
    # the subprocess imports the package the tests import
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(PKG_DIR), os.environ.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _import_torch_module(env, code="import rmsnorm.torch"):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def _built(cache):
    return glob.glob(os.path.join(str(cache), "*", "_torch*"))


def test_missing_compiler_named_in_cxx(tmp_path):
    cache = tmp_path / "cache"
    r = _import_torch_module(_env(cache, CXX="/nonexistent/c++"))
    assert r.returncode != 0
    assert "ImportError: rmsnorm.torch: the torch module must be compiled once" in r.stderr
    assert "CXX='/nonexistent/c++' was not found" in r.stderr
    assert _built(cache) == []


def test_no_compiler_on_path(tmp_path):
    cache, empty = tmp_path / "cache", tmp_path / "bin"
    empty.mkdir()
    r = _import_torch_module(_env(cache, PATH=str(empty)))
    assert r.returncode != 0
    assert "no C++ compiler was found" in r.stderr and "apt install g++" in r.stderr
    assert _built(cache) == []


def test_failing_compiler_shows_its_last_lines(tmp_path):
    cache, cxx = tmp_path / "cache", tmp_path / "fake-c++"
    cxx.write_text("#!/bin/sh\necho 'fake-c++: first line'\n"
                   "echo 'fake-c++: error: the last line' >&2\nexit 3\n")
    cxx.chmod(0o755)
    r = _import_torch_module(_env(cache, CXX=str(cxx)))
    assert r.returncode != 0
    assert "exit status 3" in r.stderr and "fake-c++: error: the last line" in r.stderr
    assert _built(cache) == []


# Each process records when it is past the cache check (about to take the lock), and the
# compiler, a stand-in that copies the module already built, waits until both are: both
# have found the cache empty, so only the lock keeps the second from compiling too.
_RACER = textwrap.dedent("""
    import os, shutil, time
    import rmsnorm._torch_build as tb

    sync, me = os.environ["SYNC_DIR"], os.environ["RACER"]
    build = tb._build

    def entered():
        return [n for n in os.listdir(sync) if n.startswith("entered-")]

    def tracked_build(*args, **kwargs):
        open(os.path.join(sync, "entered-" + me), "w").close()
        return build(*args, **kwargs)

    def stand_in_compile(cxx, out, info):
        deadline = time.monotonic() + 300
        while len(entered()) < 2:  # the other process is at the lock
            if time.monotonic() > deadline:
                raise RuntimeError("the other process did not come")
            time.sleep(0.01)
        open(os.path.join(sync, "compiled-" + me), "w").close()
        shutil.copyfile(os.environ["BUILT_MODULE"], out)
        return ""

    tb._build, tb._compile = tracked_build, stand_in_compile
    import torch, rmsnorm.torch as rt
    x = torch.randn(3, 8)
    assert torch.allclose(rt.rms_norm(x, (8,)), torch.nn.functional.rms_norm(x, (8,)))
""")


def test_concurrent_first_imports_compile_once(tmp_path):
    import rmsnorm.torch  # noqa: F401  (the module the stand-in compiler copies)

    cache, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _RACER], stderr=subprocess.PIPE, text=True,
                              env=_env(cache, SYNC_DIR=str(sync), RACER=me,
                                       BUILT_MODULE=rmsnorm._torch.__file__))
             for me in ("a", "b")]
    errs = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    # both found the cache empty; one compiled
    assert {"entered-a", "entered-b"} <= set(os.listdir(sync))
    compiled = [n for n in os.listdir(sync) if n.startswith("compiled-")]
    assert len(compiled) == 1, compiled
    assert sum("rmsnorm.torch: compiling" in e for e in errs) == 1, errs
    built = _built(cache)
    assert len(built) == 1 and built[0].endswith(".so"), built
