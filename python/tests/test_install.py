"""test_install.py - the torch module: the one `pip install` compiled into the package is loaded
when it was built for the running torch and the installed sources (nothing compiled), and only
then; otherwise it is compiled on first import, where the cache key follows the torch that is
running, a missing or failing compiler gives a clear ImportError, and processes importing
together into an empty cache compile once."""

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
    path = os.path.abspath(rmsnorm._torch.__file__)
    if tb.why_not_prebuilt(tb._read_record(), info, tb.sources_digest()) is None:
        assert path == tb._PREBUILT  # compiled at install time for this torch
        return
    key = tb.cache_key(info, PKG_DIR, tb.sources_digest())
    folder = os.path.dirname(path)
    assert os.path.basename(folder) == f"torch-{torch.__version__}-{key}"
    assert os.path.dirname(folder) == tb.cache_root()


def test_install_time_module_fits_only_its_torch_and_sources():
    # the decision of load(): every field of torch_info and the sources' digest must match
    tb = _build_module()
    record = {"torch": TORCH, "sources": "d1"}
    assert tb.why_not_prebuilt(record, dict(TORCH), "d1") is None
    for field, other in (("version", "2.5.2"), ("version", "2.5.1+cpu"), ("git", "0b1c2d3"),
                         ("cxx11_abi", 0), ("root", "/other/torch")):
        why = tb.why_not_prebuilt(record, dict(TORCH, **{field: other}), "d1")
        assert why and "another torch" in why and field in why, why
    assert "other sources" in tb.why_not_prebuilt(record, TORCH, "d2")
    assert "no torch module compiled at install time" in tb.why_not_prebuilt(None, TORCH, "d1")
    why = tb.why_not_prebuilt({"torch": None, "reason": "RMSNORM_TORCH=OFF"}, TORCH, "d1")
    assert "compiled no torch module (RMSNORM_TORCH=OFF)" in why


def test_install_time_module_is_loaded_without_compiling(tmp_path):
    # pip install ./python with torch importable compiles the module into the package: the
    # first import in a fresh process loads it, with an empty cache and no compiler at hand
    tb = _build_module()
    record = tb._read_record()
    assert record is not None, (f"{tb._PREBUILT_RECORD} is missing: the package was not "
                                "installed from these sources (pip install ./python)")
    if record["torch"] is None:
        pytest.skip(f"the package holds no install-time torch module: {record['reason']}")
    assert record["torch"] == tb.torch_info(torch), "torch changed since the install"
    assert record["sources"] == tb.sources_digest()
    assert os.path.isfile(tb._PREBUILT)
    cache = tmp_path / "cache"
    r = _import_torch_module(_env(cache, CXX="/nonexistent/c++"), _CHECK_MODULE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == tb._PREBUILT
    assert "compiling" not in r.stderr and not cache.exists()
    r = _import_torch_module(_env(cache), "import rmsnorm._torch_build as tb; tb.load(True)")
    assert r.returncode == 0, r.stderr
    assert f"was compiled at install time: {tb._PREBUILT}" in r.stderr


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_package_loads_its_own_libraries(tmp_path):
    # the package holds its own librmsnorm.so.N (a copy of build/'s or built by the install):
    # without LD_LIBRARY_PATH, every librmsnorm the modules load is the package's
    env = _env(tmp_path / "cache")
    env.pop("LD_LIBRARY_PATH", None)
    code = ("import rmsnorm, rmsnorm.torch\n"
            "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') "
            "if 'librmsnorm' in l})))")
    r = _import_torch_module(env, code)
    assert r.returncode == 0, r.stderr
    loaded = r.stdout.split()
    assert sorted(os.path.basename(p) for p in loaded) == sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(PKG_DIR, "librmsnorm*.so*")))
    assert all(os.path.dirname(os.path.realpath(p)) == os.path.realpath(PKG_DIR)
               for p in loaded), loaded


def test_install_time_module_for_another_torch_falls_back_to_the_cache(tmp_path):
    # a record naming another torch (an upgrade since the install): the module is compiled
    # into the cache as without one (a stand-in compiler copies the module loaded here)
    import rmsnorm.torch  # noqa: F401

    cache = tmp_path / "cache"
    code = textwrap.dedent("""
        import shutil, sys, torch
        import rmsnorm._torch_build as tb

        info = dict(tb.torch_info(torch), version="0.0.1")
        tb._read_record = lambda: {"torch": info, "sources": tb.sources_digest()}
        def stand_in_compile(cxx, out, info):
            shutil.copyfile(sys.argv[1], out)
            return ""

        tb._compile = stand_in_compile
        tb.load(verbose=True)
    """) + _CHECK_MODULE
    r = subprocess.run([sys.executable, "-c", code, rmsnorm._torch.__file__], env=_env(cache),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "compiled for another torch (version '0.0.1' -> " in r.stderr
    assert "rmsnorm.torch: compiling the torch module" in r.stderr
    assert r.stdout.strip() in _built(cache) and len(_built(cache)) == 1


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


# The compile-on-import path, whether or not the package holds an install-time module.
_NO_PREBUILT = "import rmsnorm._torch_build as tb; tb._read_record = lambda: None\n"
# Which module the import loaded, and that it works.
_CHECK_MODULE = textwrap.dedent("""
    import torch, rmsnorm, rmsnorm.torch as rt
    x = torch.randn(3, 8)
    assert torch.allclose(rt.rms_norm(x, (8,)), torch.nn.functional.rms_norm(x, (8,)))
    print(rmsnorm._torch.__file__)
""")


def _import_torch_module(env, code=_NO_PREBUILT + "import rmsnorm.torch"):
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
    tb._read_record = lambda: None  # not the module compiled at install time
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
