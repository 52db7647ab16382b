# mk/train.mk - the training demo (examples/train, rmsnorm-train):
#   make train-demo     no norm, LayerNorm, RMSNorm and pRMSNorm at one small
#                       configuration, three seeds, on 2 threads -> bench/train/
#   make train-stress   twice as deep at a higher learning rate -> bench/train/stress/
# Each prints the summary table and writes summary.csv, runs.csv, one CSV per
# run, table.txt and loss.png (gnuplot, installed from Debian when missing,
# see mk/bench.mk). The text is the Debian package `fortunes`, installed here
# when missing. Without a BLAS at configure time rmsnorm-train is not built:
# then these targets say so and do nothing.

TRAIN_DIR ?= bench/train
TRAIN_BIN = $(BUILD)/examples/train/rmsnorm-train
TRAIN_THREADS ?= 2
# the norms stay on one thread: at 1024 x 128 rows librmsnorm would split the
# fused add + norm (2 MiB moved) over 2 threads but not LayerNorm (1 MiB), and
# on a shared machine a woken thread can cost more than the whole call
TRAIN_COMMON = --norm all --threads $(TRAIN_THREADS) --norm-threads 1 --dim 128 --heads 4 \
  --seq 64 --batch 16 --eval-every 25 --eval-batches 8
TRAIN_DEMO_ARGS ?= $(TRAIN_COMMON) --layers 4 --seed 1,2,3 --steps 300 --lr 3e-3
TRAIN_STRESS_ARGS ?= $(TRAIN_COMMON) --layers 8 --seed 1,2,3 --steps 150 --lr 1e-2

.PHONY: train-demo train-stress train-data

FORTUNES = /usr/share/games/fortunes/literature

train-data:
	@test -r $(FORTUNES) || { \
	  echo "installing the demo's text (Debian: fortunes)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq fortunes; }

# $(call train_run,ARGS,DIR,TITLE): OpenBLAS 0.3.21 (Debian 12) takes CPUs
# newer than it knows for a Prescott and runs SSE3 kernels; there the run
# names the kernels that fit the CPU (OPENBLAS_CORETYPE, unless already set).
define train_run
	@if [ ! -x $(TRAIN_BIN) ]; then \
	  echo "$@: skipped: rmsnorm-train was not built (no BLAS with cblas.h at configure time)"; \
	  exit 0; fi; \
	set -e; \
	if [ -z "$${OPENBLAS_CORETYPE:-}" ] && [ "$$($(TRAIN_BIN) --blas-core)" = Prescott ]; then \
	  if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && \
	     grep -qw avx512dq /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; \
	  elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then \
	    export OPENBLAS_CORETYPE=Haswell; fi; \
	  if [ -n "$${OPENBLAS_CORETYPE:-}" ]; then \
	    echo "$@: OpenBLAS does not know this CPU (Prescott kernels); using OPENBLAS_CORETYPE=$$OPENBLAS_CORETYPE"; fi; \
	fi; \
	mkdir -p $(2); rm -f $(2)/*.csv $(2)/table.txt; \
	start=$$(date +%s); \
	$(TRAIN_BIN) $(1) --out $(2) > $(2)/table.txt; \
	end=$$(date +%s); \
	{ echo "command: rmsnorm-train $(strip $(1)) --out $(2)"; \
	  echo "machine: $$(lscpu | sed -n 's/^Model name: *//p'), $$(nproc) CPUs; BLAS core $$($(TRAIN_BIN) --blas-core); $$((end - start)) s"; \
	} >> $(2)/table.txt; \
	cat $(2)/table.txt; \
	examples/train/plot.sh $(2) $(2)/loss.png "$(3)"
endef

train-demo: build train-data gnuplot
	$(call train_run,$(TRAIN_DEMO_ARGS),$(TRAIN_DIR),validation loss: 4 layers at lr 3e-3 (3 seeds))

train-stress: build train-data gnuplot
	$(call train_run,$(TRAIN_STRESS_ARGS),$(TRAIN_DIR)/stress,validation loss: 8 layers at lr 1e-2 (3 seeds))
