# The two commands: `make run` (the worked example) and `make test` (every
# test, plus the C suite again under AddressSanitizer + UBSan, and under
# ThreadSanitizer). `make check` is the quick loop: the C suite on this CPU's
# kernel set and the Python tests of the core ops.
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# ThreadSanitizer wants clang (gcc's works too where clang is missing)
TSAN_CC ?= $(shell command -v clang >/dev/null 2>&1 && echo clang || echo cc)
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
# A build run from a recipe: its own make, not a part of this one's jobserver
# (each build and ctest takes JOBS processes; `make test` runs stages side by side).
CMAKE_BUILD = env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL cmake --build
.PHONY: all build build-tests run test test-stages test-c test-asan test-tsan test-make asan-build \
  tsan-build check check-c install clean

# Plain `make` builds the library into $(BUILD): named here, before the
# fragments below add their own targets, so none of those becomes the default.
.DEFAULT_GOAL := all

# `make test` times its stages: a stage's recipe starts with
# $(call stage_begin,NAME) and ends with $(call stage_end,NAME), which write
# to $(STAGES) when `make test` sets it and do nothing otherwise;
# mk/stage_times.sh prints the table.
STAGES ?=
STAGE_DIR := $(BUILD)/test-stages
stage_begin = @$(if $(STAGES),date +%s.%N > $(STAGES)/$(1).begin,:)
stage_end = @$(if $(STAGES),date +%s.%N > $(STAGES)/$(1).end,:)

