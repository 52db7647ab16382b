# mk/arm64.mk - the aarch64 build, cross-compiled and tested under user-mode
# emulation (docs/arm64.md):
#   make test-arm64   cross-builds with gcc-aarch64-linux-gnu through
#                     cmake/toolchain-aarch64.cmake, then runs the whole C
#                     suite and the CLI tests under qemu-aarch64 with -cpu max
#                     (FEAT_FP16 present), and with -cpu cortex-a57 (an ARMv8.0
#                     core without it) the tests that run every kernel of every
#                     op, dtype and option (golden, isa) and the conversions:
#                     what finds an instruction that core lacks. Each run first
#                     checks that detection found what that CPU has. Under
#                     emulation the suites take their reduced size sets
#                     (RMSNORM_TEST_EMULATED=1).
# `make test` runs it when the cross compiler and qemu-aarch64 are installed
# (.ci/run installs them), and says so and skips it otherwise.

ARM64_BUILD ?= build-arm64
ARM64_CPUS ?= max cortex-a57
ARM64_CC ?= aarch64-linux-gnu-gcc
ARM64_QEMU ?= qemu-aarch64
ARM64_SYSROOT ?= /usr/aarch64-linux-gnu
# The ctest selection on each CPU (-R; empty: every test).
ARM64_TESTS_max :=
ARM64_TESTS_cortex-a57 := ^(golden|isa|convert|errors|seed-neon|forward-neon)$$

rparen := )
EXTRA_TESTS += test-arm64-if-available
.PHONY: test-arm64 test-arm64-if-available arm64-build

$(ARM64_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ARM64_BUILD) -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/toolchain-aarch64.cmake $(CMAKE_FLAGS)

arm64-build: $(ARM64_BUILD)/CMakeCache.txt
	$(call build_all_stage,$(ARM64_BUILD))

# For each CPU: `rmsnorm info` must name the features qemu gives that CPU
# (neon always; fp16 only on max), then ctest with the emulator set to it.
test-arm64: arm64-build
	$(call stage_begin,test-arm64)
	@set -e; start=$$(date +%s); \
	for cpu in $(ARM64_CPUS); do \
	  run="$(ARM64_QEMU) -L $(ARM64_SYSROOT) -cpu $$cpu"; \
	  info=$$($$run $(ARM64_BUILD)/tools/rmsnorm info); \
	  echo "$$info" | sed "s/^/[$$cpu] /"; \
	  echo "$$info" | grep -q '^kernel set: *neon' || { echo "test-arm64: $$cpu did not choose neon"; exit 1; }; \
	  if [ $$cpu = max ]; then echo "$$info" | grep -q '^cpu features:.* fp16' || { echo "test-arm64: fp16 not detected on $$cpu"; exit 1; }; \
	  else echo "$$info" | grep -q '^cpu features:.* fp16' && { echo "test-arm64: fp16 detected on $$cpu"; exit 1; }; fi; \
	  case $$cpu in $(foreach c,$(ARM64_CPUS),$(c)$(rparen) sel='$(ARM64_TESTS_$(c))';;) esac; \
	  echo "test-arm64: ctest under qemu-aarch64 -cpu $$cpu$${sel:+ (-R '$$sel')}"; \
	  cmake -DRMSNORM_QEMU_CPU=$$cpu $(ARM64_BUILD) >/dev/null; \
	  (cd $(ARM64_BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900 $${sel:+-R "$$sel"}); \
	done; \
	echo "test-arm64: passed on $(ARM64_CPUS) in $$(( $$(date +%s) - start )) s"
	$(call stage_end,test-arm64)

test-arm64-if-available:
	@if command -v $(ARM64_CC) >/dev/null 2>&1 && command -v $(ARM64_QEMU) >/dev/null 2>&1 && \
	   [ -d $(ARM64_SYSROOT) ]; then \
	  $(MAKE) --no-print-directory test-arm64; \
	else \
	  echo "test-arm64: skipped: needs $(ARM64_CC) and $(ARM64_QEMU) (Debian: gcc-aarch64-linux-gnu qemu-user; .ci/run installs them)"; \
	fi
