"""test_quant_formats.py - rms_norm_quant and fused_add_rms_norm_quant (numpy and torch)
against independent oracles: gguf-py's quantizers for Q8_0 and MXFP4 byte for byte (and its
Q8_0 plus ggml's sum for Q8_1), numpy transcriptions of the definitions for Q8_K, MXFP8 and
per-row / per-group int8 and e4m3 (power-of-two scales kept in [2^-127, 2^127]),
a float64 RMSNorm for y; dequantize round trips, input dtypes, the fused residual add, NaN
and Inf rows, the errors, and the torch ops under opcheck, torch.compile and torch.export."""

import numpy as np
import pytest

import rmsnorm

ml_dtypes = pytest.importorskip("ml_dtypes")
E4M3 = ml_dtypes.float8_e4m3fn
F32_EPS = float(np.finfo(np.float32).eps)
BLOCK_FORMATS = ["q8_0", "q8_1", "q8_k", "mxfp4"]
FORMATS = ["int8", "fp8_e4m3", "mxfp8"] + BLOCK_FORMATS
ROW_BYTES = {"q8_0": 34 / 32, "q8_1": 36 / 32, "q8_k": 292 / 256, "mxfp4": 17 / 32}


def activations(rng, rows=6, d=512, dtype=np.float32):
    """Rows as a transformer's hidden states look: a few outlier channels 20-30x the
    others, a row on a coarse grid (many equal |y|), a zero row, a row of +-1 (every |y|
    ties for the maximum, with either sign first)."""
    x = rng.standard_normal((rows, d))
    x[:, rng.choice(d, 3, replace=False)] *= rng.uniform(20, 30, 3)
    x[1] = np.round(x[1] * 2) / 2
    x[2] = 0
    x[3] = np.where(rng.random(d) < 0.5, -1.0, 1.0)
    return x.astype(dtype)


