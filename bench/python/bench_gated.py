"""bench_gated.py - `python bench/python/bench_gated.py [--rounds N]`: the installed package's
gated RMSNorm and Gemma sandwich norms against transformers' own modules, in one process.

Gated (Mamba2, gate first, one statistic per group of d / --groups columns): transformers'
mamba2 MambaRMSNormGated against rmsnorm.torch's module of that name and the
rmsnorm.torch.gated_rms_norm op (round_before_weight=True, HF's roundings); gated (Qwen3-Next,
norm first, SiLU): transformers' qwen3_next Qwen3NextRMSNormGated against ours. Sandwich
(Gemma 2/3, between attention and MLP): Gemma3RMSNorm post-norm, the residual add,
Gemma3RMSNorm pre-norm against one rmsnorm.torch.sandwich_rms_norm(offset=True). Forward
(under no_grad, as inference runs) and forward+backward (gradients of every input and
weight; the sandwich's two outputs both get one, as in a decoder layer), in float32 and
bfloat16 (weights of the data's dtype, as a model after .to(dtype)), with torch's and
rmsnorm's thread count set alike. Every pair is first checked to agree (check()).

Every case of one dtype, shape and thread count is timed interleaved (the order reversed
every other round): in each round each callable runs one timed batch (calls lasting at least
--batch-ms, after a warm call); the table gives each one's median per-call time over the
rounds and speedup = HF / ours (> 1: rmsnorm is faster). Prints Markdown. Not part of the
package: it imports the installed one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

from bench import _cpu_name as cpu_name, batch, fmt  # bench.py beside this file

SHAPES = ["1x4096", "512x4096"]  # decode, prefill
EPS = 1e-6


def _modules(d: int, group: int, dtype, gen):
    """(HF, ours) pairs of the three norms with the same random weights, in dtype."""
    import torch
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated as HFMamba
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        Qwen3NextRMSNormGated as HFQwen)

    import rmsnorm.torch as rt

    def same(hf, ours, w):
        for m in (hf, ours):
            with torch.no_grad():
                m.weight.copy_(w)
            m.to(dtype)
        return hf, ours

    gated_w = lambda: 1.0 + 0.1 * torch.randn(d, generator=gen)  # noqa: E731  (ones at init)
    gemma_w = lambda: 0.1 * torch.randn(d, generator=gen)  # noqa: E731  (zeros at init: 1 + w)
    return {
        "mamba": same(HFMamba(d, group, eps=EPS), rt.MambaRMSNormGated(d, group, eps=EPS),
                      gated_w()),
        "qwen": same(HFQwen(d, eps=EPS), rt.Qwen3NextRMSNormGated(d, eps=EPS), gated_w()),
        "post": same(Gemma3RMSNorm(d, eps=EPS), Gemma3RMSNorm(d, eps=EPS), gemma_w()),
        "pre": same(Gemma3RMSNorm(d, eps=EPS), Gemma3RMSNorm(d, eps=EPS), gemma_w()),
    }


def cases(rows: int, d: int, group: int, dtype):
    """(callables {key: fn}, table rows [(case, hf key, ours key)]) for one shape and dtype;
    forward keys start with "fwd:", forward+backward ones with "bwd:"."""
    import torch

    import rmsnorm.torch as rt

    gen = torch.Generator().manual_seed(0)
    rand = lambda: torch.randn(rows, d, generator=gen).to(dtype)  # noqa: E731
    x, z, a, h, dy, dr = (rand() for _ in range(6))
    mods = _modules(d, group, dtype, gen)
    (hm, om), (hq, oq) = mods["mamba"], mods["qwen"]
    (hpost, opost), (hpre, opre) = mods["post"], mods["pre"]
    wm, wq = om.weight.detach(), oq.weight.detach()
    wpost, wpre = opost.weight.detach(), opre.weight.detach()
    xg, zg, ag, hg = (t.clone().requires_grad_() for t in (x, z, a, h))

    def hf_sandwich(a_, h_, post, pre):
        h2 = h_ + post(a_)
        return pre(h2), h2

    def our_sandwich(a_, h_, post, pre):
        return rt.sandwich_rms_norm(a_, h_, post.weight.shape, post.weight, pre.weight, EPS,
                                    offset=True)

    def gated_bwd(m):
        return lambda: torch.autograd.grad(m(xg, zg), (xg, zg, m.weight), dy)

    def sandwich_bwd(f, post, pre):
        return lambda: torch.autograd.grad(f(ag, hg, post, pre),
                                           (ag, hg, post.weight, pre.weight), (dy, dr))

    fns = {
        "fwd:mamba hf": lambda: hm(x, z),
        "fwd:mamba module": lambda: om(x, z),
        "fwd:mamba op": lambda: rt.gated_rms_norm(x, z, wm, EPS, group_size=group,
                                                  round_before_weight=True),
        "bwd:mamba hf": gated_bwd(hm),
        "bwd:mamba module": gated_bwd(om),
        "fwd:qwen hf": lambda: hq(x, z),
        "fwd:qwen module": lambda: oq(x, z),
        "fwd:qwen op": lambda: rt.gated_rms_norm(x, z, wq, EPS, norm_before_gate=True,
                                                 round_before_weight=True),
        "bwd:qwen hf": gated_bwd(hq),
        "bwd:qwen module": gated_bwd(oq),
        "fwd:sandwich hf": lambda: hf_sandwich(a, h, hpost, hpre),
        "fwd:sandwich op": lambda: rt.sandwich_rms_norm(a, h, (d,), wpost, wpre, EPS,
                                                        offset=True),
        "bwd:sandwich hf": sandwich_bwd(hf_sandwich, hpost, hpre),
        "bwd:sandwich op": sandwich_bwd(our_sandwich, opost, opre),
    }
    table = [
        (f"Mamba2 gated (group {group}), fwd, module", "fwd:mamba hf", "fwd:mamba module"),
        (f"Mamba2 gated (group {group}), fwd, op", "fwd:mamba hf", "fwd:mamba op"),
        (f"Mamba2 gated (group {group}), fwd+bwd", "bwd:mamba hf", "bwd:mamba module"),
        ("Qwen3-Next gated, fwd, module", "fwd:qwen hf", "fwd:qwen module"),
        ("Qwen3-Next gated, fwd, op", "fwd:qwen hf", "fwd:qwen op"),
        ("Qwen3-Next gated, fwd+bwd", "bwd:qwen hf", "bwd:qwen module"),
        ("Gemma3 sandwich, fwd", "fwd:sandwich hf", "fwd:sandwich op"),
        ("Gemma3 sandwich, fwd+bwd", "bwd:sandwich hf", "bwd:sandwich op"),
    ]
    return fns, table


def check(fns: dict, table: list, dtype) -> None:
    """Each pair's results agree: the largest difference at most 1e-5 (float32) or 2e-2
    (bfloat16: HF rounds each step to bfloat16, we once) of the largest HF value."""
    import torch

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name, hf, ours in table:
        with torch.enable_grad() if hf.startswith("bwd:") else torch.no_grad():
            want, got = fns[hf](), fns[ours]()
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            w, g = w.double(), g.double()
            err, scale = (g - w).abs().max().item(), w.abs().max().item()
            if g.shape != w.shape or not err <= tol * scale:
                raise AssertionError(f"{name}: result {i} differs from HF's by {err:.3g} "
                                     f"(largest value {scale:.3g})")


def run_shape(rows: int, d: int, group: int, dtype, rounds: int, batch_s: float):
    """Yields (case, HF median s, ours median s) for one shape, dtype and thread count."""
    fns, table = cases(rows, d, group, dtype)
    check(fns, table, dtype)
    yield from time_cases(fns, table, rounds, batch_s)


def time_cases(fns: dict, table: list, rounds: int, batch_s: float):
    """Times fns interleaved (keys starting with "bwd:" under autograd, the others under
    no_grad) and yields (case, HF median s, ours median s) for each row of table."""
    import torch

    def mode(key):  # forward cases without autograd, as inference runs
        return torch.enable_grad() if key.startswith("bwd:") else torch.no_grad()

    keys = list(fns)
    inner = {}
    for k in keys:
        with mode(k):
            inner[k] = batch(fns[k], batch_s)
    samples = {k: [] for k in keys}
    for r in range(rounds):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            fn, n = fns[k], inner[k]
            with mode(k):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples[k].append((time.perf_counter() - t0) / n)
    med = {k: statistics.median(v) for k, v in samples.items()}
    for name, hf, ours in table:
        yield name, med[hf], med[ours]


def thread_counts(spec: str):
    """Yields each count of the comma-separated spec with torch's and rmsnorm's thread
    counts set to it; both are restored afterwards."""
    import torch

    import rmsnorm

    before = torch.get_num_threads()
    try:
        for n in (int(t) for t in spec.split(",")):
            torch.set_num_threads(n)
            rmsnorm.set_num_threads(n)
            yield n
    finally:
        torch.set_num_threads(before)
        rmsnorm.set_num_threads(0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/python/bench_gated.py",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated ROWSxD")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")
    ap.add_argument("--groups", type=int, default=8,
                    help="Mamba2's groups per row (group_size = D / groups)")
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds (median)")
    ap.add_argument("--batch-ms", type=float, default=10.0, help="least time of one batch")
    ap.add_argument("--quick", action="store_true", help="--rounds 5 --batch-ms 5")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.batch_ms = 5, 5.0

    import torch
    import transformers

    import rmsnorm
    import rmsnorm.torch  # noqa: F401  (compiles the torch module on first import, untimed)

    t_start, load0 = time.perf_counter(), os.getloadavg()
    print(f"{datetime.date.today()} | rmsnorm {rmsnorm.__version__} (kernels {rmsnorm.isa()}) | "
          f"torch {torch.__version__} (cpu capability "
          f"{torch.backends.cpu.get_cpu_capability()}) | transformers "
          f"{transformers.__version__} | {cpu_name()}, {os.cpu_count()} CPUs | python "
          f"{platform.python_version()} | load average {load0[0]:.2f}")
    print(f"medians of {args.rounds} interleaved rounds, batches of >= {args.batch_ms:g} ms; "
          "speedup = HF / rmsnorm (> 1: rmsnorm is faster)\n")
    print("| dtype | shape | threads | case | HF | rmsnorm | speedup |")
    print("|---|---|---:|---|---:|---:|---:|")
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname.strip())
        for shape in args.shapes.split(","):
            rows, d = (int(v) for v in shape.lower().split("x"))
            group = d // args.groups
            for n in thread_counts(args.threads):
                for name, th, to in run_shape(rows, d, group, dtype, args.rounds,
                                              args.batch_ms / 1e3):
                    print(f"| {dname} | {rows}x{d} | {n} | {name} | {fmt(th)} | "
                          f"{fmt(to)} | {th / to:.2f}x |", flush=True)
    load1 = os.getloadavg()
    print(f"\n{time.perf_counter() - t_start:.0f} s; load average (1, 5, 15 min) at the start "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, at the end "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
