# mk/bench.mk - `make bench`: runs `rmsnorm bench` over the standard shapes
# and dtypes, keeps the CSV and the table, and plots % of the copy limit
# per shape (gnuplot, installed from Debian when missing); then the quantized
# outputs against the fp32 forward (bench_fused quant) and Gemma's sandwich
# norms against their three separate calls (bench_fused sandwich), gated
# RMSNorm against the copy limit of its own bytes (bench_fused gated),
# QK-norm + RoPE against QK-norm then a rotation pass (bench_fused rope),
# and decode-sized calls (1-64 rows, one thread, in cache) against plain
# two-pass loops of the same SIMD set, one-shot and plan (QK-norm: one-shot
# only) (bench_decode).
# The command's measuring code and the plot script are in bench/c/; the CSV and
# the plot are written to BENCH_DIR.
BENCH_DIR ?= bench
BENCH_PLOT := bench/c/plot.sh
RMSNORM_BENCH_ARGS ?=

.PHONY: bench gnuplot

gnuplot:
	@command -v gnuplot >/dev/null || { \
	  echo "installing gnuplot (Debian: gnuplot-nox)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gnuplot-nox; }

bench: build gnuplot
	./$(BUILD)/tools/rmsnorm bench $(RMSNORM_BENCH_ARGS) --csv > $(BENCH_DIR)/results.csv
	column -s, -t < $(BENCH_DIR)/results.csv
	$(BENCH_PLOT) $(BENCH_DIR)/results.csv $(BENCH_DIR)/bandwidth.png
	@echo "quantized outputs against the fp32-output forward (docs/quantized.md):"
	./$(BUILD)/bench_fused quant 11
	@echo "sandwich norms against forward + add + forward (docs/fusions.md):"
	./$(BUILD)/bench_fused sandwich 11
	@echo "gated RMSNorm against the copy limit of its bytes (docs/gated.md):"
	./$(BUILD)/bench_fused gated 11
	@echo "QK-norm + RoPE against QK-norm then a rotation pass (docs/rope.md):"
	./$(BUILD)/bench_fused rope 11
	@echo "decode-sized calls against plain two-pass loops of the same SIMD set (docs/kernels.md):"
	./$(BUILD)/bench_decode 11