def params(rng, d):
    return ((1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            (0.01 * rng.standard_normal(d)).astype(np.float32))


def y64(x, w=None, b=None, eps=F32_EPS):
    x = np.asarray(x).astype(np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * (1 if w is None else w.astype(np.float64)) + (0 if b is None else b)


def y32(x, w=None, b=None):
    """The float32 y the encoders see: for float32 data, rms_norm's own output."""
    return rmsnorm.rms_norm(np.asarray(x, np.float32), x.shape[-1], w, bias=b)


# ---- numpy transcriptions of the formats' definitions ----------------------------------


def q8_k(y):
    """ggml block_q8_K per 256: d = 1/iscale, iscale = -127/max (max: the value of the
    first largest |y|), q = min(127, round-half-even(iscale*y)), bsums of 16."""
    out = []
    for blk in y.reshape(-1, 256).astype(np.float32):
        mx = blk[np.argmax(np.abs(blk))]
        if mx == 0:
            d, q = np.float32(0), np.zeros(256, np.int8)
        else:
            iscale = np.float32(-127) / mx
            q = np.minimum(np.rint(iscale * blk), 127).astype(np.int8)
            d = np.float32(1) / iscale
        sums = q.astype(np.int16).reshape(16, 16).sum(1).astype(np.int16)
        out.append(np.concatenate([np.array([d], np.float32).view(np.uint8), q.view(np.uint8),
                                   sums.view(np.uint8)]))
    return np.concatenate(out).reshape(y.shape[0], -1)


def mxfp8(y):
    """OCP MXFP8 E4M3 per 32: k = floor(log2 amax) - 8 (>= -127), scale byte k + 127,
    codes e4m3(y / 2^k), nearest even, saturated to +-448."""
    blk = y.astype(np.float32).reshape(y.shape[0], -1, 32)
    amax = np.abs(blk).max(-1, keepdims=True)
    k = np.where(amax > 0, np.frexp(amax)[1] - 1 - 8, -127)
    k = np.maximum(k, -127)
    t = np.clip(blk * np.ldexp(np.float32(1), -k).astype(np.float32), -448, 448)
    return t.astype(E4M3).reshape(y.shape), (k + 127).astype(np.uint8).reshape(y.shape[0], -1)


def per_group(y, qmax, group, pow2):
    """int8 (qmax 127) or e4m3 (448) codes and float32 scales per group (0: per row); pow2:
    scales rounded up to a power of two, at least 2^-127 (UE8M0's smallest: an all-zero row
    or group gets it too)."""
    g = group or y.shape[-1]
    blk = y.astype(np.float32).reshape(y.shape[0], -1, g)
    s = np.abs(blk).max(-1, keepdims=True) / np.float32(qmax)
    if pow2:
        m, e = np.frexp(s)
        s = np.where((m == 0.5) | (s == 0), s, np.ldexp(np.float32(1), e)).astype(np.float32)
        s = np.maximum(s, np.float32(2.0 ** -127))
    inv = np.where(s == 0, 0, np.float32(1) / np.where(s == 0, 1, s)).astype(np.float32)
    t = blk * inv
    if qmax == 127:
        q = np.rint(np.clip(t, -128, 127)).astype(np.int8)
    else:
        q = np.clip(t, -448, 448).astype(E4M3)
    return q.reshape(y.shape), s.reshape(y.shape[0], -1)


# ---- byte for byte against the oracles -------------------------------------------------


@pytest.mark.parametrize("fmt", ["q8_0", "mxfp4"])
def test_ggml_blocks_equal_gguf_py(rng, fmt):
    gguf = pytest.importorskip("gguf")
    if not hasattr(gguf.GGMLQuantizationType, fmt.upper()):
        pytest.skip(f"this gguf-py has no {fmt}")
    x = activations(rng)
    w, b = params(rng, x.shape[-1])
    codes, scales = rmsnorm.rms_norm_quant(x, 512, w, bias=b, format=fmt)
    assert codes.dtype == np.uint8 and codes.shape == (6, 512 * ROW_BYTES[fmt])
    assert scales.dtype == np.float32 and scales.shape == (6, 0)
    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "mxfp4": gguf.GGMLQuantizationType.MXFP4}
    want = gguf.quants.quantize(y32(x, w, b), qtype[fmt])
    np.testing.assert_array_equal(codes, want)
    # and dequantize agrees with gguf-py's
    np.testing.assert_array_equal(rmsnorm.dequantize(codes, scales, fmt),
                                  gguf.quants.dequantize(want, qtype[fmt]))


def test_q8_1_equals_gguf_q8_0_and_sum(rng):
    """ggml's block_q8_1: Q8_0's d and qs (gguf-py has no Q8_1 quantizer), and after d
    s = fp16(sum(qs) * d) with the float32 d = amax / 127, as quantize_row_q8_1_ref."""
    gguf = pytest.importorskip("gguf")
    x = activations(rng)
    w, b = params(rng, 512)
    codes, scales = rmsnorm.rms_norm_quant(x, 512, w, bias=b, format="q8_1")
    assert codes.dtype == np.uint8 and codes.shape == (6, 512 * 36 // 32)
    assert scales.shape == (6, 0)
    y = y32(x, w, b)
    q80 = gguf.quants.quantize(y, gguf.GGMLQuantizationType.Q8_0).reshape(6, -1, 34)
    blk = codes.reshape(6, -1, 36)
    np.testing.assert_array_equal(blk[..., :2], q80[..., :2])
    np.testing.assert_array_equal(blk[..., 4:], q80[..., 2:])
    d = np.abs(y.reshape(6, -1, 32)).max(-1) / np.float32(127)
    s = (q80[..., 2:].view(np.int8).astype(np.int32).sum(-1).astype(np.float32) * d)
    np.testing.assert_array_equal(blk[..., 2:4].copy().view("<f2")[..., 0], s.astype(np.float16))
    np.testing.assert_array_equal(rmsnorm.dequantize(codes, scales, "q8_1"),
                                  rmsnorm.dequantize(q80.reshape(6, -1), None, "q8_0"))


def test_q8_k_equals_transcription(rng):
    x = activations(rng)
    w, _ = params(rng, 512)
    codes, scales = rmsnorm.rms_norm_quant(x, 512, w, format="q8_k")
    assert codes.shape == (6, 584) and scales.shape == (6, 0)
    np.testing.assert_array_equal(codes, q8_k(y32(x, w)))


def test_mxfp8_equals_transcription(rng):
    x = activations(rng)
    w, b = params(rng, 512)
    codes, scales = rmsnorm.rms_norm_quant(x, 512, w, bias=b, format="mxfp8")
    assert codes.dtype == np.dtype(E4M3) and codes.shape == x.shape
    assert scales.shape == (6, 16) and scales.view(np.uint8).dtype == np.uint8
    want_codes, want_scales = mxfp8(y32(x, w, b))
    np.testing.assert_array_equal(codes.view(np.uint8), want_codes.view(np.uint8))
    np.testing.assert_array_equal(scales.view(np.uint8), want_scales)
    if hasattr(ml_dtypes, "float8_e8m0fnu"):
        assert scales.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)


@pytest.mark.parametrize("fmt,qmax", [("int8", 127), ("fp8_e4m3", 448)])
@pytest.mark.parametrize("group", [0, 32, 128])
@pytest.mark.parametrize("pow2", [False, True])
def test_per_group_equals_transcription(rng, fmt, qmax, group, pow2):
    x = activations(rng)
    w, _ = params(rng, 512)
    codes, scales = rmsnorm.rms_norm_quant(x, 512, w, format=fmt, group=group, pow2_scale=pow2)
    want_q, want_s = per_group(y32(x, w), qmax, group, pow2)
    assert codes.dtype == want_q.dtype and codes.shape == x.shape
    assert scales.dtype == np.float32 and scales.shape == (6, 512 // group if group else 1)
    np.testing.assert_array_equal(scales, want_s)
    np.testing.assert_array_equal(codes.view(np.uint8), want_q.view(np.uint8))
    if pow2:
        m, _ = np.frexp(scales)
        assert (m == 0.5).all() and (scales >= 2.0 ** -127).all()


def test_norm_options(rng):
    """offset, eps_outside, partial and eps reach the norm: the codes are those of
    rms_norm's y with the same options."""
    x = activations(rng)
    w, b = params(rng, 512)
    opts = dict(bias=b, eps=1e-3, offset=True, eps_outside=True, partial=0.4)
    codes, _ = rmsnorm.rms_norm_quant(x, 512, w, format="q8_k", **opts)
    np.testing.assert_array_equal(codes, q8_k(rmsnorm.rms_norm(x, 512, w, **opts)))
    codes, scales = rmsnorm.rms_norm_quant(x, 512, w, format="int8", group=64, **opts)
    want_q, want_s = per_group(rmsnorm.rms_norm(x, 512, w, **opts), 127, 64, False)
    np.testing.assert_array_equal(codes, want_q)
    np.testing.assert_array_equal(scales, want_s)


def test_static_scale(rng):
    x = activations(rng)
    codes, scales = rmsnorm.rms_norm_quant(x, 512, format="int8", scale=0.05)
    assert scales.shape == () and scales == np.float32(0.05)
    want = np.rint(np.clip(y32(x) * np.float32(1 / np.float32(0.05)), -128, 127))
    np.testing.assert_array_equal(codes, want.astype(np.int8))


# ---- y itself, dequantize, dtypes ------------------------------------------------------

# the largest error of a dequantized value relative to its block's (row's) max |y|: half a
# step of int8; e4m3's 3 mantissa bits; MX blocks whose max lands above the element type's
# largest value (448 of [256, 512), 6 of [4, 8)) saturate; q8_0's d is stored in fp16
REL_ERR = {"int8": 0.5 / 127, "fp8_e4m3": 1 / 16, "mxfp8": 1 / 8, "q8_0": 0.6 / 127,
           "q8_1": 0.6 / 127, "q8_k": 0.5 / 127, "mxfp4": 0.25}
BLOCK = {"int8": 512, "fp8_e4m3": 512, "mxfp8": 32, "q8_0": 32, "q8_1": 32, "q8_k": 256,
         "mxfp4": 32}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64],
                         ids=["float32", "float16", "bfloat16", "float64"])
