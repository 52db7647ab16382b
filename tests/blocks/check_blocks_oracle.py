"""check_blocks_oracle.py - the block encoders of src/ref/blocks_ref.c (through
the test-only filter blocks_tool) against independent oracles, byte for byte:
gguf-py's quantizers for Q8_0 and MXFP4 (and Q8_0's d and codes for Q8_1,
whose s = d * sum(qs) is computed here as ggml's quantize_row_q8_1_ref does),
numpy transcriptions of the published definitions (with ml_dtypes for the
E4M3 and E8M0 encodings) for Q8_K, MXFP8 and the per-group scales (floats,
or E8M0 bytes).

usage: python check_blocks_oracle.py PATH/TO/blocks_tool
Exit 0 when all agree, 1 on a mismatch, 77 when numpy, gguf or ml_dtypes is
missing (make test-python runs it with the venv's).
"""
import subprocess
import sys

try:
    import numpy as np
    import gguf
    import ml_dtypes
except ImportError as e:  # the oracles are optional test dependencies
    print(f"skipped: {e}")
    sys.exit(77)

TOOL = sys.argv[1]
F32 = np.float32
failures = 0


def tool(y, *args):
    y = np.ascontiguousarray(y, dtype="<f4")
    r = subprocess.run([TOOL, *args], input=y.tobytes(), capture_output=True, check=True)
    return np.frombuffer(r.stdout, dtype=np.uint8)


def check(name, got, want):
    global failures
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    if got.shape == want.shape and np.array_equal(got, want):
        print(f"ok   {name}: {got.size} bytes")
        return
    failures += 1
    if got.shape != want.shape:
        print(f"FAIL {name}: {got.size} bytes, want {want.size}")
        return
    bad = np.flatnonzero(got != want)
    print(f"FAIL {name}: {bad.size} of {got.size} bytes differ, first at {bad[:8]}: "
          f"{got[bad[:8]]} want {want[bad[:8]]}")


# ---- test rows (rows, d) of normed-looking fp32 values ----
rng = np.random.default_rng(20261202)


def rows_random(rows, d):
    return rng.standard_normal((rows, d)).astype(F32)


