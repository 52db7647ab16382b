"""check_dequantize.py - the C library's rmsnorm_dequantize (through the
test-only filter dequantize_tool) against the Python package's dequantize
(python/rmsnorm/_quant.py, loaded from this checkout's source, numpy arrays),
bit for bit, every format: on the reference encoders' output (blocks_tool) for
rows with outliers, zero and tiny blocks, NaN and Inf; and on random bytes,
which reach every code, every E8M0 byte (0xFF: NaN) and scales of every kind
(NaN, inf, subnormal, -0).

usage: python check_dequantize.py PATH/TO/blocks_tool PATH/TO/dequantize_tool
Exit 0 when all agree, 1 on a mismatch, 77 when numpy is missing.
"""
import importlib.util
import pathlib
import subprocess
import sys

try:
    import numpy as np
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

BLOCKS, DEQ = sys.argv[1], sys.argv[2]
SRC = pathlib.Path(__file__).resolve().parents[2] / "python" / "rmsnorm" / "_quant.py"
spec = importlib.util.spec_from_file_location("rmsnorm_quant_source", SRC)
quant = importlib.util.module_from_spec(spec)
spec.loader.exec_module(quant)  # pure Python: the package's compiled modules are not needed
X = quant.Ops(np)
F32 = np.float32
rng = np.random.default_rng(20261207)
failures = 0

# format: (codes bytes per element block, block elements; 0: one code per element)
BLOCK_BYTES = {"q8_0": (34, 32), "q8_1": (36, 32), "q8_k": (292, 256), "mxfp4": (17, 32)}


def run(args, data):
    r = subprocess.run(args, input=np.ascontiguousarray(data).tobytes(), capture_output=True)
    if r.returncode:
        raise RuntimeError(f"{args}: {r.returncode} {r.stderr.decode()}")
    return r.stdout


def c_dequantize(fmt, d, group, rule, codes, scales, static=None):
    data = codes.tobytes() + (b"" if scales is None or static is not None else scales.tobytes())
    args = [DEQ, fmt, str(d), str(group), rule or "-"] + ([repr(static)] if static else [])
    return np.frombuffer(run(args, np.frombuffer(data, np.uint8)), F32).reshape(-1, d)


def check(name, fmt, d, group, rule, codes, scales, static=None):
    global failures
    got = c_dequantize(fmt, d, group, rule, codes, scales, static)
    py_scales = np.array(static, F32) if static else scales
    with np.errstate(all="ignore"):
        want = quant.dequantize(codes, py_scales, fmt, group, X).reshape(got.shape)
    same = got.view(np.uint32) == want.view(np.uint32)
    if same.all():
        nan = int(np.isnan(got).sum())
        print(f"ok   {name}: {got.size} values ({nan} NaN)")
        return
    failures += 1
    bad = np.flatnonzero(~same.ravel())
    print(f"FAIL {name}: {bad.size} of {got.size} differ, first at {bad[:6]}: "
          f"{got.ravel()[bad[:6]]} want {want.ravel()[bad[:6]]}")


def encoded(y, fmt, group, rule):
    """codes and scales of y (rows, d) by the reference encoders (blocks_tool)."""
    rows, d = y.shape
    name = {"fp8_e4m3": "e4m3"}.get(fmt, fmt)
    if fmt in BLOCK_BYTES:
        raw = np.frombuffer(run([BLOCKS, name], y.astype("<f4")), np.uint8)
        return raw.reshape(rows, -1), None
    if fmt == "mxfp8":
        raw = np.frombuffer(run([BLOCKS, name], y.astype("<f4")), np.uint8)
        return raw[: rows * d].reshape(rows, d), raw[rows * d:].reshape(rows, -1)
    g = group or d
    raw = np.frombuffer(run([BLOCKS, name, str(g)] + ([rule] if rule else []),
                            y.astype("<f4")), np.uint8)
    codes, sc = raw[: rows * d].reshape(rows, d), raw[rows * d:]
    scales = sc.reshape(rows, -1) if rule == "e8m0" else sc.view("<f4").reshape(rows, -1)
    return codes, scales


# ---- rows as the encoders meet them ----
D = 512
y = rng.standard_normal((12, D)) * rng.uniform(0.5, 1.5, D)
y[:, rng.choice(D, 4, replace=False)] *= 25
y[1, 64:128] = 0          # zero blocks (pow2 / E8M0: the smallest scale)
y[2, 256:512] = 0
y[3] *= 2.0 ** -130       # tiny rows: subnormal scales, clamped ones with pow2
y[4] *= 2.0 ** 100
y[5, 7] = np.nan          # a NaN block: NaN scale, zero codes
y[6, 300] = np.inf        # an infinite block
y[7, 33] = -np.inf
y[8] = np.round(y[8] * 4) / 4
y = y.astype(F32)

for fmt in ("q8_0", "q8_1", "q8_k", "mxfp4", "mxfp8"):
    codes, scales = encoded(y, fmt, 0, "")
    check(f"{fmt} encoded", fmt, D, 0, "", codes, scales)
for fmt in ("int8", "fp8_e4m3"):
    for group in (0, 32, 128):
        for rule in ("", "pow2", "e8m0"):
            codes, scales = encoded(y, fmt, group, rule)
            check(f"{fmt} group {group} {rule or 'float'} encoded", fmt, D, group, rule, codes,
                  scales)

# ---- random bytes: every code and scale byte, float scales of every kind ----
ROWS = 64


def random_f32(shape):
    """float32 bit patterns: normal, subnormal, zero of both signs, inf, NaN."""
    bits = rng.integers(0, 2 ** 32, shape, dtype=np.uint64).astype(np.uint32)
    v = bits.view(F32).copy()
    pick = rng.integers(0, 8, shape)
    v[pick == 0] = np.ldexp(rng.uniform(-1, 1, (pick == 0).sum()), -130).astype(F32)
    v[pick == 1] = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf, np.nan], F32),
                              (pick == 1).sum())
    v[pick >= 4] = rng.standard_normal((pick >= 4).sum()).astype(F32)
    return v


for fmt, (nbytes, block) in BLOCK_BYTES.items():
    codes = rng.integers(0, 256, (ROWS, D // block * nbytes), dtype=np.uint8)
    if fmt == "q8_k":  # float d of every kind
        blk = codes.reshape(ROWS, -1, nbytes)
        blk[..., :4] = random_f32(blk.shape[:2]).view(np.uint8).reshape(blk.shape[:2] + (4,))
    check(f"{fmt} random bytes", fmt, D, 0, "", codes, None)
codes = rng.integers(0, 256, (ROWS, D), dtype=np.uint8)
check("mxfp8 random bytes", "mxfp8", D, 0, "", codes,
      rng.integers(0, 256, (ROWS, D // 32), dtype=np.uint8))
for fmt in ("int8", "fp8_e4m3"):
    for group in (0, 32, 64):
        n = D // group if group else 1
        check(f"{fmt} group {group} random float scales", fmt, D, group, "", codes,
              random_f32((ROWS, n)))
        check(f"{fmt} group {group} random E8M0 scales", fmt, D, group, "e8m0", codes,
              rng.integers(0, 256, (ROWS, n), dtype=np.uint8))
    for static in (0.05, 3e-39, 1e38):
        check(f"{fmt} static {static}", fmt, D, 0, "", codes, None, static)

print("check_dequantize:", "FAILED" if failures else "all agree")
sys.exit(1 if failures else 0)