# Parts of the project add their own targets and tests here (mk/*.mk):
# each appends its test target to EXTRA_TESTS.
EXTRA_TESTS :=
-include $(sort $(wildcard mk/*.mk))

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	$(call stage_begin,build)
	$(CMAKE_BUILD) $(BUILD) -j $(JOBS)
	$(call stage_end,build)

# The test programs, which plain `make` leaves out (CMakeLists.txt).
build-tests: build
	$(call stage_begin,build-tests)
	$(CMAKE_BUILD) $(BUILD) -j $(JOBS) --target rmsnorm_tests
	$(call stage_end,build-tests)
# A test build's recipe (asan-build, tsan-build, arm64-build): everything in
# the build folder $(1), the test programs included, timed as the target's stage.
define build_all_stage
	$(call stage_begin,$@)
	$(CMAKE_BUILD) $(1) -j $(JOBS) --target all rmsnorm_tests
	$(call stage_end,$@)
endef

# mk/cli.mk sets RUN_CMD to `rmsnorm demo`; without it, the example program.
run: build
	$(if $(RUN_CMD),$(RUN_CMD),./$(BUILD)/examples/seed_example)

# Every stage, JOBS at a time where they do not depend on each other (each
# build and ctest also takes JOBS processes: a stage's serial tail, a
# download, leave the cores to another), each stage's output printed whole
# when it ends (-Otarget); then each stage's time, also when one failed.
# The Release build first (most stages need it), beside the Python suite's
# venv (a download), then the longest chains: the Python suite and the aarch64
# build with its runs under qemu.
TEST_FIRST := $(filter test-python test-arm64-if-available,$(EXTRA_TESTS))
TEST_STAGES = build $(TEST_FIRST) test-c test-asan test-tsan test-make \
  $(filter-out $(TEST_FIRST),$(EXTRA_TESTS))

test:
	@rm -rf $(STAGE_DIR) && mkdir -p $(STAGE_DIR) && date +%s.%N > $(STAGE_DIR)/start; \
	rc=0; $(MAKE) --no-print-directory -j $(JOBS) -Otarget STAGES=$(abspath $(STAGE_DIR)) \
	  test-stages || rc=$$?; \
	sh mk/stage_times.sh $(STAGE_DIR); exit $$rc

test-stages: $(TEST_STAGES)

test-c: build-tests
	$(call stage_begin,test-c)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(call stage_end,test-c)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRMSNORM_SANITIZE=ON $(CMAKE_FLAGS)

asan-build: $(ASAN_BUILD)/CMakeCache.txt
	$(call build_all_stage,$(ASAN_BUILD))

# On the suites' reduced size sets (RMSNORM_TEST_REDUCED=1, as test-tsan):
# every code path, every ragged row length (1-71, 127, 4095, 4096, 5120) and
# the exact-size buffers that make an over-read show, on fewer and smaller
# shapes; test-c runs the full sets.
test-asan: asan-build
	$(call stage_begin,test-asan)
	cd $(ASAN_BUILD) && RMSNORM_TEST_REDUCED=1 ctest --output-on-failure -j $(JOBS)
	$(call stage_end,test-asan)

# The C suite under ThreadSanitizer, once (the kernel sets do not differ in
# threading: the -scalar/-avx2 repeats are left out), on the suites' reduced
# size sets (RMSNORM_TEST_REDUCED=1: every code path, threaded ones included,
# on fewer and smaller shapes; a race shows on any shape that reaches it);
# test_threads is its stress test. OpenBLAS is not instrumented, so it runs
# on the caller's thread; die_after_fork=0 lets a forked child start threads
# (test_fork). Left out here, run in the other builds: the CLI's signal tests
# (TSan defers a signal to a thread blocked in a system call, so they would
# wait for their hang guard) and the MPI runs (Open MPI is not instrumented).
$(TSAN_BUILD)/CMakeCache.txt:
	CC=$(TSAN_CC) cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRMSNORM_SANITIZE_THREAD=ON $(CMAKE_FLAGS)

tsan-build: $(TSAN_BUILD)/CMakeCache.txt
	$(call build_all_stage,$(TSAN_BUILD))

test-tsan: tsan-build
	$(call stage_begin,test-tsan)
	cd $(TSAN_BUILD) && OPENBLAS_NUM_THREADS=1 RMSNORM_TEST_REDUCED=1 \
	  TSAN_OPTIONS="halt_on_error=1 die_after_fork=0 second_deadlock_stack=1" \
	  ctest --output-on-failure -j $(JOBS) -E '(-scalar|-avx2|install)$$|^cli_commands_|^mpi-'
	$(call stage_end,test-tsan)

# Plain `make` in a clean clone (no variables from this make) must build the
# library, the command and the examples into build/. It runs after the
# Release build: where ccache is installed (CMakeLists.txt puts it in front of
# the compiler), the clone's compiles are that build's, from the cache, and
# only the configure and the links run again.
test-make: build
	$(call stage_begin,test-make)
	@if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  echo "test-make: not a git checkout, skipped"; exit 0; fi; \
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	git clone -q . "$$tmp/clone" && start=$$(date +%s) && \
	env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u STAGES -u CMAKE_FLAGS \
	  make -C "$$tmp/clone" >"$$tmp/log" 2>&1 || { cat "$$tmp/log"; exit 1; }; \
	for f in build/librmsnorm.so build/librmsnorm.a build/tools/rmsnorm build/examples/seed_example; do \
	  test -e "$$tmp/clone/$$f" || { cat "$$tmp/log"; echo "test-make: plain make did not build $$f"; exit 1; }; \
	done; \
	echo "test-make: plain make in a clean clone built build/librmsnorm.so, librmsnorm.a, tools/rmsnorm, examples" \
	  "in $$(( $$(date +%s) - start )) s$$(command -v ccache >/dev/null && echo ' (through ccache)')"
	$(call stage_end,test-make)

# The quick loop after a change (a few minutes): the Release build's C suite
# on this CPU's kernel set (the other sets' repeats and the training demo's
# command run left out; `make test` runs them), then the Python tests of the
# core ops (mk/python.mk, check-python).
check: check-c check-python

check-c: build-tests
	@set=$$(./$(BUILD)/tools/rmsnorm info | sed -n 's/^kernel set: *//p'); \
	others=$$(echo "scalar avx2 avx512 neon" | tr ' ' '\n' | grep -vx "$$set" | paste -sd'|'); \
	echo "check-c: the C suite on kernel set $$set"; \
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -E '-('"$$others"')$$|^train-cli$$'

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean: clean-python
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