def rows_real(rows, d):
    """y of an RMSNorm with a learned weight: rms ~ 1 per row, a few fixed
    outlier channels at 20-30x the RMS, some all-zero blocks of 32 and of 256,
    some rows scaled far down or up (small and large block scales)."""
    y = rng.standard_normal((rows, d)) * rng.uniform(0.5, 1.5, d)
    out = rng.choice(d, 4, replace=False)
    y[:, out] *= rng.uniform(20, 30, 4) * np.sign(rng.standard_normal(4))
    for r in range(0, rows, 3):
        b = rng.integers(0, d // 32)
        y[r, 32 * b:32 * b + 32] = 0
    for r in range(1, rows, 7):
        b = rng.integers(0, d // 256)
        y[r, 256 * b:256 * b + 256] = 0
    y[rows // 2] *= 2.0 ** -100
    y[rows // 2 + 1] *= 2.0 ** 100
    y[rows // 2 + 2] *= 2.0 ** -20
    return y.astype(F32)


def rows_ties(rows, d):
    """Halves and quarter points hit exactly: amax 127 per block makes d = 1
    (Q8_0) and iscale = -1 (Q8_K), so k + 0.5 are rounding ties."""
    y = (rng.integers(-254, 255, (rows, d)) / 2).astype(F32)
    y[:, ::32] = 127
    return y


def rows_pow2_edges(d):
    """Blocks whose amax sits just below a power of two (the MXFP4 scale)."""
    ks = np.arange(-124, 127)
    y = rng.uniform(-1, 1, (ks.size, d)) * (2.0 ** ks[:, None])
    y[:, ::32] = np.nextafter(F32(2.0) ** ks[:, None].astype(F32), F32(0))
    return y.astype(F32)


def rows_both_signs(rows, d):
    """Every block of 32 holds +8 and -8 at random places, either first, the
    rest below 4 in magnitude: Q8_K's max is the first of the largest
    magnitudes, so its sign is the earlier one's."""
    y = rng.uniform(-4, 4, (rows, d))
    for r in range(rows):
        for b in range(0, d, 32):
            i, k = rng.choice(32, 2, replace=False)
            y[r, b + i], y[r, b + k] = 8, -8
    return y.astype(F32)


D = 1024
DATA = {"random": rows_random(16, D), "real": rows_real(24, D), "ties": rows_ties(8, D),
        "pow2-edges": rows_pow2_edges(D), "both-signs": rows_both_signs(8, D)}

# ---- Q8_0 and MXFP4: gguf-py ----
for name, y in DATA.items():
    for fmt, qt in (("q8_0", gguf.GGMLQuantizationType.Q8_0),
                    ("mxfp4", gguf.GGMLQuantizationType.MXFP4)):
        with np.errstate(all="ignore"):
            want = gguf.quants.quantize(y, qt)
        check(f"{fmt} {name} vs gguf", tool(y, fmt), want)

# fp32-subnormal d's (1/d overflowing below ~2^-122): ggml's int8 conversion
# is undefined there; blocks_ref.c writes what ggml on x86 and gguf-py write
ks = np.repeat(np.arange(-149, -100), 64)
tiny = (rng.uniform(-1, 1, (ks.size, 32)) * 2.0 ** ks[:, None]).astype(F32)
with np.errstate(all="ignore"):
    check("q8_0 tiny blocks vs gguf", tool(tiny, "q8_0"),
          gguf.quants.quantize(tiny, gguf.GGMLQuantizationType.Q8_0))

# ---- Q8_1: ggml's block_q8_1 is Q8_0's d and qs with s after d; s is the
# integer sum of the codes times the fp32 d (not the fp16 one) in fp32, then
# fp16 (quantize_row_q8_1_ref). gguf-py has no Q8_1 quantizer: its Q8_0
# gives d and qs. ----
def q8_1_from_q8_0(y):
    with np.errstate(all="ignore"):
        q80 = gguf.quants.quantize(y, gguf.GGMLQuantizationType.Q8_0).reshape(-1, 34)
        qs = q80[:, 2:].view(np.int8).astype(np.int32)
        d = np.abs(y.reshape(-1, 32).astype(F32)).max(axis=1) / F32(127)
        s = (qs.sum(axis=1).astype(F32) * d).astype(F32).astype(np.float16)
    out = np.zeros((q80.shape[0], 36), np.uint8)
    out[:, 0:2] = q80[:, 0:2]
    out[:, 2:4] = s.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 4:] = q80[:, 2:]
    return out


for name, y in DATA.items():
    check(f"q8_1 {name} vs gguf q8_0 + sum", tool(y, "q8_1"), q8_1_from_q8_0(y))
check("q8_1 tiny blocks vs gguf q8_0 + sum", tool(tiny, "q8_1"), q8_1_from_q8_0(tiny))


# ---- Q8_K: numpy transcription of ggml's reference ----
def q8_k_numpy(y):
    blocks = y.reshape(-1, 256).astype(F32)
    out = np.zeros((blocks.shape[0], 292), np.uint8)
    for i, x in enumerate(blocks):
        ax = np.abs(x)
        amax = ax.max()
        if amax == 0:
            continue
        mx = x[np.argmax(ax)]  # first of the largest magnitudes
        with np.errstate(all="ignore"):
            iscale = F32(-127) / mx
            # nearest_int: the float sum with 1.5 * 2^23 leaves round-half-even(t)
            # in the low mantissa bits (an overflowed iscale gives junk there,
            # and the int8 store keeps its low byte, as C does)
            v = ((iscale * x + F32(12582912)).view(np.int32) & 0x7FFFFF) - 0x400000
        q = np.minimum(v, 127).astype(np.uint32).astype(np.uint8).view(np.int8)
        bsums = q.astype(np.int32).reshape(16, 16).sum(axis=1).astype(np.int16)
        out[i, 0:4] = np.array([F32(1) / iscale], "<f4").view(np.uint8)
        out[i, 4:260] = q.view(np.uint8)
        out[i, 260:292] = bsums.astype("<i2").view(np.uint8)
    return out


# ---- MXFP8 E4M3: numpy transcription of OCP MX v1.0 ----
def mxfp8_numpy(y):
    blocks = y.reshape(-1, 32).astype(F32)
    amax = np.abs(blocks).max(axis=1)
    _, e = np.frexp(amax)  # amax = m 2^e, m in [0.5, 1): floor(log2) = e - 1
    k = np.where(amax > 0, np.maximum(e - 1 - 8, -127), -127)
    scales = np.ldexp(F32(1), k).astype(F32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    t = np.clip(np.ldexp(blocks, -k[:, None]).astype(F32), -448, 448)
    codes = t.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.concatenate([codes.ravel(), scales])


# ---- per-group int8 / e4m3, the per-row rule of rmsnorm_forward_quant ----
def group_numpy(y, g, kind, rule):
    """rule: "" (float scales), "pow2" (rounded up to a power of two in UE8M0's
    range [2^-127, 2^127]: an all-zero or tiny group gets 2^-127) or "e8m0"
    (that, stored as E8M0 bytes)."""
    blocks = y.reshape(-1, g).astype(F32)
    qmax = F32(448 if kind == "e4m3" else 127)
    s = (np.abs(blocks).max(axis=1) / qmax).astype(F32)
    if rule:
        m, e = np.frexp(s)
        s = np.where((s > 0) & (m != 0.5), np.ldexp(F32(1), e).astype(F32), s).astype(F32)
        s = np.maximum(s, F32(2.0 ** -127))
    mul = (s >= F32(2.0 ** -126)) & (s <= F32(2.0 ** 126))
    with np.errstate(all="ignore"):
        inv = (F32(1) / s).astype(F32)
        t = np.where(mul[:, None], blocks * inv[:, None],
                     np.where(s[:, None] > 0, blocks / s[:, None], F32(0))).astype(F32)
    if kind == "e4m3":
        codes = np.clip(t, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    else:
        codes = np.rint(np.clip(t, -128, 127)).astype(np.int8).view(np.uint8)
    if rule == "e8m0":
        return np.concatenate([codes.ravel(), s.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)])
    return np.concatenate([codes.ravel(), s.astype("<f4").view(np.uint8)])


for name, y in DATA.items():
    check(f"q8_k {name} vs numpy", tool(y, "q8_k"), q8_k_numpy(y))
    check(f"mxfp8 {name} vs numpy", tool(y, "mxfp8"), mxfp8_numpy(y))
    for g in (32, 64, 128):
        for kind in ("int8", "e4m3"):
            for rule in ("", "pow2", "e8m0"):
                args = [kind, str(g)] + ([rule] if rule else [])
                check(f"{' '.join(args)} {name} vs numpy", tool(y, *args),
                      group_numpy(y, g, kind, rule))

# ---- MXFP4's scale byte just below every power of two, against numpy's
# float32 log2 (what gguf-py uses; glibc's log2f agrees here) ----
ks = np.arange(-124, 128)
top = (F32(2.0) ** ks.astype(F32)).view(np.uint32)
v = (top[:, None] - np.arange(1, 4097, dtype=np.uint32)[None, :]).ravel().view(F32)
v = np.concatenate([v, (F32(2.0) ** ks.astype(F32))])
want = (np.floor(np.log2(v)) - 2 + 127).astype(np.uint8)
check("mxfp4 scale byte below 2^k, k -124..127", tool(v, "mxfp4-e8m0"), want)
rounded_up = int(np.count_nonzero(np.floor(np.log2(v)) != np.frexp(v)[1] - 1))
print(f"     ({rounded_up} of {v.size} values have the float32 log2 rounded up to k)")
# below 2^-125 ggml's conversion to uint8 is undefined: ours is clamped to 0
check("mxfp4 scale byte below 2^-125 clamped", tool(np.ldexp(F32(1), np.arange(-149, -125)).astype(F32),
                                                   "mxfp4-e8m0"), np.zeros(24, np.uint8))

print("check_blocks_oracle:", "FAILED" if failures else "all agree")
sys.exit(1 if failures else 0)
