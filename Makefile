# The two commands: `make run` (the worked example) and `make test` (every
# test, plus the C suite again under AddressSanitizer + UBSan).
BUILD ?= build
ASAN_BUILD ?= build-asan
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build run test test-c test-asan install clean

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

test: test-c test-asan $(EXTRA_TESTS)

test-c: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRMSNORM_SANITIZE=ON $(CMAKE_FLAGS)

test-asan: $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean: clean-python
	rm -rf $(BUILD) $(ASAN_BUILD)
