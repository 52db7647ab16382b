"""test_qk_rope.py - QK-norm + rotary position embedding (qk_norm_rope): the numpy functions
and torch ops against float64 oracles (torch's RMSNorm and transformers' own
apply_rotary_pos_emb for NeoX, a hand-written interleaved rotation for GPT-J; transformers'
Qwen3RMSNorm and rotary embedding where float32 suffices), partial
rotary, GQA, Q and K read in place from a fused QKV array, every dtype, transformers'
roundings in bfloat16, OLMo 2's norm across heads against its own modules in float64,
Gemma 3's and OLMo 2's roundings bit for bit in bfloat16 and float16, zero heads, range
errors that name their entry, rope_table against numpy, the KV-cache write, the refusals,
gradcheck/gradgradcheck in float64 (forward mode too), opcheck, compile and export, and
patch(model, qk_rope=True) on a tiny random Qwen3: logits, a training step's gradients and
a cached decoding step of the unpatched model, compile(fullgraph=True) without a graph
break."""

import copy
import re
import warnings

import numpy as np
import pytest

import rmsnorm

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ml_dtypes = pytest.importorskip("ml_dtypes")

import rmsnorm.torch as rt  # noqa: E402
from transformers.models.gemma3 import modeling_gemma3 as hf_gemma3  # noqa: E402
from transformers.models.olmo2 import modeling_olmo2 as hf_olmo2  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3 as hf_qwen3  # noqa: E402

NP_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64]
TORCH_OF = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
            np.dtype(ml_dtypes.bfloat16): torch.bfloat16, np.dtype(np.float64): torch.float64}
# the rounding of one result to the dtype, relative to the result's scale
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-13}
ops = torch.ops.rmsnorm


def t64(a):
    return torch.from_numpy(np.asarray(a).astype(np.float64))


def close(got, want, tol):
    got = t64(got) if isinstance(got, np.ndarray) else got.double()
    want = want.double()
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= tol * scale, f"max error {err} > {tol} x {scale}"


def table64(n, rot, theta=10000.0, factor=1.0):
    """The cos_sin table in float64 numpy, from its definition."""
    inv = theta ** (-2.0 * np.arange(rot // 2) / rot)
    angle = (np.arange(n)[:, None] / factor) * inv[None, :]
    return np.concatenate([np.cos(angle), np.sin(angle)], axis=-1)


def ref(x, w, cs, pos=None, eps=1e-6, style="neox", rot=0, offset=False, across=False):
    """QK-norm + RoPE as float64 torch: RMSNorm (torch's; transformers' Qwen3RMSNorm computes
    in float32 whatever the input) over head_dim, or across heads over a token's heads as
    Olmo2RMSNorm over the projection, then transformers' apply_rotary_pos_emb (neox) or an
    interleaved rotation (gptj) of the first rot columns with each token's table row
    (positions, or the token's index)."""
    d = x.shape[-1]
    rot = rot or d
    half = rot // 2
    gain = None if w is None else (1 + w if offset else w)
    if across:
        n = torch.nn.functional.rms_norm(x.flatten(-2), (x.shape[-2] * d,), gain, eps)
        n = n.unflatten(-1, x.shape[-2:])
    else:
        n = torch.nn.functional.rms_norm(x, (d,), gain, eps)
    lead = x.shape[:-2]
    tokens = int(np.prod(lead, dtype=np.int64))
    rows = cs[pos.reshape(-1)] if pos is not None else cs[:tokens]
    rows = rows.reshape(*lead, rot)
    c, s = rows[..., :half], rows[..., half:]
    if style == "neox":
        cos, sin = torch.cat((c, c), -1), torch.cat((s, s), -1)
        r, _ = hf_qwen3.apply_rotary_pos_emb(n[..., :rot], n[..., :rot], cos, sin,
                                             unsqueeze_dim=len(lead))
    else:
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
        a, b = n[..., 0:rot:2], n[..., 1:rot:2]
        r = torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2)
    return torch.cat((r, n[..., rot:]), -1)


def ref_rstd(x, eps, across=False):
    dims = (-2, -1) if across else (-1,)
    return torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)


# across: OLMo 2's norm, one statistic per token over its heads
CASES = [dict(), dict(positions=True), dict(style="gptj"), dict(rot=8, positions=True),
         dict(style="gptj", rot=10, offset=True), dict(no_weight=True, style="gptj"),
         dict(across=True, positions=True), dict(across=True, style="gptj", rot=10, offset=True)]


def case_kw(case):
    return dict(style=case.get("style", "neox"), rotary_dim=case.get("rot", 0),
                offset=case.get("offset", False), across_heads=case.get("across", False))


def ref_kw(case):
    """case_kw under ref's names."""
    return dict(style=case.get("style", "neox"), rot=case.get("rot", 0),
                offset=case.get("offset", False), across=case.get("across", False))


def case_args(rng, case, dt, shape=(2, 3, 4, 16), n_positions=9):
    d = shape[-1]
    rot = case.get("rot", 0) or d
    x = (2 * rng.standard_normal(shape)).astype(dt)
    nw = shape[-2] * d if case.get("across") else d
    w = None if case.get("no_weight") else (
        0.3 * rng.standard_normal(nw) + (0 if case.get("offset") else 1)).astype(dt)
    tokens = int(np.prod(shape[:-2]))
    cs = table64(max(n_positions, tokens), rot, theta=50.0)
    pos = rng.integers(0, cs.shape[0], tokens) if case.get("positions") else None
    return x, w, cs, pos


