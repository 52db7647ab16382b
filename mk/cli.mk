# mk/cli.mk - the rmsnorm command's part of the Makefile (included by the top
# Makefile): `make run` runs `rmsnorm demo` through RUN_CMD; `make fuzz`
# fuzzes the .npy reader with libFuzzer for FUZZ_TIME seconds; `make test`
# runs test-cli-fuzz, which replays the fuzz corpus under libFuzzer itself
# (ctest replays it too, without libFuzzer, in both builds), and
# test-cli-valgrind, the command under valgrind memcheck on that corpus.

RUN_CMD = ./$(BUILD)/tools/rmsnorm demo

FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 60
FUZZ_CC ?= clang
FUZZ_CORPUS = tests/cli/fuzz-corpus
FUZZ_SRCS = tools/npy.c tests/cli/fuzz_npy.c
FUZZ_FLAGS = -std=c11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wpedantic \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all

.PHONY: fuzz fuzz-build test-cli-fuzz test-cli-valgrind

$(FUZZ_BUILD)/fuzz_npy: $(FUZZ_SRCS) tools/npy.h
	@mkdir -p $(FUZZ_BUILD)
	$(FUZZ_CC) $(FUZZ_FLAGS) -Itools $(FUZZ_SRCS) -o $@

fuzz-build: $(FUZZ_BUILD)/fuzz_npy

# New inputs go to $(FUZZ_BUILD)/corpus; crashes to $(FUZZ_BUILD)/crash-*.
# After fixing one, copy it into $(FUZZ_CORPUS)/ so every `make test` replays it.
fuzz: $(FUZZ_BUILD)/fuzz_npy
	@mkdir -p $(FUZZ_BUILD)/corpus
	$(FUZZ_BUILD)/fuzz_npy -max_total_time=$(FUZZ_TIME) -dict=tests/cli/npy.dict \
	  -artifact_prefix=$(FUZZ_BUILD)/ -print_final_stats=1 $(FUZZ_BUILD)/corpus $(FUZZ_CORPUS)

# Each corpus input run once (-runs=0) under libFuzzer + ASan + UBSan; skipped
# with a note where the compiler cannot build libFuzzer targets.
test-cli-fuzz:
	$(call stage_begin,test-cli-fuzz)
	@mkdir -p $(FUZZ_BUILD)
	@if printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
	    > $(FUZZ_BUILD)/probe.c && \
	    $(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_BUILD)/probe.c -o $(FUZZ_BUILD)/probe >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory fuzz-build && \
	  $(FUZZ_BUILD)/fuzz_npy -runs=0 $(FUZZ_CORPUS); \
	else \
	  echo "test-cli-fuzz: skipped ($(FUZZ_CC) cannot build libFuzzer targets; ctest replays the corpus)"; \
	fi
	$(call stage_end,test-cli-fuzz)

EXTRA_TESTS += test-cli-fuzz

# The built command under valgrind memcheck on every corpus input, as a file
# and through a pipe, JOBS at a time; any memcheck error (or a definite leak)
# fails. Skipped with a note where valgrind is missing (.ci/run installs it).
test-cli-valgrind: build
	$(call stage_begin,test-cli-valgrind)
	@if command -v valgrind >/dev/null 2>&1; then \
	  sh tests/cli/valgrind_corpus.sh $(BUILD)/tools/rmsnorm $(FUZZ_CORPUS) $(JOBS); \
	else \
	  echo "test-cli-valgrind: skipped (no valgrind; .ci/run installs it)"; \
	fi
	$(call stage_end,test-cli-valgrind)

EXTRA_TESTS += test-cli-valgrind