def test_dequantize_round_trip(rng, fmt, dtype):
    x = activations(rng, dtype=dtype)
    w, b = params(rng, 512)
    codes, scales = rmsnorm.rms_norm_quant(x, (512,), w, bias=b, format=fmt)
    got = rmsnorm.dequantize(codes, scales, fmt)
    assert got.dtype == np.float32 and got.shape == x.shape
    want = y64(x, w, b)  # the float64 RMSNorm of the rounded input
    blocks = np.abs(want).reshape(6, -1, BLOCK[fmt]).max(-1, keepdims=True)
    err = np.abs(got.astype(np.float64) - want).reshape(6, -1, BLOCK[fmt])
    # the format's rounding, plus y's own (float32, or the data dtype's for the e4m3 rows)
    assert (err <= blocks * (REL_ERR[fmt] * 1.01) + 1e-5).all(), fmt


def test_dequantize_e8m0_scales(rng):
    """int8 / fp8_e4m3 scales given as E8M0 bytes (uint8: the C library's
    RMSNORM_QUANT_SCALE_E8M0, the command's --e8m0-scale) decode as 2^(e - 127), 0xFF as
    NaN, and a zero row's 2^-127 as byte 0."""
    x = activations(rng)
    for fmt in ("int8", "fp8_e4m3"):
        codes, scales = rmsnorm.rms_norm_quant(x, 512, format=fmt, group=32, pow2_scale=True)
        e = (np.frexp(scales)[1] + 126).astype(np.uint8)
        assert (e[2] == 0).all()  # the zero row
        np.testing.assert_array_equal(rmsnorm.dequantize(codes, e, fmt, 32),
                                      rmsnorm.dequantize(codes, scales, fmt, 32))
        e[0, 1] = 255
        y = rmsnorm.dequantize(codes, e, fmt, 32)
        assert np.isnan(y[0, 32:64]).all() and not np.isnan(y[0, :32]).any()