# ---- numpy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_numpy_matches_hf_in_float64(rng, dt, case):
    x, w, cs, pos = case_args(rng, case, dt)
    table = cs.astype(np.float64 if dt == np.float64 else np.float32)
    x0 = x.copy()
    y, rstd = rmsnorm.qk_norm_rope(x, w, table, 1e-6, positions=pos, **case_kw(case),
                                   return_rstd=True)
    assert y.dtype == x.dtype and y.shape == x.shape and y.flags.c_contiguous
    across = case.get("across", False)
    assert rstd.shape == (x.shape[:-2] + (1, 1) if across else x.shape[:-1] + (1,))
    assert rstd.dtype == (np.float64 if dt == np.float64 else np.float32)
    want = ref(t64(x), None if w is None else t64(w), t64(table),
               None if pos is None else torch.from_numpy(pos), 1e-6, **ref_kw(case))
    close(y, want, 2 * TOL[TORCH_OF[np.dtype(dt)]])
    close(rstd, ref_rstd(t64(x), 1e-6, across), 1e-6 if dt != np.float64 else 1e-13)
    np.testing.assert_array_equal(x, x0)
    # another float dtype of table is converted: a float64 table gives float32's rounding
    if dt != np.float64:
        np.testing.assert_array_equal(
            rmsnorm.qk_norm_rope(x, w, cs, 1e-6, positions=pos, **case_kw(case)).view(np.uint8),
            y.view(np.uint8))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_numpy_backward(rng, dt, case):
    x, w, cs, pos = case_args(rng, case, dt, shape=(3, 5, 2, 16))
    table = cs.astype(dt)
    dy = rng.standard_normal(x.shape).astype(dt)
    _, rstd = rmsnorm.qk_norm_rope(x, w, table, 1e-5, positions=pos, **case_kw(case),
                                   return_rstd=True)
    tx = t64(x).requires_grad_()
    tw = None if w is None else t64(w).requires_grad_()
    y = ref(tx, tw, t64(table), None if pos is None else torch.from_numpy(pos), 1e-5,
            **ref_kw(case))
    (y * t64(dy)).sum().backward()
    for r in (rstd, None):
        dx, dw = rmsnorm.qk_norm_rope_backward(dy, x, w, table, 1e-5, rstd=r, positions=pos,
                                               **case_kw(case))
        assert dx.dtype == np.dtype(dt)
        close(dx, tx.grad, 8 * TOL[TORCH_OF[np.dtype(dt)]])
        if w is None:
            assert dw is None
        else:
            close(dw, tw.grad, 8 * TOL[TORCH_OF[np.dtype(dt)]] * 16)


def test_gqa_and_fused_qkv_views(rng):
    # 8 Q heads and 2 K heads of 16 in one (batch, seq, (8 + 2 + 2) * 16) projection output
    b, s, hq, hk, d = 2, 5, 8, 2, 16
    qkv = rng.standard_normal((b, s, (hq + 2 * hk) * d)).astype(np.float32)
    q = qkv[..., : hq * d].reshape(b, s, hq, d)
    k = qkv[..., hq * d: (hq + hk) * d].reshape(b, s, hk, d)
    assert np.shares_memory(q, qkv) and np.shares_memory(k, qkv)  # views, read in place
    wq, wk = (1 + 0.2 * rng.standard_normal((2, d))).astype(np.float32)
    cs = rmsnorm.rope_table(s, d, 1e4)
    pos = np.tile(np.arange(s), b)  # the batch shares the positions
    yq = rmsnorm.qk_norm_rope(q, wq, cs, 1e-6, positions=pos)
    yk = rmsnorm.qk_norm_rope(k, wk, cs, 1e-6, positions=pos)
    np.testing.assert_array_equal(yq, rmsnorm.qk_norm_rope(np.ascontiguousarray(q), wq, cs, 1e-6,
                                                           positions=pos))
    np.testing.assert_array_equal(yk, rmsnorm.qk_norm_rope(np.ascontiguousarray(k), wk, cs, 1e-6,
                                                           positions=pos))
    # against transformers with its own rotary embedding's cos and sin
    cfg = transformers.Qwen3Config(hidden_size=64, num_attention_heads=hq, num_key_value_heads=hk,
                                   head_dim=d, rope_theta=1e4)
    rotary = hf_qwen3.Qwen3RotaryEmbedding(cfg)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float64), torch.arange(s)[None].expand(b, s))
    norm_q, norm_k = (hf_qwen3.Qwen3RMSNorm(d, 1e-6).double() for _ in range(2))
    with torch.no_grad():
        norm_q.weight.copy_(t64(wq))
        norm_k.weight.copy_(t64(wk))
        # HF's layout: (batch, heads, seq, head_dim)
        want_q, want_k = hf_qwen3.apply_rotary_pos_emb(norm_q(t64(q)).transpose(1, 2),
                                                       norm_k(t64(k)).transpose(1, 2), cos, sin)
    close(yq, want_q.transpose(1, 2), 4 * TOL[torch.float32])
    close(yk, want_k.transpose(1, 2), 4 * TOL[torch.float32])
    # torch reads the same views in place: the same bits
    tq = torch.from_numpy(qkv)[..., : hq * d].view(b, s, hq, d)
    assert tq.data_ptr() == torch.from_numpy(qkv).data_ptr() and not tq.is_contiguous()
    assert torch.equal(rt.qk_norm_rope(tq, torch.from_numpy(wq), torch.from_numpy(cs), 1e-6,
                                       positions=torch.from_numpy(pos)), torch.from_numpy(yq))
    # and the (tokens, 3, heads, head_dim) layout of QK-norm's tests
    qkv2 = rng.standard_normal((6, 3, 2, d)).astype(np.float32)
    cs6 = rmsnorm.rope_table(6, d)
    np.testing.assert_array_equal(rmsnorm.qk_norm_rope(qkv2[:, 1], wk, cs6, style="gptj"),
                                  rmsnorm.qk_norm_rope(qkv2[:, 1].copy(), wk, cs6, style="gptj"))


@pytest.mark.parametrize("n,rot,theta,factor", [(64, 16, 1e4, 1.0), (4096, 128, 1e6, 1.0),
                                                (300, 64, 5e5, 8.0)])
def test_rope_table(n, rot, theta, factor):
    want = table64(n, rot, theta, factor)
    t32 = rmsnorm.rope_table(n, rot, theta, factor)
    t64_ = rmsnorm.rope_table(n, rot, theta, factor, dtype=np.float64)
    assert t32.dtype == np.float32 and t32.shape == (n, rot)
    assert t64_.dtype == np.float64
    # rounded once from double: float32's rounding of the float64 value (to the last bit,
    # but for a libm that rounds a double cos or sin otherwise than numpy's)
    np.testing.assert_allclose(t32, want, rtol=0, atol=2 ** -24 + 1e-12)
    assert float(np.mean(t32 == want.astype(np.float32))) > 0.999
    np.testing.assert_allclose(t64_, want, rtol=0, atol=1e-12)
    with pytest.raises(TypeError, match="float32 or float64"):
        rmsnorm.rope_table(4, 8, dtype=np.float16)
    with pytest.raises(rmsnorm.ArgumentError, match="RMSNORM_ERROR_BAD_ROPE"):
        rmsnorm.rope_table(4, 7)
    with pytest.raises(rmsnorm.ArgumentError, match="RMSNORM_ERROR_BAD_ROPE"):
        rmsnorm.rope_table(4, 8, theta=1.0)


