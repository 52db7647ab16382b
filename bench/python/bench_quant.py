"""bench_quant.py - `python bench/python/bench_quant.py [--rounds N]`: fused RMSNorm + quantize
(rmsnorm.rms_norm_quant, numpy and torch) against the unfused path (norm, then a quantizer).

numpy: rms_norm then gguf-py's Q8_0 / MXFP4 quantizer, a per-row int8 and a per-group (128)
fp8 e4m3 quantizer in numpy/ml_dtypes. torch: F.rms_norm then the same int8 / fp8 math in
torch ops. fp32 input; cases of one shape are timed interleaved, the table gives each case's
median per-call time over the rounds and speedup = unfused / fused. Prints a plain table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import statistics
import time

import numpy as np

from bench import _cpu_name as cpu_name, batch, fmt  # bench.py beside this file

EPS = 1e-6
GROUP = 128
BATCH_S = 0.003  # a round's batch of calls lasts at least this long (small shapes)


def time_pair(fused, unfused, rounds: int) -> tuple[float, float]:
    """Median per-call seconds of two callables, timed in alternating batches."""
    calls = [batch(fn, BATCH_S) for fn in (fused, unfused)]
    samples: list[list[float]] = [[], []]
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            fn, n = (fused, unfused)[i], calls[i]
            t = time.perf_counter()
            for _ in range(n):
                fn()
            samples[i].append((time.perf_counter() - t) / n)
    return statistics.median(samples[0]), statistics.median(samples[1])


# --- unfused quantizers after the norm -----------------------------------------------------

def np_int8_rows(y):
    s = np.abs(y).max(-1, keepdims=True) / 127.0
    q = np.rint(y * (1.0 / s)).clip(-128, 127).astype(np.int8)
    return q, s


def np_fp8_groups(y, ml_dtypes):
    g = y.reshape(*y.shape[:-1], y.shape[-1] // GROUP, GROUP)
    s = np.abs(g).max(-1, keepdims=True) / 448.0
    q = np.clip(g / s, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn).reshape(y.shape)
    return q, s[..., 0]


def torch_int8_rows(torch, y):
    s = y.abs().amax(-1, keepdim=True) / 127.0
    return torch.round(y * (1.0 / s)).clamp(-128, 127).to(torch.int8), s


def torch_fp8_groups(torch, y):
    g = y.view(*y.shape[:-1], y.shape[-1] // GROUP, GROUP)
    s = g.abs().amax(-1, keepdim=True) / 448.0
    q = (g / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(y.shape)
    return q, s.squeeze(-1)


def shape_of(text: str) -> tuple[int, int]:
    n, d = text.split("x")
    return int(n), int(d)


def numpy_cases(rmsnorm, rounds, rows):
    import gguf
    import ml_dtypes

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)
    for shp in ("16x4096", "4096x4096"):
        n, d = shape_of(shp)
        x = rng.standard_normal((n, d), dtype=np.float32)
        w = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        norm = lambda: rmsnorm.rms_norm(x, (d,), w, EPS)  # noqa: E731
        cases = [
            ("q8_0 (gguf)", {"format": "q8_0"}, lambda: gguf.quants.quantize(norm(), Q.Q8_0)),
            ("mxfp4 (gguf)", {"format": "mxfp4"}, lambda: gguf.quants.quantize(norm(), Q.MXFP4)),
            ("int8 row", {"format": "int8"}, lambda: np_int8_rows(norm())),
            ("fp8_e4m3 g128", {"format": "fp8_e4m3", "group": GROUP},
             lambda: np_fp8_groups(norm(), ml_dtypes)),
        ]
        for name, kw, unfused in cases:
            fused = lambda kw=kw: rmsnorm.rms_norm_quant(x, (d,), w, EPS, **kw)  # noqa: E731
            tf, tu = time_pair(fused, unfused, rounds)
            rows.append(("numpy", name, shp, tf, tu))


def torch_cases(rounds, rows):
    import torch
    import torch.nn.functional as F
    import rmsnorm.torch as rt

    gen = torch.Generator().manual_seed(0)
    for shp in ("1x4096", "16x4096", "4096x4096"):
        n, d = shape_of(shp)
        x = torch.randn(n, d, generator=gen)
        w = 1.0 + 0.1 * torch.randn(d, generator=gen)
        norm = lambda: F.rms_norm(x, (d,), w, EPS)  # noqa: E731
        cases = [
            ("int8 row", {"format": "int8"}, lambda: torch_int8_rows(torch, norm())),
            ("fp8_e4m3 g128", {"format": "fp8_e4m3", "group": GROUP},
             lambda: torch_fp8_groups(torch, norm())),
        ]
        with torch.inference_mode():
            for name, kw, unfused in cases:
                fused = lambda kw=kw: rt.rms_norm_quant(x, (d,), w, EPS, **kw)  # noqa: E731
                tf, tu = time_pair(fused, unfused, rounds)
                rows.append(("torch", name, shp, tf, tu))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per case (median)")
    args = ap.parse_args()

    import rmsnorm
    import torch

    print(f"# {datetime.date.today()} | {cpu_name()} | rmsnorm {rmsnorm.__version__} | "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads) | "
          f"gguf {importlib.metadata.version('gguf')} | "
          f"ml_dtypes {importlib.metadata.version('ml_dtypes')} | numpy {np.__version__} | "
          f"rounds {args.rounds}")
    rows: list[tuple] = []
    numpy_cases(rmsnorm, args.rounds, rows)
    torch_cases(args.rounds, rows)

    head = ("api", "format", "shape", "fused", "unfused", "speedup")
    table = [head] + [(a, f, s, fmt(tf), fmt(tu), f"{tu / tf:.1f}x")
                      for a, f, s, tf, tu in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(c.ljust(wd) if i < 3 else c.rjust(wd)
                        for i, (c, wd) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