def test_rounded_y_of_other_dtypes(rng):
    """float64 data: the block formats encode y rounded to float32; float16 data: its y
    in float32, as the float32 path computes it from the same (exact) input."""
    x = activations(rng, dtype=np.float64)
    codes, _ = rmsnorm.rms_norm_quant(x, 512, format="q8_k")
    np.testing.assert_array_equal(codes, q8_k(rmsnorm.rms_norm(x, 512).astype(np.float32)))
    x16 = activations(rng, dtype=np.float16)
    codes, _ = rmsnorm.rms_norm_quant(x16, 512, format="mxfp8")
    want, _ = mxfp8(y32(x16.astype(np.float32)))
    np.testing.assert_array_equal(codes.view(np.uint8), want.view(np.uint8))


def test_layouts(rng):
    """Leading dims, a 2-d normalized_shape, a row slice (read in place) and a transposed
    input (copied) give the codes of the contiguous rows."""
    x = activations(rng, rows=8)
    for fmt in ("q8_0", "int8", "mxfp8"):
        ref_c, ref_s = rmsnorm.rms_norm_quant(x, 512, format=fmt, group=32 * (fmt == "int8"))
        c, s = rmsnorm.rms_norm_quant(x.reshape(2, 4, 512), 512, format=fmt,
                                      group=32 * (fmt == "int8"))
        assert c.shape[:2] == (2, 4) and s.shape[:2] == (2, 4)
        np.testing.assert_array_equal(c.reshape(ref_c.shape).view(np.uint8), ref_c.view(np.uint8))
        c2, s2 = rmsnorm.rms_norm_quant(x.reshape(8, 16, 32), (16, 32), format=fmt,
                                        group=32 * (fmt == "int8"))
        assert s2.shape == ref_s.shape
        np.testing.assert_array_equal(c2.reshape(ref_c.shape).view(np.uint8),
                                      ref_c.view(np.uint8))
        np.testing.assert_array_equal(rmsnorm.dequantize(c2, s2, fmt, 32 * (fmt == "int8"))
                                      .reshape(8, 512),
                                      rmsnorm.dequantize(ref_c, ref_s, fmt, 32 * (fmt == "int8")))
    wide = np.concatenate([x, x], axis=1)
    c, _ = rmsnorm.rms_norm_quant(wide[:, :512], 512, format="q8_0")
    np.testing.assert_array_equal(c, rmsnorm.rms_norm_quant(x, 512, format="q8_0")[0])
    c, _ = rmsnorm.rms_norm_quant(np.ascontiguousarray(x.T).T, 512, format="q8_0")
    np.testing.assert_array_equal(c, rmsnorm.rms_norm_quant(x, 512, format="q8_0")[0])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_fused_add_equals_add_then_quant(rng, fmt, dtype):
    u, h = activations(rng, dtype=dtype), activations(rng, dtype=dtype)
    w, b = params(rng, 512)
    h_before = h.copy()
    c, s, hn = rmsnorm.fused_add_rms_norm_quant(u, h, 512, w, bias=b, format=fmt)
    np.testing.assert_array_equal(h, h_before)  # residual is not written
    np.testing.assert_array_equal(hn, (h.astype(np.float32) + u).astype(dtype))
    c2, s2 = rmsnorm.rms_norm_quant(hn, 512, w, bias=b, format=fmt)
    np.testing.assert_array_equal(c.view(np.uint8), c2.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(s).view(np.uint8), np.asarray(s2).view(np.uint8))


