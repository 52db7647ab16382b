# The two commands: `make run` (the worked example) and `make test` (every
# test, plus the C suite again under AddressSanitizer + UBSan, and under
# ThreadSanitizer).
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# ThreadSanitizer wants clang (gcc's works too where clang is missing)
TSAN_CC ?= $(shell command -v clang >/dev/null 2>&1 && echo clang || echo cc)
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build run test test-c test-asan test-tsan test-make install clean

# Plain `make` builds the library into $(BUILD): named here, before the
# fragments below add their own targets, so none of those becomes the default.
.DEFAULT_GOAL := all

# Parts of the project add their own targets and tests here (mk/*.mk):
# each appends its test target to EXTRA_TESTS.
EXTRA_TESTS :=
-include $(sort $(wildcard mk/*.mk))

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# mk/cli.mk sets RUN_CMD to `rmsnorm demo`; without it, the example program.
run: build
	$(if $(RUN_CMD),$(RUN_CMD),./$(BUILD)/examples/seed_example)

test: test-c test-asan test-tsan test-make $(EXTRA_TESTS)

test-c: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRMSNORM_SANITIZE=ON $(CMAKE_FLAGS)

test-asan: $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

# The C suite under ThreadSanitizer, once (the kernel sets do not differ in
# threading: the -scalar/-avx2 repeats are left out); test_threads is its
# stress test. OpenBLAS is not instrumented, so it runs on the caller's
# thread; die_after_fork=0 lets a forked child start threads (test_fork).
# Left out here, run in the other builds: the CLI's signal tests (TSan defers
# a signal to a thread blocked in a system call, so they would wait for their
# hang guard) and the MPI runs (Open MPI is not instrumented).
$(TSAN_BUILD)/CMakeCache.txt:
	CC=$(TSAN_CC) cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRMSNORM_SANITIZE_THREAD=ON $(CMAKE_FLAGS)

test-tsan: $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && OPENBLAS_NUM_THREADS=1 \
	  TSAN_OPTIONS="halt_on_error=1 die_after_fork=0 second_deadlock_stack=1" \
	  ctest --output-on-failure -j $(JOBS) -E '(-scalar|-avx2|install)$$|^cli_commands_|^mpi-'

# Plain `make` in a clean clone (no variables from this make) must build the
# library and the command into build/. The test programs are left out of that
# build (test-c builds them); everything else is what a user's `make` does.
test-make:
	@if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  echo "test-make: not a git checkout, skipped"; exit 0; fi; \
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	git clone -q . "$$tmp/clone" && \
	env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS CMAKE_FLAGS=-DRMSNORM_BUILD_TESTS=OFF \
	  make -C "$$tmp/clone" >"$$tmp/log" 2>&1 || { cat "$$tmp/log"; exit 1; }; \
	for f in build/librmsnorm.so build/librmsnorm.a build/tools/rmsnorm; do \
	  test -e "$$tmp/clone/$$f" || { cat "$$tmp/log"; echo "test-make: plain make did not build $$f"; exit 1; }; \
	done; \
	echo "test-make: plain make in a clean clone built build/librmsnorm.so, librmsnorm.a, tools/rmsnorm"

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean: clean-python
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