def test_hf_roundings_in_bfloat16():
    # round_before_weight: HF's bfloat16 steps (Qwen3RMSNorm, then each product of the
    # rotation rounded); r may differ from HF's float32 statistic in its last bit, which
    # moves a rare element by one bfloat16 step
    gen = torch.Generator().manual_seed(31)
    b, s, h, d = 2, 7, 4, 64
    x = (3 * torch.randn(b, s, h, d, generator=gen)).bfloat16()
    w = (1 + 0.3 * torch.randn(d, generator=gen)).bfloat16()
    cfg = transformers.Qwen3Config(hidden_size=256, num_attention_heads=h, head_dim=d)
    cos, sin = hf_qwen3.Qwen3RotaryEmbedding(cfg)(x, torch.arange(s)[None].expand(b, s))
    assert cos.dtype == torch.bfloat16
    norm = hf_qwen3.Qwen3RMSNorm(d, 1e-6).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(w)
        want = hf_qwen3.apply_rotary_pos_emb(norm(x).transpose(1, 2), norm(x).transpose(1, 2),
                                             cos, sin)[0].transpose(1, 2)
    table = rt.cos_sin_table(cos, sin)
    assert table.dtype == torch.float32 and table.shape == (b * s, d)
    hf = rt.qk_norm_rope(x, w, table, 1e-6, round_before_weight=True)
    once = rt.qk_norm_rope(x, w, table, 1e-6)
    step = want.double().abs().clamp_min(1e-3).log2().floor().exp2() * 2.0 ** -7  # a bf16 ulp
    diff_hf = (hf.double() - want.double()).abs() / step
    assert float((hf != want).double().mean()) < 0.02
    assert float(diff_hf.max()) <= 2.0
    # rounded once: not HF's bits, within bfloat16's rounding of the float64 value
    assert float((once != want).double().mean()) > 5 * float((hf != want).double().mean())
    close(once, ref(x.double(), w.double(), table.double()), TOL[torch.bfloat16])


