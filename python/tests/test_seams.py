"""test_seams.py - where the torch ops meet the code around them: a meta tensor among CPU
arguments (refused, as torch's own ops refuse it), positions of every integer dtype in every
autograd mode, the gradient of fused_add_rms_norm_quant's new residual, the gated modules
under TorchScript and with transformers' mixed dtypes, and patch()'s choice of module in
the dtypes a model runs in. Whole models, every architecture: test_zoo.py."""

import warnings

import pytest

torch = pytest.importorskip("torch")

import rmsnorm.torch as rt  # noqa: E402
from test_ops import samples  # noqa: E402

ops = torch.ops.rmsnorm


# ---- devices -------------------------------------------------------------------------------


def _tensor_args(args, kwargs):
    """(where, key) of every tensor argument of a sample."""
    out = [("args", i) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    return out + [("kwargs", k) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]


def _with(args, kwargs, where, key, value):
    args, kwargs = list(args), dict(kwargs)
    (args if where == "args" else kwargs)[key] = value
    return args, kwargs


def test_a_meta_argument_among_cpu_ones_is_refused():
    """Every op, each tensor argument in turn on the meta device (a weight left
    unmaterialized, a meta table): torch's error, not uninitialized memory; all on meta: a
    meta result (the fake kernel), as torch's own ops."""
    for name, op, args, kwargs in samples(torch.float32):
        for where, key in _tensor_args(args, kwargs) if len(_tensor_args(args, kwargs)) > 1 else []:
            t = (args if where == "args" else kwargs)[key]
            a, k = _with(args, kwargs, where, key, t.detach().to("meta"))
            with pytest.raises(RuntimeError, match="is not on the expected device"):
                op(*a, **k)
        a = [x.detach().to("meta") if isinstance(x, torch.Tensor) else x for x in args]
        k = {n: v.detach().to("meta") if isinstance(v, torch.Tensor) else v
             for n, v in kwargs.items()}
        out = op(*a, **k)
        for o in (out if isinstance(out, tuple) else (out,)):
            assert o is None or o.device.type == "meta", name


def test_meta_weight_refused_by_functions_modules_and_compile():
    x = torch.randn(4, 8)
    with torch.device("meta"):
        norm = rt.RMSNorm(8)
    with pytest.raises(RuntimeError, match="meta is not on the expected device cpu"):
        norm(x)
    with pytest.raises(RuntimeError, match="weight is on meta, input on cpu"):
        rt.rms_norm(x, 8, torch.ones(8, device="meta"))
    table = rt.cos_sin_table(torch.ones(4, 8, device="meta"), torch.zeros(4, 8, device="meta"))
    with pytest.raises(RuntimeError, match="cos_sin is on meta"):
        rt.qk_norm_rope(torch.randn(4, 2, 8), None, table)
    f = torch.compile(lambda x, w: rt.rms_norm(x, 8, w), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="is not on the expected device"):
        f(x, torch.ones(8, device="meta"))


# ---- positions -----------------------------------------------------------------------------


@pytest.mark.parametrize("pdtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_positions_of_any_integer_dtype_in_every_autograd_mode(pdtype):
    """Forward, backward, double backward and forward mode with positions of pdtype equal
    the same with int64 positions."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 2, 8, dtype=torch.float64, generator=g)
    w = torch.randn(8, dtype=torch.float64, generator=g)
    table = torch.randn(10, 8, dtype=torch.float64, generator=g)
    pos = torch.tensor([1, 4, 2])

    def run(p):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = rt.qk_norm_rope(xx, ww, table, positions=p)
        gx, gw = torch.autograd.grad((y * y).sum(), (xx, ww), create_graph=True)
        ggx, = torch.autograd.grad((gx * gx).sum() + gw.sum(), xx)
        with torch.autograd.forward_ad.dual_level():
            dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
            t = torch.autograd.forward_ad.unpack_dual(rt.qk_norm_rope(dual, w, table,
                                                                      positions=p)).tangent
        return y, gx, gw, ggx, t

    for a, b in zip(run(pos.to(pdtype)), run(pos)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- fused_add_rms_norm_quant --------------------------------------------------------------


def test_quant_new_residual_carries_the_gradient():
    """new_residual = input + residual gets a gradient (to both, as is); the codes and scales
    none, and no gradient reaches the weight through them."""
    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn(3, 64, generator=g, requires_grad=True) for _ in range(2))
    w = torch.randn(64, generator=g, requires_grad=True)
    codes, scales, h = rt.fused_add_rms_norm_quant(x, r, 64, w, format="q8_0")
    assert not codes.requires_grad and not scales.requires_grad and h.requires_grad
    up = torch.randn(3, 64, generator=g)
    (h * up).sum().backward()
    torch.testing.assert_close(x.grad, up, rtol=0, atol=0)
    torch.testing.assert_close(r.grad, up, rtol=0, atol=0)
    assert w.grad is None
    xd, rd = (t.detach().double().requires_grad_() for t in (x, r))
    f = lambda a, b: rt.fused_add_rms_norm_quant(a, b, 64, None, format="int8")[2]  # noqa: E731
    assert torch.autograd.gradcheck(f, (xd, rd), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(lambda a, b: f(a, b) ** 2, (xd, rd))
    c = torch.compile(lambda a, b: rt.fused_add_rms_norm_quant(a, b, 64, w, format="q8_0")[2],
                      fullgraph=True, backend="aot_eager")
    x.grad = r.grad = None
    (c(x, r) * up).sum().backward()
    torch.testing.assert_close(x.grad, up, rtol=0, atol=0)


# ---- the gated modules ---------------------------------------------------------------------


def _gated_modules():
    return [rt.MambaRMSNormGated(16, 8), rt.Qwen3NextRMSNormGated(16),
            rt.RMSNormGated(16, norm_before_gate=True, activation="sigmoid", hf_rounding=False),
            rt.RMSNormGated(16, group_size=4), rt.MambaRMSNormGated(16, 8, exact_hf=True)]


def test_modules_script():
    """Every module compiles with torch.jit.script and gives eager's bits."""
    g = torch.Generator().manual_seed(9)
    x, z = torch.randn(3, 16, generator=g), torch.randn(3, 16, generator=g)
    plain = [rt.LlamaRMSNorm(16), rt.GemmaRMSNorm(16), rt.Olmo2RMSNorm(16),
             rt.Olmo2RMSNorm(16, exact_hf=True), rt.RMSNorm(16), rt.LayerNorm(16)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated
        for m in _gated_modules() + plain:
            with torch.no_grad():
                m.weight.copy_(torch.randn(16, generator=g))
            s = torch.jit.script(m)
            gated = isinstance(m, rt.RMSNormGated)
            for args in ((x, z), (x,), (x.bfloat16(), z.float())) if gated else ((x,),):
                torch.testing.assert_close(s(*args), m(*args), rtol=0, atol=0)


def _hf_gated():
    """transformers' gated modules with ours of the same form."""
    from transformers.models.mamba2.modeling_mamba2 import Mamba2RMSNormGated
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

    pairs = [(Mamba2RMSNormGated(16, group_size=8), rt.MambaRMSNormGated(16, 8)),
             (Qwen3NextRMSNormGated(16), rt.Qwen3NextRMSNormGated(16))]
    try:
        from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearRMSNormGated

        pairs.append((KimiLinearRMSNormGated(16), rt.RMSNormGated(
            16, norm_before_gate=True, activation="sigmoid", hf_rounding=False)))
    except ImportError:
        pass
    return pairs


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gated_modules_take_transformers_mixed_dtypes(wdtype):
    """A bf16 Mamba2 passes an fp32 scan output with a bf16 gate: every mix of input, gate
    and weight dtypes gives transformers' output dtype and values (within a rounding of the
    output dtype; exact_hf: the same bits)."""
    g = torch.Generator().manual_seed(11)
    dts = (torch.float32, torch.bfloat16, torch.float16)
    for hf, ours in _hf_gated():
        w = torch.randn(16, generator=g).to(wdtype)
        hf.weight = torch.nn.Parameter(w.clone())
        ours.weight = torch.nn.Parameter(w.clone())
        for xd in dts:
            for zd in dts:
                x = torch.randn(5, 16, generator=g).to(xd)
                z = torch.randn(5, 16, generator=g).to(zd)
                want = hf(x, z)
                got = ours(x, z)
                assert got.dtype == want.dtype, (type(hf).__name__, xd, zd)
                tol = 2 * torch.finfo(want.dtype).eps if want.dtype != torch.float32 else 1e-5
                torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=1e-5)
                ours.exact_hf = True
                assert torch.equal(ours(x, z), want)
                ours.exact_hf = False


# ---- patch(): the module for the dtypes a model runs in ------------------------------------


def test_patch_tells_olmo2s_rounding_from_llamas():
    """Olmo2RMSNorm rounds after the weight: in float32 it agrees with Llama's order, in
    bfloat16 it does not, so patch() checks both dtypes and picks Olmo2RMSNorm."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    g = torch.Generator().manual_seed(4)
    for cls, ours, dt in ((Olmo2RMSNorm, rt.Olmo2RMSNorm, torch.bfloat16),
                          (LlamaRMSNorm, rt.LlamaRMSNorm, torch.bfloat16),
                          (Olmo2RMSNorm, rt.Olmo2RMSNorm, torch.float32)):
        model = torch.nn.Sequential(cls(64)).to(dt)
        with torch.no_grad():
            model[0].weight.copy_(torch.randn(64, generator=g) + 1)
        x = torch.randn(8, 64, generator=g).to(dt)
        want = model(x)
        rt.patch(model)
        assert type(model[0]) is ours
        got = model(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)
        rt.patch(model, exact_hf=True)
        assert torch.equal(model(x), want)


# ---- the KV cache from torch ---------------------------------------------------------------


def test_qk_norm_rope_cache_op_and_broadcast_positions():
    """The torch op writes K (and V) where qk_norm_rope would put them, declares the writes
    (compile and export keep them), and positions of shape (1, seq) serve a batch."""
    import rmsnorm

    g = torch.Generator().manual_seed(6)
    x, v = torch.randn(2, 5, 2, 16, generator=g), torch.randn(2, 5, 2, 16, generator=g)
    w, table = torch.randn(16, generator=g), torch.from_numpy(rmsnorm.rope_table(32, 16))
    pos = torch.arange(3, 8).view(1, 5)
    y = rt.qk_norm_rope(x, w, table, 1e-6, positions=pos)
    assert torch.equal(y, rt.qk_norm_rope(x, w, table, 1e-6, positions=pos.expand(2, 5)))
    kc, vc = torch.zeros(20, 2, 16), torch.zeros(20, 2, 16)
    out = rt.qk_norm_rope_cache(x[1], w, table, kc, torch.arange(10, 15), 1e-6, v=v[1],
                                v_cache=vc, positions=pos[0])
    assert out[0] is kc and out[1] is vc
    assert torch.equal(kc[10:15], y[1]) and torch.equal(vc[10:15], v[1])
    assert not kc[:10].any() and not kc[15:].any()
    f = torch.compile(lambda x, c: rt.qk_norm_rope_cache(x, w, table, c, torch.arange(5), 1e-6,
                                                         positions=pos[0]), fullgraph=True)
    kc2 = torch.zeros(20, 2, 16)
    f(x[1], kc2)
    assert torch.equal(kc2[:5], y[1])
    with pytest.raises(ValueError, match=r"slots\[4\] = 20 is past the cache's 20 slots"):
        rt.qk_norm_rope_cache(x[1], w, table, kc2, torch.arange(16, 21), 1e-6)


def test_patched_attention_writes_a_static_cache():
    """patch(model, qk_rope=True) with transformers' StaticCache: K and V go into the cache
    through qk_norm_rope_cache (batch of 2), and greedy generation equals the unpatched."""
    import sys

    import transformers

    cfg = transformers.Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    ref = transformers.Qwen3ForCausalLM(cfg).eval()
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    model.load_state_dict(ref.state_dict())
    rt.patch(model, qk_rope=True)
    patching = sys.modules["rmsnorm.torch.patching"]
    calls, op = [], patching.qk_norm_rope_cache
    patching.qk_norm_rope_cache = lambda *a, **k: calls.append(1) or op(*a, **k)
    try:
        ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=3, do_sample=False,
                                 cache_implementation="static")
            want = ref.generate(ids, max_new_tokens=3, do_sample=False)
    finally:
        patching.qk_norm_rope_cache = op
    assert torch.equal(got, want)
    assert len(calls) == 2 * 2 * 3  # layers x batch rows x (prefill + 2 decoding steps)
