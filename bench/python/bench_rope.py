"""bench_rope.py - `python bench/python/bench_rope.py [--rounds N]`: the installed package's
QK-norm + RoPE torch op against transformers' own composition, in one process.

Qwen3's attention between its projections and the attention itself: transformers' qwen3
Qwen3RMSNorm q_norm and k_norm over each head, the transposes to (batch, heads, tokens,
head_dim), then apply_rotary_pos_emb with the cos and sin a rotary embedding module
returns (NeoX style, theta 1e6); against rmsnorm.torch.cos_sin_table of that cos and sin
and one rmsnorm.torch.qk_norm_rope for Q and one for K (what patch(model, qk_rope=True)
runs). 32 Q heads and 8 K heads of 128 (Qwen3-8B), decode (1 token) and prefill (512
tokens), float32 and bfloat16; forward under no_grad, and forward + backward (gradients
of Q, K and both weights). Every pair is checked to agree first, and timed interleaved as
bench_gated.py times its cases. Prints Markdown. Not part of the package.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

from bench import _cpu_name as cpu_name, fmt  # bench.py beside this file
from bench_gated import check, thread_counts, time_cases  # the same check and timing

TOKENS = [1, 512]  # decode, prefill
Q_HEADS, K_HEADS, HEAD_DIM, THETA, EPS = 32, 8, 128, 1e6, 1e-6


def cases(tokens: int, dtype):
    """(callables {key: fn}, table rows [(case, hf key, ours key)]) for one shape and dtype."""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    import rmsnorm.torch as rt

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, tokens, Q_HEADS, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(1, tokens, K_HEADS, HEAD_DIM, generator=gen).to(dtype)
    dq = torch.randn(1, Q_HEADS, tokens, HEAD_DIM, generator=gen).to(dtype)
    dk = torch.randn(1, K_HEADS, tokens, HEAD_DIM, generator=gen).to(dtype)
    # the rotary module's output for positions 100 ... (a decode step sits past its prompt)
    inv = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    freqs = (100 + torch.arange(tokens, dtype=torch.float64))[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    norms = []
    for _ in range(2):
        m = Qwen3RMSNorm(HEAD_DIM, eps=EPS)
        with torch.no_grad():
            m.weight.copy_(1.0 + 0.1 * torch.randn(HEAD_DIM, generator=gen))
        norms.append(m.to(dtype))
    q_norm, k_norm = norms
    wq, wk = q_norm.weight, k_norm.weight
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()

    def hf(q_, k_):
        return apply_rotary_pos_emb(q_norm(q_).transpose(1, 2), k_norm(k_).transpose(1, 2),
                                    cos, sin)

    def ours(q_, k_):
        table = rt.cos_sin_table(cos, sin)
        return (rt.qk_norm_rope(q_, wq, table, EPS).transpose(1, 2),
                rt.qk_norm_rope(k_, wk, table, EPS).transpose(1, 2))

    def fwd_bwd(f):
        return lambda: torch.autograd.grad(f(qg, kg), (qg, kg, wq, wk), (dq, dk))

    fns = {"fwd:hf": lambda: hf(q, k), "fwd:op": lambda: ours(q, k),
           "bwd:hf": fwd_bwd(hf), "bwd:op": fwd_bwd(ours)}
    table = [("QK-norm + RoPE, fwd", "fwd:hf", "fwd:op"),
             ("QK-norm + RoPE, fwd+bwd", "bwd:hf", "bwd:op")]
    return fns, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/python/bench_rope.py",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)),
                    help="comma-separated token counts")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds (median)")
    ap.add_argument("--batch-ms", type=float, default=10.0, help="least time of one batch")
    args = ap.parse_args(argv)

    import torch
    import transformers

    import rmsnorm
    import rmsnorm.torch  # noqa: F401  (compiles the torch module on first import, untimed)

    t_start, load0 = time.perf_counter(), os.getloadavg()
    print(f"{datetime.date.today()} | rmsnorm {rmsnorm.__version__} (kernels {rmsnorm.isa()}) | "
          f"torch {torch.__version__} | transformers {transformers.__version__} | "
          f"{cpu_name()}, {os.cpu_count()} CPUs | python {platform.python_version()} | "
          f"load average {load0[0]:.2f}")
    print(f"{Q_HEADS} Q + {K_HEADS} K heads of {HEAD_DIM}; medians of {args.rounds} interleaved "
          f"rounds, batches of >= {args.batch_ms:g} ms; speedup = HF / rmsnorm\n")
    print("| dtype | tokens | threads | case | HF | rmsnorm | speedup |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname.strip())
        for tokens in (int(t) for t in args.tokens.split(",")):
            fns, table = cases(tokens, dtype)
            check(fns, table, dtype)
            for n in thread_counts(args.threads):
                for name, th, to in time_cases(fns, table, args.rounds, args.batch_ms / 1e3):
                    print(f"| {dname} | {tokens} | {n} | {name} | {fmt(th)} | {fmt(to)} | "
                          f"{th / to:.2f}x |", flush=True)
    load1 = os.getloadavg()
    print(f"\n{time.perf_counter() - t_start:.0f} s; load average at the end {load1[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