def test_kv_cache(rng):
    t, h, d = 5, 2, 16
    k = rng.standard_normal((t, h, d)).astype(np.float32)
    v = rng.standard_normal((t, h, d)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    cs = rmsnorm.rope_table(16, d)
    pos = np.array([4, 9, 0, 15, 2])
    slots = np.array([3, -1, 0, 7, 2])  # token 1 is padding
    want = rmsnorm.qk_norm_rope(k, w, cs, 1e-6, positions=pos)
    # K and V of 8 slots side by side, as a combined cache: one slot stride for both
    kv = np.full((8, 2, h, d), 7.0, np.float32)
    kc, vc = kv[:, 0], kv[:, 1]
    got_k, got_v = rmsnorm.qk_norm_rope_cache(k, w, cs, kc, slots, 1e-6, v=v, v_cache=vc,
                                              positions=pos)
    assert got_k is kc and got_v is vc
    for tok, slot in enumerate(slots):
        if slot >= 0:
            np.testing.assert_array_equal(kc[slot], want[tok])
            np.testing.assert_array_equal(vc[slot], v[tok])
    untouched = [i for i in range(8) if i not in set(slots.tolist())]
    assert (kv[untouched] == 7.0).all()
    # a paged cache (blocks, block_size, heads, head_dim), K only
    paged = np.zeros((2, 4, h, d), np.float32)
    assert rmsnorm.qk_norm_rope_cache(k, w, cs, paged, slots, 1e-6, positions=pos)[1] is None
    flat = paged.reshape(8, h, d)
    for tok, slot in enumerate(slots):
        if slot >= 0:
            np.testing.assert_array_equal(flat[slot], want[tok])
    # the refusals write nothing
    before = kv.copy()
    with pytest.raises(rmsnorm.ArgumentError, match="RMSNORM_ERROR_OVERLAP"):
        rmsnorm.qk_norm_rope_cache(k, w, cs, kc, np.array([1, 2, 1, 3, 4]), positions=pos)
    with pytest.raises(rmsnorm.ArgumentError, match="slots.2. = 8 is past the cache's 8 slots"):
        rmsnorm.qk_norm_rope_cache(k, w, cs, kc, np.array([1, 2, 8, 3, 4]), positions=pos)
    with pytest.raises(ValueError, match="v and v_cache come together"):
        rmsnorm.qk_norm_rope_cache(k, w, cs, kc, slots, v=v, positions=pos)
    with pytest.raises(ValueError, match="slots has 4 values"):
        rmsnorm.qk_norm_rope_cache(k, w, cs, kc, slots[:4], positions=pos)
    with pytest.raises(TypeError, match="slots has dtype float64; it must hold integers"):
        rmsnorm.qk_norm_rope_cache(k, w, cs, kc, slots.astype(np.float64), positions=pos)
    with pytest.raises(ValueError, match=r"k_cache has shape \[8, 3, 16\]"):
        rmsnorm.qk_norm_rope_cache(k, w, cs, np.zeros((8, 3, d), np.float32), slots,
                                   positions=pos)
    ro = np.zeros((8, h, d), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache is read-only"):
        rmsnorm.qk_norm_rope_cache(k, w, cs, ro, slots, positions=pos)
    np.testing.assert_array_equal(kv, before)


def test_numpy_errors(rng):
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    cs = rmsnorm.rope_table(4, 8)
    with pytest.raises(ValueError, match="style must be 'neox' .* got 'llama'"):
        rmsnorm.qk_norm_rope(x, None, cs, style="llama")
    with pytest.raises(ValueError, match="rotary_dim must be 0 .* at most head_dim, 8; got 5"):
        rmsnorm.qk_norm_rope(x, None, cs, rotary_dim=5)
    with pytest.raises(ValueError, match="rotary_dim must be 0 .* got 10"):
        rmsnorm.qk_norm_rope(x, None, cs, rotary_dim=10)
    with pytest.raises(ValueError, match=r"cos_sin has shape \[4, 8\]; expected \(n_positions, 6\)"):
        rmsnorm.qk_norm_rope(x, None, cs, rotary_dim=6)
    with pytest.raises(ValueError, match=r"positions has 2 values \(shape \[2\]\); expected one "
                                         "per token, 3"):
        rmsnorm.qk_norm_rope(x, None, cs, positions=[0, 1])
    with pytest.raises(TypeError, match="positions has dtype float32; it must hold integers"):
        rmsnorm.qk_norm_rope(x, None, cs, positions=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="cos_sin has 2 rows; .* one per token, 3"):
        rmsnorm.qk_norm_rope(x, None, cs[:2])
    with pytest.raises(rmsnorm.ArgumentError, match="RMSNORM_ERROR_OUT_OF_RANGE"):
        rmsnorm.qk_norm_rope(x, None, cs, positions=[0, 4, 1])  # past the table
    with pytest.raises(ValueError, match="must have shape \\(\\*, heads, head_dim\\)"):
        rmsnorm.qk_norm_rope(x[0, 0], None, cs)
    with pytest.raises(ValueError, match="Expected weight to be of same shape"):
        rmsnorm.qk_norm_rope(x, np.ones(4, np.float32), cs)
    with pytest.raises(ValueError, match="rstd has 2 values"):
        rmsnorm.qk_norm_rope_backward(x, x, None, cs, rstd=np.ones(2, np.float32))


# ---- OLMo 2's norm across heads, Gemma 3's and OLMo 2's roundings --------------------------


class _KeepFloat64(torch.overrides.TorchFunctionMode):
    """Runs transformers' modules in float64: their casts of float64 tensors to float32
    (Olmo2RMSNorm computes in float32 whatever the input) leave them as they are."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and args[0].dtype == torch.float64 and (
                torch.float32 in args[1:] or kwargs.get("dtype") == torch.float32):
            return args[0]
        return func(*args, **kwargs)


def olmo2_rotary(h, d, b, s, theta=500.0):
    """transformers' Olmo2RotaryEmbedding: cos and sin in float32 for positions 0..s-1."""
    cfg = transformers.Olmo2Config(hidden_size=h * d, num_attention_heads=h, rope_theta=theta)
    return hf_olmo2.Olmo2RotaryEmbedding(cfg)(torch.zeros(1), torch.arange(s)[None].expand(b, s))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_across_heads_is_olmo2_attention(dtype):
    # Olmo2Attention: q_norm = Olmo2RMSNorm(heads * head_dim) of q_proj's output, then the
    # heads rotated by apply_rotary_pos_emb; here in float64 from the same float32 cos/sin
    gen = torch.Generator().manual_seed(41)
    b, s, h, d = 2, 5, 4, 16
    q = 2 * torch.randn(b, s, h * d, generator=gen, dtype=torch.float64)
    w = 1 + 0.3 * torch.randn(h * d, generator=gen, dtype=torch.float64)
    cos, sin = olmo2_rotary(h, d, b, s)
    norm = hf_olmo2.Olmo2RMSNorm(h * d, 1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(w)
    qh = q.clone().requires_grad_()
    with _KeepFloat64():
        n = norm(qh).view(b, s, h, d).transpose(1, 2)
        want = hf_olmo2.apply_rotary_pos_emb(n, n, cos.double(), sin.double())[0].transpose(1, 2)
    assert want.dtype == torch.float64
    table = rt.cos_sin_table(cos, sin).to(dtype)
    x, wt = q.view(b, s, h, d).to(dtype), w.to(dtype)
    tol = TOL[dtype] * 4
    got = rt.qk_norm_rope(x, wt, table, 1e-6, across_heads=True)
    close(got, want.detach(), tol)
    y, rstd = rmsnorm.qk_norm_rope(x.numpy(), wt.numpy(), table.numpy(), 1e-6, across_heads=True,
                                   return_rstd=True)
    assert torch.equal(torch.from_numpy(y), got) and rstd.shape == (b, s, 1, 1)
    close(rstd, ref_rstd(q.view(b, s, h, d), 1e-6, True), 1e-6 if dtype == torch.float32 else 1e-13)
    # the gradients, against autograd through transformers' modules
    dy = torch.randn(b, s, h, d, generator=gen, dtype=torch.float64)
    (want * dy).sum().backward()
    xa, wa = x.clone().requires_grad_(), wt.clone().requires_grad_()
    (rt.qk_norm_rope(xa, wa, table, 1e-6, across_heads=True) * dy.to(dtype)).sum().backward()
    close(xa.grad.flatten(-2), qh.grad, 8 * tol)
    close(wa.grad, norm.weight.grad, 8 * tol * 10)
    dx, dw = rmsnorm.qk_norm_rope_backward(dy.to(dtype).numpy(), x.numpy(), wt.numpy(),
                                           table.numpy(), 1e-6, across_heads=True)
    assert torch.equal(torch.from_numpy(dx), xa.grad) and torch.equal(torch.from_numpy(dw), wa.grad)


def test_across_heads_reads_views_in_place(rng):
    # Q and K inside one fused projection (batch, seq, (8 + 2 + 2) * 16), each normalized over
    # its own heads: the same bits as contiguous copies
    b, s, hq, hk, d = 2, 5, 8, 2, 16
    qkv = rng.standard_normal((b, s, (hq + 2 * hk) * d)).astype(np.float32)
    q = qkv[..., : hq * d].reshape(b, s, hq, d)
    k = qkv[..., hq * d: (hq + hk) * d].reshape(b, s, hk, d)
    wq = (1 + 0.2 * rng.standard_normal(hq * d)).astype(np.float32)
    wk = (1 + 0.2 * rng.standard_normal(hk * d)).astype(np.float32)
    cs = rmsnorm.rope_table(s, d)
    pos = np.tile(np.arange(s), b)
    for a, w in ((q, wq), (k, wk)):
        assert np.shares_memory(a, qkv)
        np.testing.assert_array_equal(
            rmsnorm.qk_norm_rope(a, w, cs, 1e-6, positions=pos, across_heads=True),
            rmsnorm.qk_norm_rope(np.ascontiguousarray(a), w, cs, 1e-6, positions=pos,
                                 across_heads=True))
    # head-major too (heads first, as transformers' (batch, heads, seq, head_dim))
    hm = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(rmsnorm.qk_norm_rope(hm, wq, cs, positions=pos,
                                                       across_heads=True),
                                  rmsnorm.qk_norm_rope(np.ascontiguousarray(q), wq, cs,
                                                       positions=pos, across_heads=True))
    # the KV cache write of K, across heads
    kc = np.zeros((2 * b * s, hk, d), np.float32)
    slots = np.arange(b * s) * 2
    rmsnorm.qk_norm_rope_cache(k, wk, cs, kc, slots, 1e-6, positions=pos, across_heads=True)
    np.testing.assert_array_equal(kc[slots], rmsnorm.qk_norm_rope(
        k, wk, cs, 1e-6, positions=pos, across_heads=True).reshape(b * s, hk, d))


def ulps_apart(a, b):
    return float((a != b).double().mean())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gemma3_roundings_bit_for_bit(dtype):
    # Gemma3RMSNorm: x r (1 + w) in float32, rounded once; then apply_rotary_pos_emb in the
    # model dtype with Gemma 3's cos/sin (rounded to it): round_before_rotation
    gen = torch.Generator().manual_seed(43)
    b, s, h, d = 2, 7, 4, 64
    x = (3 * torch.randn(b, s, h, d, generator=gen)).to(dtype)
    w = (0.3 * torch.randn(d, generator=gen)).to(dtype)
    cfg = transformers.Gemma3TextConfig(hidden_size=h * d, num_attention_heads=h, head_dim=d,
                                        num_hidden_layers=2)
    cos, sin = hf_gemma3.Gemma3RotaryEmbedding(cfg)(x, torch.arange(s)[None].expand(b, s),
                                                    "sliding_attention")
    assert cos.dtype == dtype
    table = rt.cos_sin_table(cos, sin)
    kw = dict(offset=True, round_before_rotation=True)
    got, rstd = rt.qk_norm_rope_with_rstd(x, w, table, 1e-6, **kw)

    def rotate(n):
        return hf_gemma3.apply_rotary_pos_emb(n.transpose(1, 2), n.transpose(1, 2), cos,
                                              sin)[0].transpose(1, 2)

    # Gemma3RMSNorm's formula with the library's r: the same bits everywhere
    mine = (x.float() * rstd) * (1.0 + w.float())
    assert torch.equal(got, rotate(mine.type_as(x)))
    np_got = rmsnorm.qk_norm_rope(x.view(torch.int16).numpy().view(
        ml_dtypes.bfloat16 if dtype == torch.bfloat16 else np.float16), w.float().numpy(),
        table.numpy(), 1e-6, **kw)
    assert np.array_equal(np_got.view(np.int16), got.view(torch.int16).numpy())
    # transformers' own module: its float32 r may differ in a last bit, moving a rare element
    norm = hf_gemma3.Gemma3RMSNorm(d, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        want = rotate(norm(x))
    assert ulps_apart(got, want) < 0.01
    # without the flag: Qwen3's roundings (x r rounded before the weight), or none, are not
    # Gemma 3's on many elements
    assert ulps_apart(rt.qk_norm_rope(x, w, table, 1e-6, offset=True, round_before_weight=True),
                      want) > 0.1
    assert ulps_apart(rt.qk_norm_rope(x, w, table, 1e-6, offset=True), want) > 0.1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_olmo2_roundings_bit_for_bit(dtype):
    # Olmo2RMSNorm: w (x r) over the projection in float32, rounded once; then
    # apply_rotary_pos_emb with OLMo 2's float32 cos/sin: the rotation in float32, rounded
    # once: across_heads, round_before_rotation and float_rotation
    gen = torch.Generator().manual_seed(47)
    b, s, h, d = 2, 6, 4, 32
    q = (3 * torch.randn(b, s, h * d, generator=gen)).to(dtype)
    w = (1 + 0.3 * torch.randn(h * d, generator=gen)).to(dtype)
    cos, sin = olmo2_rotary(h, d, b, s)
    assert cos.dtype == torch.float32
    table = rt.cos_sin_table(cos, sin)
    kw = dict(across_heads=True, round_before_rotation=True, float_rotation=True)
    x = q.view(b, s, h, d)
    got, rstd = rt.qk_norm_rope_with_rstd(x, w, table, 1e-6, **kw)

    def rotate(n):
        n = n.view(b, s, h, d).transpose(1, 2)
        return hf_olmo2.apply_rotary_pos_emb(n, n, cos, sin)[0].transpose(1, 2)

    mine = (w * (q.float() * rstd.view(b, s, 1))).to(dtype)  # Olmo2RMSNorm with our r
    assert torch.equal(got, rotate(mine))
    norm = hf_olmo2.Olmo2RMSNorm(h * d, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        want = rotate(norm(q))
    assert ulps_apart(got, want) < 0.01
    # the rotation in the model dtype (Gemma 3's) is not OLMo 2's
    assert ulps_apart(rt.qk_norm_rope(x, w, table, 1e-6, across_heads=True,
                                      round_before_rotation=True), want) > 0.05
    # the flags are the identity in the backward, and change nothing in float32
    x32, w32 = x.float(), w.float()
    assert torch.equal(rt.qk_norm_rope(x32, w32, table, 1e-6, **kw),
                       rt.qk_norm_rope(x32, w32, table, 1e-6, across_heads=True))


def test_zero_heads_give_empty_outputs():
    # (tokens, 0, head_dim): no rows, as torch's rms_norm of an empty tensor; the weight's
    # gradient is zeros
    cs = rmsnorm.rope_table(4, 8)
    for dt in (np.float32, np.float64):
        x = np.zeros((3, 0, 8), dt)
        w = np.ones(8, dt)
        assert rmsnorm.qk_norm(x, w).shape == x.shape
        dx, dw, db = rmsnorm.qk_norm_backward(x, x, w, bias=w)
        assert dx.shape == x.shape and (dw == 0).all() and (db == 0).all()
        y, r = rmsnorm.qk_norm_rope(x, w, cs.astype(dt), return_rstd=True)
        assert y.shape == x.shape and r.shape == (3, 0, 1)
        dx, dw = rmsnorm.qk_norm_rope_backward(x, x, w, cs.astype(dt))
        assert dx.shape == x.shape and dw.shape == (8,) and (dw == 0).all()
        y, r = rmsnorm.qk_norm_rope(x, np.ones(0, dt), cs.astype(dt), across_heads=True,
                                    return_rstd=True)
        assert y.shape == x.shape and r.shape == (3, 1, 1)
        dx, dw = rmsnorm.qk_norm_rope_backward(x, x, np.ones(0, dt), cs.astype(dt),
                                               across_heads=True)
        assert dx.shape == x.shape and dw.shape == (0,)
    x = torch.zeros(3, 0, 8, requires_grad=True)
    w = torch.ones(8, requires_grad=True)
    tcs = torch.from_numpy(cs)
    for f in (lambda: rt.qk_norm(x, w, 1e-6), lambda: rt.qk_norm_rope(x, w, tcs, 1e-6)):
        x.grad = w.grad = None
        y = f()
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros(8))
    wa = torch.ones(0, requires_grad=True)
    y = rt.qk_norm_rope(x, wa, tcs, 1e-6, across_heads=True)
    y.sum().backward()
    assert y.shape == x.shape and wa.grad.shape == (0,)
    assert torch.equal(rt.qk_norm(x.detach(), w.detach()), torch.nn.functional.rms_norm(
        x.detach(), (8,), w.detach()))


def test_range_errors_name_their_cause():
    x = np.ones((3, 2, 8), np.float32)
    cs = rmsnorm.rope_table(10, 8)
    with pytest.raises(rmsnorm.ArgumentError, match=re.escape(
            "positions[1] = 10 is outside [0, 10), the rows of cos_sin "
            "(RMSNORM_ERROR_OUT_OF_RANGE)")) as info:
        rmsnorm.qk_norm_rope(x, None, cs, positions=[0, 10, 1])
    assert info.value.status == 13 and info.value.name == "RMSNORM_ERROR_OUT_OF_RANGE"
    with pytest.raises(rmsnorm.ArgumentError, match=re.escape("positions[2] = -1 is outside")):
        rmsnorm.qk_norm_rope_backward(x, x, None, cs, positions=[0, 1, -1])
    kc = np.zeros((8, 2, 8), np.float32)
    with pytest.raises(rmsnorm.ArgumentError, match=re.escape(
            "slots[2] = 9 is past the cache's 8 slots (RMSNORM_ERROR_OUT_OF_RANGE)")):
        rmsnorm.qk_norm_rope_cache(x, None, cs, kc, np.array([0, -1, 9]))
    assert (kc == 0).all()
    for kw, text in ((dict(rotary_dim=63), "rotary_dim = 63 must be even"),
                     (dict(rotary_dim=8, theta=1.0), "theta = 1.0 must be a finite number > 1"),
                     (dict(rotary_dim=8, theta=float("nan")), "theta = nan must be"),
                     (dict(rotary_dim=8, linear_factor=-2.5),
                      "linear_factor = -2.5 must be a finite number > 0")):
        with pytest.raises(rmsnorm.ArgumentError, match=re.escape(f"rope_table: {text}")) as info:
            rmsnorm.rope_table(4, **kw)
        assert info.value.name == "RMSNORM_ERROR_BAD_ROPE" and info.value.status == 14
    with pytest.raises(ValueError, match=re.escape("rope_table: rotary_dim must be > 0, got 0")):
        rmsnorm.rope_table(4, 0)
    tx, tcs = torch.from_numpy(x), torch.from_numpy(cs)
    with pytest.raises(ValueError, match=re.escape(
            "rmsnorm::qk_norm_rope: positions[1] = 10 is outside [0, 10), the rows of cos_sin")):
        rt.qk_norm_rope(tx, None, tcs, positions=torch.tensor([0, 10, 1]))
    with pytest.raises(ValueError, match=re.escape(
            "rmsnorm::qk_norm_rope_backward: positions[0] = 12 is outside [0, 10)")):
        ops.qk_norm_rope_backward(tx, tx, None, tcs, None, None, [True, False],
                                  positions=torch.tensor([12, 0, 1]))


def test_across_heads_fake_and_autograd_modes():
    x = torch.empty(5, 3, 16, device="meta")
    cs = torch.empty(9, 16, device="meta")
    y, rstd = rt.qk_norm_rope_with_rstd(x, torch.empty(48, device="meta"), cs, across_heads=True)
    assert y.shape == x.shape and rstd.shape == (5, 1, 1)
    real = torch.randn(5, 3, 16), torch.from_numpy(rmsnorm.rope_table(9, 16))
    for a in ((x, cs), real):  # the fake kernel and the CPU kernel say the same
        with pytest.raises(ValueError, match=r"rmsnorm::qk_norm_rope: Expected weight to be of "
                                             r"same shape as normalized_shape, but got weight of "
                                             r"shape \[16\] and normalized_shape = \[48\]"):
            rt.qk_norm_rope(a[0], torch.ones(16, device=a[0].device), a[1], across_heads=True)
    torch.library.opcheck(ops.qk_norm_rope_forward.default,
                          (torch.randn(2, 3, 2, 12, dtype=torch.float64).requires_grad_(),
                           torch.randn(24, dtype=torch.float64).requires_grad_(),
                           real[1][:, :12].double().contiguous()),
                          dict(across_heads=True, style="gptj"))
    # batched gradients and forward-mode AD (vmap over the leading dim)
    gen = torch.Generator().manual_seed(13)
    xs, w = f64(3, 2, 2, 8, gen=gen), f64(16, gen=gen, shift=1.0)
    cs8 = torch.from_numpy(table64(8, 8, 30.0))

    def f(x, w):
        return rt.qk_norm_rope(x, w, cs8, 1e-3, across_heads=True,
                               positions=torch.tensor([1, 5]))

    assert torch.autograd.gradcheck(lambda x, w: f(x[0], w), (xs, w), check_forward_ad=True,
                                    check_batched_grad=True)
    got = torch.func.jacfwd(f, argnums=(0, 1))(xs[0], w)
    want = torch.func.jacrev(f, argnums=(0, 1))(xs[0], w)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)
    torch.testing.assert_close(torch.vmap(f, in_dims=(0, None))(xs, w),
                               torch.stack([f(x, w) for x in xs]))


# ---- torch: values and gradients ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64],
                         ids=str)
@pytest.mark.parametrize("case", CASES[1:4] + CASES[6:], ids=str)
def test_torch_matches_numpy_and_hf(dtype, case):
    rng = np.random.default_rng(5)
    npdt = {torch.float32: np.float32, torch.float16: np.float16,
            torch.bfloat16: ml_dtypes.bfloat16, torch.float64: np.float64}[dtype]
    x, w, cs, pos = case_args(rng, case, npdt, shape=(3, 4, 16))
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    tx, tw = torch.from_numpy(x.astype(np.float64)).to(dtype), torch.from_numpy(
        w.astype(np.float64)).to(dtype)
    tcs = torch.from_numpy(cs).to(ct)
    tpos = None if pos is None else torch.from_numpy(pos)
    kw = case_kw(case)
    y, rstd = rt.qk_norm_rope_with_rstd(tx, tw, tcs, 1e-6, positions=tpos, **kw)
    assert not rstd.requires_grad and rstd.shape == ((3, 1, 1) if kw["across_heads"] else (3, 4, 1))
    want_y, want_r = rmsnorm.qk_norm_rope(x, w, tcs.numpy(), 1e-6, positions=pos, **kw,
                                          return_rstd=True)
    assert torch.equal(y.double(), t64(want_y)) and torch.equal(rstd, torch.from_numpy(want_r))
    assert torch.equal(rt.qk_norm_rope(tx, tw, tcs, 1e-6, positions=tpos, **kw), y)
    # gradients against the float64 oracle's
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(6)).to(dtype)
    a, b = tx.clone().requires_grad_(), tw.clone().requires_grad_()
    rt.qk_norm_rope(a, b, tcs, 1e-6, positions=tpos, **kw).backward(dy)
    a64, b64 = tx.double().requires_grad_(), tw.double().requires_grad_()
    ref(a64, b64, tcs.double(), tpos, 1e-6, **ref_kw(case)).backward(dy.double())
    assert a.grad.dtype == dtype and b.grad.dtype == dtype
    close(a.grad, a64.grad, 8 * TOL[dtype])
    close(b.grad, b64.grad, 8 * TOL[dtype] * 12)


def f64(*shape, gen, shift=0.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) + shift).requires_grad_()


