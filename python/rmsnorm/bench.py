"""bench.py - `python -m rmsnorm.bench`: rmsnorm.torch against torch's own CPU
kernels (F.rms_norm, the HF-Llama composite, F.layer_norm), forward and
forward+backward, on 1 thread and on all, as medians of timed batches, with
ratios (> 1: ours is faster). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

SHAPES = ["4096x4096", "2048x8192", "512x4096", "16x4096", "1x4096", "8x5120", "65536x128",
          "1x1048576"]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_call(fn, reps: int, min_batch_s: float) -> float:
    """Median seconds per call: batches of calls lasting at least min_batch_s."""
    fn()  # warm: first-touch allocations, thread pools
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_batch_s / one))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def cases(torch, F, rt, rows: int, d: int, dtype):
    """(op, {implementation: callable}) for one shape; an op without "torch"
    is compared with the torch time of the op before it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=g).to(dtype)
    dy = torch.randn(rows, d, generator=g).to(dtype)
    w = (torch.randn(d, generator=g) * 0.1 + 1).to(dtype)
    b = (torch.randn(d, generator=g) * 0.1).to(dtype)
    eps = 1e-6
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))

    def hf_llama(x, w):  # transformers' LlamaRMSNorm.forward
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w * h.to(x.dtype)

    def ours_llama(x, w):  # rmsnorm.torch.LlamaRMSNorm.forward
        return rt.rms_norm(x, (d,), w, eps, round_before_weight=True)

    def ours(x, w):
        return rt.rms_norm(x, (d,), w, eps)

    def fwd(f, *args):
        def run():
            with torch.no_grad():
                f(*args)
        return run

    def fwd_bwd(f, x, *params):
        inputs = (x,) + params

        def run():
            torch.autograd.grad(f(x, *params), inputs, dy)
        return run

    rms = {"torch": lambda x, w: F.rms_norm(x, (d,), w, eps), "hf": hf_llama, "ours": ours}
    if dtype in (torch.float16, torch.bfloat16):  # HF's rounding order differs there
        rms["ours_hf"] = ours_llama
    ln = {"torch": lambda x, w, b: F.layer_norm(x, (d,), w, b, eps),
          "ours": lambda x, w, b: rt.layer_norm(x, (d,), w, b, eps)}
    out = torch.empty_like(x)
    return [
        ("rms_norm fwd", {k: fwd(f, x, w) for k, f in rms.items()}),
        # The same into a reused output: no fresh pages to fault in (torch: its
        # allocating call of the row above).
        ("rms_norm fwd, out=", {"ours": fwd(lambda x, w: rt.rms_norm(x, (d,), w, eps, out=out),
                                            x, w)}),
        ("rms_norm fwd+bwd", {k: fwd_bwd(f, xg, wg) for k, f in rms.items()}),
        ("layer_norm fwd", {k: fwd(f, x, w, b) for k, f in ln.items()}),
        ("layer_norm fwd+bwd", {k: fwd_bwd(f, xg, wg, bg) for k, f in ln.items()}),
    ]


def fmt_time(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rmsnorm.bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer and shorter repetitions")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated ROWSxD")
    ap.add_argument("--threads", default=None,
                    help="comma-separated thread counts (default: 1 and all CPUs)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import rmsnorm
    import rmsnorm.torch as rt

    dtype = getattr(torch, args.dtype)
    ncpu = os.cpu_count() or 1
    threads = ([int(t) for t in args.threads.split(",")] if args.threads
               else sorted({1, ncpu}))
    reps, min_batch = (5, 0.005) if args.quick else (15, 0.02)
    shapes = [tuple(int(n) for n in s.lower().split("x")) for s in args.shapes.split(",")]

    print(f"rmsnorm {rmsnorm.__version__} (kernels {rmsnorm.isa()}), torch {torch.__version__} "
          f"(cpu capability {torch.backends.cpu.get_cpu_capability()}), {args.dtype}, "
          f"{_cpu_name()}, {ncpu} CPUs, python {platform.python_version()}")
    print(f"median of {reps} batches of >= {min_batch * 1e3:.0f} ms; x = torch time / ours "
          "(> 1: rmsnorm is faster); HF = transformers' LlamaRMSNorm composite (compared "
          "with rmsnorm.torch.LlamaRMSNorm's call in half precision)\n")
    print("| shape | threads | op | torch | HF | rmsnorm | x torch | x HF |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    before = torch.get_num_threads()
    try:
        for rows, d in shapes:
            for n in threads:
                torch.set_num_threads(n)
                prev = {}
                for op, impls in cases(torch, F, rt, rows, d, dtype):
                    t = {k: time_call(f, reps, min_batch) for k, f in impls.items()}
                    t.setdefault("torch", prev.get("torch"))
                    prev = t
                    hf = fmt_time(t["hf"]) if "hf" in t else "—"
                    xhf = (f"{t['hf'] / t.get('ours_hf', t['ours']):.2f}" if "hf" in t
                           else "—")
                    print(f"| {rows}x{d} | {n} | {op} | {fmt_time(t['torch'])} | {hf} | "
                          f"{fmt_time(t['ours'])} | {t['torch'] / t['ours']:.2f} | {xhf} |",
                          flush=True)
    finally:
        torch.set_num_threads(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
