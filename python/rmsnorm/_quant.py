"""_quant.py - the quantized formats of rms_norm_quant and fused_add_rms_norm_quant on the
Python side: their block sizes (which the fake kernels' output shapes follow) and dequantize,
which decodes each format from its definition with numpy or torch operations alike."""

from __future__ import annotations

# name: (elements of a block, its bytes in the codes; 0 bytes: one code per element, and 0
# elements: int8 and fp8_e4m3, whose scales cover a row or a group)
FORMATS = {"int8": (0, 0), "fp8_e4m3": (0, 0), "q8_0": (32, 34), "q8_1": (32, 36),
           "q8_k": (256, 292), "mxfp8": (32, 0), "mxfp4": (32, 17)}


def format_error(fmt) -> str:
    return f"format must be one of {', '.join(map(repr, FORMATS))}; got {fmt!r}"


class Ops:
    """The few array operations dequantize needs, on numpy arrays or torch tensors."""

    def __init__(self, xp):
        self.xp, self.is_torch = xp, xp.__name__ == "torch"

    def raw(self, a):  # the bytes of 1-byte codes, contiguous uint8
        if self.is_torch:
            return a.contiguous().view(self.xp.uint8)
        return self.xp.ascontiguousarray(self.xp.asarray(a)).view(self.xp.uint8)

    def ints(self, a):  # byte values as int32
        return self.raw(a).to(self.xp.int32) if self.is_torch else self.raw(a).astype("int32")

    def is_bytes(self, a):  # an array of 1-byte elements (uint8, E8M0)
        if self.is_torch:
            return a.element_size() == 1
        return self.xp.asarray(a).dtype.itemsize == 1

    def f32(self, a):
        return a.to(self.xp.float32) if self.is_torch else self.xp.asarray(a, "float32")

    def view(self, raw, dtype: str):  # the bytes of the last dim as dtype, then float32
        if self.is_torch:
            return raw.contiguous().view(getattr(self.xp, dtype)).to(self.xp.float32)
        return self.xp.ascontiguousarray(raw).view(dtype).astype("float32")

    def bits(self, i):  # int32 values as the float32s of those bits
        return self.view(i.to(self.xp.int32) if self.is_torch else i.astype("int32"), "float32")

    def cat(self, parts):
        return self.xp.cat(parts, -1) if self.is_torch else self.xp.concatenate(parts, -1)


def _signed8(b):
    return (b ^ 128) - 128


def _e8m0(e, X):
    """2^(e - 127) (2^-127 is float32's subnormal 1 << 22), NaN for 255."""
    bits = X.xp.where(e == 0, 1 << 22, e << 23)
    return X.bits(X.xp.where(e == 255, 0x7FC00000, bits))


def _minifloat(b, ebits: int, mbits: int, bias: int, X):
    """Sign, ebits exponent and mbits mantissa bits (no infinities) as float32: subnormal
    m 2^(1-bias-mbits), normal (2^mbits + m) 2^(e-bias-mbits)."""
    e, m = (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
    mant = X.f32(X.xp.where(e == 0, m, m + (1 << mbits)))
    v = mant * X.bits((X.xp.where(e == 0, 1, e) - bias - mbits + 127) << 23)
    return X.xp.where((b >> (ebits + mbits)) & 1 == 1, -v, v)


def dequantize(codes, scales, fmt, group, X):
    """float32 values of codes and scales as rms_norm_quant returns them (X: Ops); int8 and
    fp8_e4m3 scales of 1-byte elements are E8M0 bytes."""
    if fmt not in FORMATS:
        raise ValueError(format_error(fmt))
    block, nbytes = FORMATS[fmt]
    b = X.ints(codes)
    if nbytes:  # ggml blocks, rows (*leading, row bytes) -> (*leading, d)
        lead = tuple(b.shape[:-1])
        if b.shape[-1] % nbytes:
            raise ValueError(f"{fmt} codes are rows of {nbytes}-byte blocks; got rows of "
                             f"{b.shape[-1]} bytes")
        b = b.reshape(lead + (-1, nbytes))
        raw = X.raw(codes).reshape(lead + (-1, nbytes))
        if fmt == "q8_0":  # fp16 d, 32 int8
            y = X.view(raw[..., :2], "float16") * X.f32(_signed8(b[..., 2:]))
        elif fmt == "q8_1":  # fp16 d, fp16 s = d * sum(qs) (not needed here), 32 int8
            y = X.view(raw[..., :2], "float16") * X.f32(_signed8(b[..., 4:]))
        elif fmt == "q8_k":  # float d, 256 int8, 16 int16 block sums
            y = X.view(raw[..., :4], "float32") * X.f32(_signed8(b[..., 4:260]))
        else:  # mxfp4: E8M0, 16 bytes of E2M1 pairs (element j low nibble, j + 16 high)
            q = b[..., 1:]
            y = _minifloat(X.cat([q & 15, q >> 4]), 2, 1, 1, X) * _e8m0(b[..., :1], X)
        return y.reshape(lead + (-1,))
    if fmt == "int8":
        v = X.f32(_signed8(b))
    else:  # E4M3 (OCP FN): S.1111.111 is NaN
        v = X.xp.where(b & 127 == 127, float("nan"), _minifloat(b, 4, 3, 7, X))
    # E8M0 bytes: mxfp8's, and int8/fp8_e4m3's scales given as bytes (the library's
    # RMSNORM_QUANT_SCALE_E8M0); else float scales
    s = _e8m0(X.ints(scales), X) if fmt == "mxfp8" or X.is_bytes(scales) else X.f32(scales)
    if s.ndim == 0:  # a static scale
        return v * s
    n = s.shape[-1]
    d = 1
    for size in v.shape[s.ndim - 1:]:
        d *= size
    want = d // 32 if fmt == "mxfp8" else d // group if group else 1
    if tuple(v.shape[: s.ndim - 1]) != tuple(s.shape[:-1]) or n != want or n * (d // n) != d:
        raise ValueError(f"{fmt} scales of shape {tuple(s.shape)} do not fit codes of shape "
                         f"{tuple(v.shape)} with group = {group}")
    return (v.reshape(tuple(s.shape) + (-1,)) * s[..., None]).reshape(tuple(v.shape))