@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradcheck(case):
    gen = torch.Generator().manual_seed(3)
    d = 16
    x = f64(2, 2, 2, d, gen=gen)
    nw = 2 * d if case.get("across") else d
    w = None if case.get("no_weight") else f64(nw, gen=gen, shift=0 if case.get("offset") else 1)
    rot = case.get("rot", 0) or d
    cs = torch.from_numpy(table64(8, rot, 30.0))
    pos = torch.tensor([7, 0, 3, 3]) if case.get("positions") else None
    kw = case_kw(case)

    def f(*args):
        return rt.qk_norm_rope(args[0], args[1] if w is not None else None, cs, 1e-3,
                               positions=pos, **kw)

    inputs = (x, w) if w is not None else (x,)
    assert torch.autograd.gradcheck(f, inputs, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, inputs)
    # forward over reverse (the composite backward's own tangents)
    assert torch.autograd.gradgradcheck(f, inputs, check_fwd_over_rev=True)


def test_first_order_is_the_fast_kernel():
    gen = torch.Generator().manual_seed(5)
    x, w = f64(4, 3, 16, gen=gen), f64(16, gen=gen, shift=1.0)
    cs = torch.from_numpy(table64(6, 12))
    for kw in (dict(style="gptj", rotary_dim=12), dict(offset=True, positions=torch.tensor(
            [5, 4, 0, 1]), rotary_dim=12)):
        y = rt.qk_norm_rope(x, w, cs, 1e-5, **kw)
        dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
        fast = torch.autograd.grad(y, (x, w), dy, retain_graph=True)
        slow = torch.autograd.grad(y, (x, w), dy, create_graph=True)
        assert slow[0].requires_grad
        for p, q in zip(fast, slow):
            torch.testing.assert_close(p, q.detach(), rtol=1e-12, atol=1e-12)