def test_nan_and_inf_rows(rng):
    x = activations(rng)
    x[0, 7] = np.nan
    x[1, 300] = np.inf
    x[4, :] = 1e30  # an overflowing sum of squares, computed by the rescue path
    for fmt in FORMATS:
        codes, scales = rmsnorm.rms_norm_quant(x, 512, format=fmt)
        y = rmsnorm.dequantize(codes, scales, fmt)
        assert y.shape == x.shape
        ok = y32(x)[5]  # an untouched row still decodes to its y
        assert np.abs(y[5] - ok).max() <= np.abs(ok).max() * REL_ERR[fmt] * 1.01
        big = y32(x)[4]  # 1e30 everywhere normalizes to 1
        assert np.allclose(y[4], big, rtol=REL_ERR[fmt] * 1.01)
        # a NaN makes the whole row's y NaN, an Inf its own element (r = 0, the others 0):
        # a block holding a NaN y has a NaN scale and zero codes, so it dequantizes to NaN
        # (docs/numerics.md, "Non-finite inputs"); the Inf row's other blocks decode to 0
        yr = y32(x)[:2]
        assert np.isnan(yr[0]).all() and np.isnan(yr[1, 300]) and (yr[1, :256] == 0).all()
        assert np.isnan(y[0]).all() and np.isnan(y[1, 300])
        if fmt in ("int8", "fp8_e4m3"):  # one scale per row
            assert np.isnan(y[1]).all()
        else:
            assert (y[1, :256] == 0).all()


def test_errors(rng):
    x = activations(rng)
    with pytest.raises(ValueError, match="format must be one of 'int8', 'fp8_e4m3', 'q8_0', "
                                         "'q8_1', 'q8_k', 'mxfp8', 'mxfp4'; got 'q4_0'"):
        rmsnorm.rms_norm_quant(x, 512, format="q4_0")
    with pytest.raises(TypeError, match="missing required argument 'format'"):
        rmsnorm.rms_norm_quant(x, 512)
    with pytest.raises(rmsnorm.ArgumentError, match="format q8_k needs rows of a positive "
                                                    "multiple of 256 elements"):
        rmsnorm.rms_norm_quant(x[:, :384], 384, format="q8_k")
    with pytest.raises(ValueError, match="multiple of 128 elements .the group.; "
                                         "normalized_shape .96. has 96"):
        rmsnorm.rms_norm_quant(x[:, :96], 96, format="int8", group=128)
    for kw in (dict(format="q8_0", group=32), dict(format="mxfp8", pow2_scale=True),
               dict(format="int8", group=48), dict(format="int8", group=-32),
               dict(format="fp8_e4m3", group=32, scale=0.5), dict(format="mxfp4", scale=1.0)):
        with pytest.raises(rmsnorm.ArgumentError, match="group, pow2_scale and scale apply"):
            rmsnorm.rms_norm_quant(x, 512, **kw)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        rmsnorm.rms_norm_quant(x, 512, format="int8", scale=0.0)
    with pytest.raises(ValueError, match="format must be one of"):
        rmsnorm.dequantize(np.zeros((1, 34), np.uint8), None, "q5_k")
    with pytest.raises(ValueError, match="q8_0 codes are rows of 34-byte blocks"):
        rmsnorm.dequantize(np.zeros((1, 33), np.uint8), None, "q8_0")


# ---- torch ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rt():
    pytest.importorskip("torch")
    import rmsnorm.torch as rt

    return rt


def _bytes(t):
    import torch

    return t.view(torch.uint8).numpy() if t.element_size() == 1 else t.numpy()


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_equals_numpy(rng, rt, fmt):
    import torch

    x = activations(rng).reshape(2, 3, 512)
    w, b = params(rng, 512)
    group = 64 if fmt in ("int8", "fp8_e4m3") else 0
    c, s = rmsnorm.rms_norm_quant(x, 512, w, bias=b, format=fmt, group=group)
    tc, ts = rt.rms_norm_quant(torch.from_numpy(x), 512, torch.from_numpy(w),
                               bias=torch.from_numpy(b), format=fmt, group=group)
    want_dtype = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn,
                  "mxfp8": torch.float8_e4m3fn}.get(fmt, torch.uint8)
    assert tc.dtype == want_dtype and tuple(tc.shape) == c.shape and tuple(ts.shape) == s.shape
    if fmt == "mxfp8":
        assert ts.dtype == getattr(torch, "float8_e8m0fnu", torch.uint8)
    np.testing.assert_array_equal(_bytes(tc), c.view(np.uint8) if c.itemsize == 1 else c)
    np.testing.assert_array_equal(_bytes(ts), s.view(np.uint8) if fmt == "mxfp8" else s)
    np.testing.assert_array_equal(rt.dequantize(tc, ts, fmt, group).numpy(),
                                  rmsnorm.dequantize(c, s, fmt, group))
    u = activations(rng).reshape(2, 3, 512)
    c, s, hn = rmsnorm.fused_add_rms_norm_quant(u, x, 512, w, format=fmt, group=group)
    tx = torch.from_numpy(x.copy())
    tc, ts, thn = rt.fused_add_rms_norm_quant(torch.from_numpy(u), tx, 512, torch.from_numpy(w),
                                              format=fmt, group=group)
    np.testing.assert_array_equal(thn.numpy(), hn)
    np.testing.assert_array_equal(tx.numpy(), x)  # a new tensor; residual not written
    np.testing.assert_array_equal(_bytes(tc), c.view(np.uint8) if c.itemsize == 1 else c)


