# mk/python.mk - the Python package in python/. `make test-python` creates .venv
# when missing, installs what the tests need from PyPI when missing, installs the
# package with the README's command when its sources changed (stamp files; the
# install compiles the torch module against the venv's torch and takes the
# Release build's library, python/CMakeLists.txt), checks that the torch module
# loads, then runs pytest. `make bench-python` runs the benchmark (and installs
# its peers, bench/python/requirements.txt, when missing).

PYTHON ?= python3
VENV ?= .venv
VENV_PY := $(VENV)/bin/python
PY_REQUIREMENTS := python/requirements-test.txt
PY_BENCH_REQUIREMENTS := bench/python/requirements.txt
PY_DEPS_STAMP := $(VENV)/.rmsnorm-deps.stamp
PY_BENCH_STAMP := $(VENV)/.rmsnorm-bench.stamp
PY_PKG_STAMP := $(VENV)/.rmsnorm-package.stamp
# Everything the installed package is built from.
PY_PKG_SOURCES := $(shell find python/rmsnorm python/src python/CMakeLists.txt \
  python/pyproject.toml CMakeLists.txt cmake include src -type f ! -name '*.pyc' 2>/dev/null)
# No wheel cache: torch's CUDA wheels would take gigabytes twice (cache and
# venv) on machines whose disk the sanitizer builds already share.
PIP := $(VENV_PY) -m pip --disable-pip-version-check --no-cache-dir
# The torch module's cache (where a torch other than the install's gets its
# module compiled on first import), inside the build folder so that
# clean-python clears it.
PY_RUN := RMSNORM_BUILD_CACHE=$(abspath python/build/torch-cache) $(VENV_PY)
TORCH_INDEX_URL ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: test-python check-python bench-python python-install clean-python

# Debian's own python3 needs python3-venv for `-m venv`: installed when root.
$(VENV_PY):
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && \
	    $(PYTHON) -m venv $(VENV); \
	  else echo "mk/python.mk: '$(PYTHON) -m venv' failed; install python3-venv" >&2; exit 1; fi; }

# pip skips what is already installed, so this only downloads what is missing.
$(PY_DEPS_STAMP): $(PY_REQUIREMENTS) | $(VENV_PY)
	$(call stage_begin,python-deps)
	$(if $(TORCH_INDEX_URL),$(PIP) install --progress-bar off --index-url $(TORCH_INDEX_URL) torch)
	$(PIP) install --progress-bar off -r $(PY_REQUIREMENTS)
	touch $@
	$(call stage_end,python-deps)

# The README's command (pip builds in isolation, fetching scikit-build-core and
# numpy), after the Release build, whose library the package takes
# (python/CMakeLists.txt) rather than compiling its own; ccache, where
# installed, serves the modules' unchanged sources.
$(PY_PKG_STAMP): $(PY_DEPS_STAMP) $(PY_PKG_SOURCES) | build
	$(call stage_begin,python-install)
	$(PIP) install --progress-bar off ./python
	touch $@
	$(call stage_end,python-install)

python-install: $(PY_PKG_STAMP)

# Which torch module loads (the one compiled at install, or one compiled into
# the cache now, its warnings shown) is said before pytest, so that no test
# waits for a compile and a compile error stops here.
# The C block encoders' bytes against gguf-py and the numpy transcriptions, and
# rmsnorm_dequantize against the package's dequantize, run here too, with the
# venv's gguf, numpy and ml_dtypes (ctest's own python may lack them).
test-python: $(PY_PKG_STAMP) build-tests
	$(call stage_begin,test-python)
	$(PY_RUN) -m rmsnorm._torch_build
	$(PY_RUN) -m pytest python/tests $(PYTEST_ARGS)
	$(VENV_PY) tests/blocks/check_blocks_oracle.py $(BUILD)/tests/blocks_tool
	$(VENV_PY) tests/blocks/check_dequantize.py $(BUILD)/tests/blocks_tool \
	  $(BUILD)/tests/dequantize_tool
	$(call stage_end,test-python)

# `make check`'s Python part: the tests of the core ops, numpy and torch,
# against the Release build's library (LD_LIBRARY_PATH goes before the
# package's RUNPATH), so that a change in src/ needs no reinstall; the
# package is reinstalled when its own sources or the public header change.
PY_CHECK_TESTS ?= python/tests/test_numpy.py python/tests/test_ops.py python/tests/test_errors.py
PY_CHECK_STAMP := $(VENV)/.rmsnorm-package-check.stamp
PY_CHECK_SOURCES := $(filter-out src/%,$(PY_PKG_SOURCES))

$(PY_CHECK_STAMP): $(PY_DEPS_STAMP) $(PY_CHECK_SOURCES) | build
	$(PIP) install --progress-bar off ./python
	touch $@

check-python: $(PY_CHECK_STAMP) build
	LD_LIBRARY_PATH=$(abspath $(BUILD))$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} \
	  $(PY_RUN) -m pytest -q $(PY_CHECK_TESTS) $(PYTEST_ARGS)

# The benchmark's peers beyond the tests' (onnxruntime, and onnx to build its model).
$(PY_BENCH_STAMP): $(PY_BENCH_REQUIREMENTS) $(PY_DEPS_STAMP)
	$(PIP) install --progress-bar off -r $(PY_BENCH_REQUIREMENTS)
	touch $@

bench-python: $(PY_PKG_STAMP) $(PY_BENCH_STAMP)
	$(PY_RUN) bench/python/bench.py $(BENCH_ARGS)

clean-python:
	rm -rf python/build $(PY_PKG_STAMP) $(PY_CHECK_STAMP)

EXTRA_TESTS += test-python