def test_cos_sin_is_a_constant():
    x = torch.randn(3, 2, 8, requires_grad=True)
    cs = torch.from_numpy(rmsnorm.rope_table(3, 8)).requires_grad_()
    with pytest.raises(ValueError, match="rmsnorm::qk_norm_rope: no gradient flows to cos_sin"):
        rt.qk_norm_rope(x, None, cs)
    with pytest.raises(ValueError, match="no gradient flows to cos_sin"):
        rt.qk_norm_rope(x.detach(), None, cs)
    # detached, or without grad mode: fine
    rt.qk_norm_rope(x, None, cs.detach()).sum().backward()
    with torch.no_grad():
        rt.qk_norm_rope(x, None, cs)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        dual = fwAD.make_dual(cs.detach(), torch.ones_like(cs))
        with pytest.raises(ValueError, match="no gradient flows to cos_sin"):
            rt.qk_norm_rope(x.detach(), None, dual)


def test_meta_fake_and_errors():
    x = torch.empty(5, 3, 16, device="meta", dtype=torch.bfloat16)
    cs = torch.empty(9, 16, device="meta")
    y, rstd = rt.qk_norm_rope_with_rstd(x, torch.empty(16, device="meta"), cs)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert rstd.shape == (5, 3, 1) and rstd.dtype == torch.float32
    pos = torch.empty(5, device="meta", dtype=torch.long)
    assert rt.qk_norm_rope(x, None, cs[:, :8], positions=pos, rotary_dim=8).shape == x.shape
    real = torch.randn(5, 3, 16), torch.from_numpy(rmsnorm.rope_table(9, 16))
    # the fake kernel (meta) and the CPU kernel say the same
    for args in ((x, None, cs), real):
        with pytest.raises(ValueError, match="rmsnorm::qk_norm_rope: style must be 'neox'"):
            rt.qk_norm_rope(args[0], None, args[-1], style="rotate")
        with pytest.raises(ValueError, match="rmsnorm::qk_norm_rope: rotary_dim must be 0"):
            rt.qk_norm_rope(args[0], None, args[-1], rotary_dim=3)
        with pytest.raises(ValueError, match=r"rmsnorm::qk_norm_rope: cos_sin has shape \[9, 16\]; "
                                             r"expected \(n_positions, 8\)"):
            rt.qk_norm_rope(args[0], None, args[-1], rotary_dim=8)
        with pytest.raises(ValueError, match="rmsnorm::qk_norm_rope: positions has 4 values"):
            rt.qk_norm_rope(args[0], None, args[-1],
                            positions=torch.zeros(4, dtype=torch.long, device=args[0].device))
        with pytest.raises(TypeError, match="rmsnorm::qk_norm_rope: positions has dtype float32"):
            rt.qk_norm_rope(args[0], None, args[-1],
                            positions=torch.zeros(5, device=args[0].device))
        with pytest.raises(ValueError, match="rmsnorm::qk_norm_rope: cos_sin has 4 rows"):
            rt.qk_norm_rope(args[0], None, args[-1][:4])