@pytest.mark.parametrize("fmt,group", [("int8", 0), ("int8", 32), ("fp8_e4m3", 64),
                                       ("mxfp8", 0), ("q8_0", 0), ("q8_1", 0), ("q8_k", 0),
                                       ("mxfp4", 0)])
def test_opcheck(rt, fmt, group):
    import torch

    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        x, u = (torch.randn(3, 256, generator=g).to(dtype) for _ in range(2))
        w = torch.randn(256, generator=g).to(dtype)
        kw = dict(format=fmt, group=group, pow2_scale=group > 0)
        torch.library.opcheck(torch.ops.rmsnorm.rms_norm_quant.default, (x, [256], w), kw)
        torch.library.opcheck(torch.ops.rmsnorm.fused_add_rms_norm_quant.default,
                              (u, x, [256], None, 1e-6), kw)
    torch.library.opcheck(torch.ops.rmsnorm.rms_norm_quant.default,
                          (x.view(3, 8, 32), [8, 32]), dict(format="int8", scale=0.1))


def test_compile_export_and_meta(rt):
    import torch

    def f(x, w):
        c, s = rt.rms_norm_quant(x, x.shape[-1:], w, format="q8_0")
        c2, s2, h = rt.fused_add_rms_norm_quant(x, x, x.shape[-1], w, format="mxfp8")
        return c, c2.view(torch.uint8), s2.view(torch.uint8), h

    x, w = torch.randn(4, 64), torch.randn(64)
    eager = f(x, w)
    compiled = torch.compile(f, fullgraph=True, dynamic=True)(x, w)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)

    class M(torch.nn.Module):
        def forward(self, x):
            return rt.rms_norm_quant(x, [64], format="int8", group=32, pow2_scale=True)

    ep = torch.export.export(M(), (x,))
    assert "rmsnorm.rms_norm_quant.default" in str(ep.graph)
    for a, b in zip(ep.module()(x), M()(x)):
        assert torch.equal(a, b)
    m = torch.empty(5, 3, 512, device="meta", dtype=torch.float16)
    c, s = rt.rms_norm_quant(m, 512, format="q8_k")
    assert c.shape == (5, 3, 584) and c.dtype == torch.uint8 and s.shape == (5, 3, 0)
    c, s, h = rt.fused_add_rms_norm_quant(m, m, 512, format="fp8_e4m3", group=128)
    assert c.dtype == torch.float8_e4m3fn and s.shape == (5, 3, 4) and h.dtype == torch.float16


def test_torch_errors(rt):
    import torch

    x = torch.randn(2, 96)
    with pytest.raises(ValueError, match="format must be one of"):
        rt.rms_norm_quant(x, 96, format="nf4")
    with pytest.raises(ValueError, match="format q8_0 needs rows of a positive multiple of 32"):
        rt.rms_norm_quant(x[:, :40], 40, format="q8_0")
    with pytest.raises(ValueError, match="group, pow2_scale and scale apply"):
        rt.rms_norm_quant(x, 96, format="q8_0", pow2_scale=True)
    with pytest.raises(TypeError, match="format must be a str"):
        rt.rms_norm_quant(x, 96, format=8)
    m = torch.empty(2, 40, device="meta")  # the fake kernel's checks, with the same messages
    with pytest.raises(ValueError, match="format mxfp4 needs rows of a positive multiple of 32"):
        rt.rms_norm_quant(m, 40, format="mxfp4")
    with pytest.raises(ValueError, match="format must be one of"):
        rt.rms_norm_quant(m, 40, format="q2")