def test_opcheck():
    gen = torch.Generator().manual_seed(8)
    cs = torch.from_numpy(rmsnorm.rope_table(6, 12))
    qkv = torch.randn(4, 3, 2, 16, generator=gen)
    cases = [
        (ops.qk_norm_rope.default,
         (qkv[:, 1].requires_grad_(), torch.randn(16, generator=gen).requires_grad_(), cs, 1e-6),
         dict(positions=torch.tensor([5, 1, 1, 0], dtype=torch.int32), style="gptj",
              rotary_dim=12)),
        (ops.qk_norm_rope_forward.default,
         (torch.randn(2, 2, 2, 12, generator=gen, dtype=torch.float64).requires_grad_(), None,
          cs.double()), dict(offset=True)),
    ]
    for op, args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


def test_compile_and_export_equal_eager():
    gen = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 6, 8, 16, generator=gen), torch.randn(2, 6, 2, 16, generator=gen)
    wq, wk = 1 + 0.1 * torch.randn(2, 16, generator=gen)
    cs = torch.from_numpy(rmsnorm.rope_table(6, 16))
    pos = torch.arange(6).repeat(2)

    def f(q, k, wq, wk, cs, pos):
        a = rt.qk_norm_rope(q, wq, cs, 1e-6, positions=pos)
        b = rt.qk_norm_rope(k, wk, cs[:, 2:14], 1e-6, positions=pos, style="gptj",
                            rotary_dim=12)
        return a * 2, b + 1

    args = (q, k, wq, wk, cs, pos)
    want = f(*args)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    got = compiled(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    xs = [t.clone().requires_grad_() for t in args[:4]]
    sum(y.pow(2).sum() for y in compiled(*xs, cs, pos)).backward()
    ys = [t.clone().requires_grad_() for t in args[:4]]
    sum(y.pow(2).sum() for y in f(*ys, cs, pos)).backward()
    for p, r in zip(xs, ys):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-6)

    class M(torch.nn.Module):
        def forward(self, q, k, wq, wk, cs, pos):
            return f(q, k, wq, wk, cs, pos)

    ep = torch.export.export(M(), args)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "rmsnorm.qk_norm_rope.default" in targets
    got = ep.module()(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---- transformers' Qwen3 ------------------------------------------------------------------


def build_qwen3(attn="eager"):
    torch.manual_seed(17)
    cfg = transformers.Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=8,
                                   num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=64)
    cfg._attn_implementation = attn
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.3)
    return model.float().eval()


IDS = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(18))


def forward_backward(model, ids, **kw):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids, **kw)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                 if p.grad is not None}


class _Count(torch.overrides.TorchFunctionMode):
    """Records the rmsnorm.torch functions called (their __torch_function__ dispatch)."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def test_cos_sin_table_of_hf():
    cfg = transformers.Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16)
    pos = torch.tensor([[0, 1, 2, 3], [5, 9, 2, 0]])
    cos, sin = hf_qwen3.Qwen3RotaryEmbedding(cfg)(torch.zeros(1), pos)
    table = rt.cos_sin_table(cos, sin)
    assert table.shape == (8, 16) and table.dtype == torch.float32
    assert torch.equal(table[5], torch.cat((cos[1, 1, :8], sin[1, 1, :8])))
    # HF computes its angles in float32: within a few float32 ulps of rope_table's
    ours = torch.from_numpy(rmsnorm.rope_table(10, 16, cfg.rope_parameters["rope_theta"]))
    torch.testing.assert_close(table, ours[pos.reshape(-1)], rtol=0, atol=2e-6)


def test_patched_qwen3_matches_and_compiles():
    model = build_qwen3()
    patched = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.patch(patched, qk_rope=True)
    attns = [m for m in patched.modules() if type(m).__name__ == "Qwen3Attention"]
    assert len(attns) == 2 and all("forward" in m.__dict__ for m in attns)
    assert isinstance(attns[0].q_norm, rt.LlamaRMSNorm)
    assert list(patched.state_dict()) == list(model.state_dict())
    calls = []
    with _Count(calls), torch.no_grad():
        patched(input_ids=IDS)
    assert calls.count("qk_norm_rope") == 2 * len(attns)
    # logits and a training step's gradients: float32 noise
    logits0, grads0 = forward_backward(model, IDS)
    logits1, grads1 = forward_backward(patched, IDS)
    torch.testing.assert_close(logits1, logits0, rtol=1e-4, atol=1e-5)
    assert grads1.keys() == grads0.keys()
    for n in grads0:
        g0, g1 = grads0[n], grads1[n]
        torch.testing.assert_close(g1, g0, rtol=1e-3, atol=1e-5 * max(1.0, float(g0.abs().max())),
                                   msg=lambda m: f"grad {n}: {m}")
    # positions per sequence (a batch of cos rows), and a decoding step through the cache
    pos = torch.arange(12).repeat(2, 1) + torch.tensor([[0], [3]])
    with torch.no_grad():
        a = model(input_ids=IDS, position_ids=pos).logits
        b = patched(input_ids=IDS, position_ids=pos).logits
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        outs = []
        for m in (model, patched):
            cache = transformers.DynamicCache()
            m(input_ids=IDS[:, :8], cache=cache, use_cache=True)
            outs.append(m(input_ids=IDS[:, 8:], cache=cache, use_cache=True).logits)
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(outs[1], logits0[:, 8:], rtol=1e-4, atol=1e-5)
    rt.patch(patched, qk_rope=True, exact_hf=True)  # again: exact_hf follows, nothing else
    assert all(m._rmsnorm_qk_rope_exact for m in attns)
    # compiled: no graph break, the same logits
    torch._dynamo.reset()
    compiled = torch.compile(patched, fullgraph=True)
    with torch.no_grad():
        want = patched(input_ids=IDS).logits
        got = compiled(input_ids=IDS).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_patch_qk_rope_leaves_unknown_norms():
    model = build_qwen3()
    attn = model.model.layers[0].self_attn

    class OddNorm(torch.nn.Module):  # not a Llama-style RMSNorm: left in place
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(16))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return x * self.weight

    attn.q_norm = OddNorm()
    with pytest.warns(UserWarning, match="left Qwen3Attention's QK-norm and RoPE unfused"):
        rt.patch(model, qk_rope=True)
    assert "forward" not in attn.__dict__
    assert "forward" in model.model.layers[1].self_attn.__dict__
