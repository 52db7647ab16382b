"""test_ops.py - the rmsnorm:: torch ops as torch sees them: torch.library.opcheck
for every op and dtype (schema, autograd registration, fake kernels, AOT
dispatch static and dynamic), fake and meta tensors, gradients of gradients
(gradgradcheck in float64), torch.compile(fullgraph=True) and torch.export
against eager, a patched transformers Llama compiled without recompiles, and
the eager entry points' routing (__torch_function__, threads)."""

import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import rmsnorm  # noqa: E402
import rmsnorm.torch as rt  # noqa: E402

ops = torch.ops.rmsnorm
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def samples(dtype):
    """(name, op overload, args, kwargs) for every op, small, with inputs that
    require grad where the op is differentiable."""
    g = torch.Generator().manual_seed(21)

    def t(*shape, grad=True, scale=1.0, shift=0.0):
        x = (torch.randn(shape, generator=g) * scale + shift).to(dtype)
        return x.requires_grad_(grad)

    x, w, b = t(3, 8), t(8, shift=1.0), t(8)
    dy = t(3, 8, grad=False)
    x3 = t(2, 3, 8)
    rstd = ops.rms_norm_forward(x.detach(), [8], w.detach(), 1e-5)[1]
    _, mean, lrstd = ops.layer_norm_forward(x.detach(), [8], w.detach(), b.detach(), 1e-5)
    qkv = t(4, 3, 2, 8, grad=False)
    W = t(8, 5, scale=0.3)
    stats = 3.0 * ops.rms_norm_shard_stats(x3.detach(), 20, 4)  # (2, 3): x3's 3 rows of 8
    dots = torch.randn(3, generator=g, dtype=torch.float64)
    out = [
        ("rms_norm", ops.rms_norm.default, (x, [8], w, 1e-5), dict(bias=b, partial=0.5)),
        ("rms_norm offset", ops.rms_norm.default, (x3, [3, 8], None), dict(eps_outside=True)),
        ("rms_norm.out", ops.rms_norm.out, (x.detach(), [8], w.detach(), 1e-5),
         dict(out=torch.empty(3, 8, dtype=dtype), round_before_weight=True)),
        ("rms_norm_forward", ops.rms_norm_forward.default, (x, [8], w, None), dict(offset=True)),
        ("rms_norm_backward", ops.rms_norm_backward.default,
         (dy, x, [8], w, rstd, 1e-5, [True, True, True]), dict(bias=b)),
        ("layer_norm", ops.layer_norm.default, (x, [8], w, b, 1e-5), {}),
        ("layer_norm.out", ops.layer_norm.out, (x.detach(), [8]),
         dict(out=torch.empty(3, 8, dtype=dtype))),
        ("layer_norm_forward", ops.layer_norm_forward.default, (x3, [8], w, None), {}),
        ("layer_norm_backward", ops.layer_norm_backward.default,
         (dy, x, [8], w, b, mean, lrstd, 1e-5, [True, True, False]), {}),
        ("fused_add_rms_norm", ops.fused_add_rms_norm.default, (x, t(3, 8), [8], w), {}),
        ("fused_add_rms_norm_inplace", ops.fused_add_rms_norm_inplace.default,
         (t(3, 8, grad=False), t(3, 8, grad=False), [8], w.detach()), {}),
        ("fused_add_rms_norm_backward", ops.fused_add_rms_norm_backward.default,
         (dy, dy, x, [8], w, None, [True, True, True]), dict(bias=b)),
        ("qk_norm", ops.qk_norm.default, (t(4, 3, 8), w), {}),
        ("qk_norm strided", ops.qk_norm.default, (qkv[:, 1].requires_grad_(), w), {}),
        ("qk_norm_inplace", ops.qk_norm_inplace.default, (qkv[:, 0], w.detach()), {}),
        ("qk_norm_backward", ops.qk_norm_backward.default,
         (t(4, 3, 8, grad=False), t(4, 3, 8), w, 1e-6, [True, True, False]), {}),
        ("rms_norm_int8", ops.rms_norm_int8.default, (x, [8], w), {}),
        ("rms_norm_fp8", ops.rms_norm_fp8.default, (x, [8], w), dict(scale=0.01)),
        ("rms_norm_quant", ops.rms_norm_quant.default, (t(3, 64), [64], None),
         dict(format="int8", group=32, pow2_scale=True)),
        # (inputs without grad: opcheck's autograd check sums every output into the first,
        # the integer codes; new_residual's gradient is checked in test_seams.py)
        ("fused_add_rms_norm_quant", ops.fused_add_rms_norm_quant.default,
         (t(3, 64, grad=False), t(3, 64, grad=False), [64], None), dict(format="q8_0")),
        # a shard: columns [4, 12) of rows of 20 (the sums over the shards from one shard)
        ("rms_norm_shard_stats", ops.rms_norm_shard_stats.default, (x3, 20, 4),
         dict(partial=0.5)),
        ("rms_norm_shard_forward", ops.rms_norm_shard_forward.default,
         (x3, stats, 20, 4, w, 1e-5), dict(bias=b, offset=True, round_before_weight=True)),
        ("rms_norm_shard_backward_dots", ops.rms_norm_shard_backward_dots.default,
         (dy, x, stats[0], 20, 12, w, None), dict(eps_outside=True)),
        ("rms_norm_shard_backward", ops.rms_norm_shard_backward.default,
         (dy, x, stats[0], dots, 20, 0, w, 1e-5, [True, True, True]), dict(bias=b, partial=0.3)),
    ]
    # QK-norm + RoPE: a table of 6 positions (the compute type's), positions for 4 tokens
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    cs = torch.from_numpy(rmsnorm.rope_table(6, 8, 100.0, dtype="float64")).to(ct)
    cs6 = cs[:, [0, 1, 2, 4, 5, 6]].contiguous()  # rotary_dim 6
    pos = torch.tensor([5, 0, 3, 3])
    out += [
        ("qk_norm_rope", ops.qk_norm_rope.default, (t(4, 3, 8), w, cs6), dict(positions=pos,
                                                                             rotary_dim=6)),
        ("qk_norm_rope strided", ops.qk_norm_rope.default,
         (qkv[:, 1].requires_grad_(), w, cs, 1e-6), dict(style="gptj", offset=True)),
        ("qk_norm_rope_forward", ops.qk_norm_rope_forward.default, (t(2, 2, 3, 8), None, cs),
         dict(round_before_weight=True)),
        ("qk_norm_rope_backward", ops.qk_norm_rope_backward.default,
         (t(4, 3, 8, grad=False), t(4, 3, 8), w, cs, None, 1e-6, [True, True]),
         dict(positions=pos, style="gptj")),
        ("qk_norm_rope_cache", ops.qk_norm_rope_cache.default,
         (t(4, 3, 8, grad=False), w.detach(), cs, t(7, 3, 8, grad=False), torch.tensor([6, 0, 2, 4])),
         dict(positions=pos, v=t(4, 3, 8, grad=False), v_cache=t(7, 3, 8, grad=False))),
    ]
    z = t(3, 8, scale=2.0)
    grstd = ops.gated_rms_norm_forward(x.detach(), z.detach(), w.detach(), 1e-5, group_size=4)[1]
    out += [
        ("gated_rms_norm", ops.gated_rms_norm.default, (x, z, w, 1e-5), dict(group_size=4)),
        ("gated_rms_norm norm first", ops.gated_rms_norm.default, (x3, t(2, 3, 8), None),
         dict(norm_before_gate=True, activation="sigmoid", round_before_weight=True)),
        ("gated_rms_norm_forward", ops.gated_rms_norm_forward.default, (x, z, w, None),
         dict(group_size=2, offset=True)),
        ("gated_rms_norm_backward", ops.gated_rms_norm_backward.default,
         (dy, x, z, w, grstd, 1e-5, [True, True, True]), dict(group_size=4)),
        ("sandwich_rms_norm", ops.sandwich_rms_norm.default, (x, t(3, 8), [8], w, b, 1e-5),
         dict(offset=True)),
        ("sandwich_rms_norm_inplace", ops.sandwich_rms_norm_inplace.default,
         (t(3, 8, grad=False), t(3, 8, grad=False), [8], w.detach()), dict(partial=0.5)),
        ("sandwich_rms_norm_backward", ops.sandwich_rms_norm_backward.default,
         (dy, dy, x, t(3, 8), [8], w, b, None, [True, True, True, True]), dict(offset=True)),
    ]
    if rmsnorm.linear_available():
        out += [
            ("rms_norm_linear", ops.rms_norm_linear.default, (x, W, w, 1e-6, t(5)), {}),
            ("rms_norm_linear_backward", ops.rms_norm_linear_backward.default,
             (t(3, 5, grad=False), x, W, w, 1e-6, None, False, [True, True, True, False]), {}),
        ]
    return out


def test_every_op_is_registered_and_sampled():
    names = {name.split(" ")[0] for name, *_ in samples(torch.float32)}
    registered = {op for op in dir(ops) if not op.startswith("_") and isinstance(
        getattr(ops, op), torch._ops.OpOverloadPacket)}
    registered |= {f"{p}.out" for p in registered if "out" in getattr(ops, p).overloads()}
    if not rmsnorm.linear_available():
        registered -= {"rms_norm_linear", "rms_norm_linear_backward"}
    assert names == registered


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype):
    for name, op, args, kwargs in samples(dtype):
        # (test_aot_dispatch_dynamic, the slowest, once per op: float32)
        utils = ("test_schema", "test_autograd_registration", "test_faketensor",
                 "test_aot_dispatch_static")
        if dtype == torch.float32:
            utils += ("test_aot_dispatch_dynamic",)
        try:
            torch.library.opcheck(op, args, kwargs, test_utils=utils)
        except Exception as err:
            raise AssertionError(f"opcheck {name} {dtype}: {err}") from None


# ---- the op table --------------------------------------------------------------------------


def test_every_row_of_the_op_table_is_bound():
    """Each RN_OP row is a registered op with a fake kernel and the schema written in the
    table; each RN_FN row a numpy and/or torch function with the table's signature."""
    import inspect

    from rmsnorm import _ops

    for op in _ops.OPS:
        name, _, overload = op.name.partition(".")
        overload_fn = getattr(getattr(ops, name), overload or "default")
        schema = torch._C.parse_schema("rmsnorm::" + op.schema)
        assert str(overload_fn._schema) == str(schema), op
        assert torch._C._dispatch_has_kernel_for_dispatch_key(overload_fn.name(), "Meta"), op
    for fn in _ops.FNS:
        params = [p.name for p in fn.params]
        if fn.where in ("NUMPY", "BOTH"):
            assert list(inspect.signature(getattr(rmsnorm, fn.name)).parameters) == params
        if fn.where in ("TORCH", "BOTH"):
            want = [p for p in params if not p.startswith("return_")]
            assert list(inspect.signature(getattr(rt, fn.name)).parameters) == want


# ---- fake and meta tensors --------------------------------------------------------------


def test_meta_tensors_take_the_fake_kernels():
    x = torch.empty(5, 3, 8, device="meta", dtype=torch.bfloat16)
    w = torch.empty(8, device="meta")
    y, rstd = rt.rms_norm_with_rstd(x, 8, w)
    assert y.device.type == "meta" and y.shape == x.shape and y.dtype == torch.bfloat16
    assert rstd.shape == (5, 3, 1) and rstd.dtype == torch.float32
    assert ops.layer_norm_forward(x, [3, 8])[2].shape == (5, 1, 1)
    q, s = rt.rms_norm_int8(x, 8)
    assert q.dtype == torch.int8 and s.shape == (5, 3, 1)
    assert rt.qk_norm(x).shape == x.shape
    with pytest.raises(ValueError, match=r"rmsnorm::rms_norm: Given normalized_shape=\[4\]"):
        rt.rms_norm(x, 4)
    with pytest.raises(TypeError, match="rmsnorm::rms_norm: input has dtype int64"):
        rt.rms_norm(torch.empty(2, 8, device="meta", dtype=torch.long), 8)


def test_fake_tensors_with_symbolic_sizes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        x = mode.from_tensor(torch.randn(6, 16), static_shapes=False)
        y, rstd = rt.rms_norm_with_rstd(x, x.shape[-1:])
        assert y.shape == x.shape and rstd.shape[0] == x.shape[0]
        dx, dw, db = ops.rms_norm_backward(y, x, x.shape[-1:], None, rstd, None,
                                           [True, False, False])
        assert dx.shape == x.shape and dw is None and db is None


# ---- gradients of gradients ---------------------------------------------------------------


@pytest.mark.parametrize("weight", [False, True], ids=["no weight", "weight"])
@pytest.mark.parametrize("kw", [{}, {"offset": True, "bias": True}, {"partial": 0.5},
                                {"eps_outside": True}], ids=str)
def test_gradgradcheck_rms_norm(weight, kw):
    g = torch.Generator().manual_seed(22)
    x = torch.randn(3, 2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    ps = [torch.randn(2, 6, generator=g, dtype=torch.float64, requires_grad=True)
          for _ in range(2)] if weight else []
    kw = dict(kw)
    use_bias = kw.pop("bias", False) and weight

    def f(x, *p):
        return rt.rms_norm(x, (2, 6), p[0] if p else None, 1e-3,
                           bias=p[1] if use_bias else None, **kw)

    inputs = (x, *ps[: 2 if use_bias else 1])
    assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("weight", [False, True], ids=["no weight", "weight"])
def test_gradgradcheck_layer_norm(weight):
    g = torch.Generator().manual_seed(23)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    ps = [torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
          for _ in range(2)] if weight else []
    assert torch.autograd.gradgradcheck(lambda x, *p: rt.layer_norm(x, 6, *p), (x, *ps))
    if weight:
        assert torch.autograd.gradgradcheck(
            lambda x, w: rt.layer_norm(x, 6, w, None, offset=True), (x, ps[0]))


def test_gradgradcheck_fused_ops():
    g = torch.Generator().manual_seed(24)

    def r(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)

    u, h, w = r(3, 6), r(3, 6), r(6)
    assert torch.autograd.gradgradcheck(lambda u, h, w: rt.fused_add_rms_norm(u, h, 6, w), (u, h, w))
    assert torch.autograd.gradgradcheck(lambda x, w: rt.qk_norm(x, w), (r(2, 3, 6), w))
    if rmsnorm.linear_available():
        assert torch.autograd.gradgradcheck(lambda x, W, w: rt.rms_norm_linear(x, W, w),
                                            (r(3, 6), r(6, 4), w))


def test_double_backward_matches_torch():
    # a gradient penalty: d/dw of |d loss/dx|^2, against torch's own rms_norm
    g = torch.Generator().manual_seed(25)
    x0 = torch.randn(5, 32, generator=g, dtype=torch.float64)
    w0 = torch.randn(32, generator=g, dtype=torch.float64)
    grads = []
    for fn in (lambda x, w: rt.rms_norm(x, 32, w, 1e-5), lambda x, w: F.rms_norm(x, (32,), w, 1e-5)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        (gx,) = torch.autograd.grad((fn(x, w) ** 3).sum(), x, create_graph=True)
        grads.append(torch.autograd.grad(gx.pow(2).sum(), (x, w)))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_first_order_is_the_fast_kernel():
    # create_graph=False runs the library's backward; create_graph=True the aten
    # composition: the same values (float64: to rounding)
    x = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    y = rt.rms_norm(x, 16, w, partial=0.5)
    dy = torch.randn_like(y)
    fast = torch.autograd.grad(y, (x, w), dy, retain_graph=True)
    slow = torch.autograd.grad(y, (x, w), dy, create_graph=True)
    assert slow[0].requires_grad
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-12)


# ---- torch.compile and torch.export -------------------------------------------------------


class Block(torch.nn.Module):
    """A small pre-norm block using every differentiable rmsnorm.torch function."""

    def __init__(self):
        super().__init__()
        self.norm = rt.RMSNorm(16, eps=1e-6)
        self.ln = rt.LayerNorm(16)
        self.lin = torch.nn.Linear(16, 16)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.2)

    def forward(self, x):
        h = self.lin(self.norm(x))
        y, h2 = rt.fused_add_rms_norm(h, x, 16, self.norm.weight)
        q = rt.qk_norm(h2.unflatten(-1, (2, 8)), None, 1e-6).flatten(-2)
        return self.ln(y) + q + rt.rms_norm(x, x.shape[-1:], partial=0.5)


def test_compile_fullgraph_equals_eager():
    torch._dynamo.reset()
    m = Block()
    x = torch.randn(2, 5, 16, requires_grad=True)
    cm = torch.compile(m, fullgraph=True, dynamic=False)
    y = cm(x)
    torch.testing.assert_close(y, m(x), rtol=0, atol=0)
    y.sum().backward()
    gx, gw = x.grad.clone(), m.norm.weight.grad.clone()
    x.grad = None
    m.zero_grad()
    m(x).sum().backward()
    torch.testing.assert_close(gx, x.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gw, m.norm.weight.grad, rtol=1e-6, atol=1e-6)


def test_export_equals_eager():
    m = Block().eval()
    x = torch.randn(3, 4, 16)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(m, (x,), dynamic_shapes=({0: batch},))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"rmsnorm.rms_norm.default", "rmsnorm.fused_add_rms_norm.default",
            "rmsnorm.layer_norm.default", "rmsnorm.qk_norm.default"} <= targets
    for shape in [(3, 4, 16), (7, 4, 16)]:
        xx = torch.randn(shape)
        torch.testing.assert_close(ep.module()(xx), m(xx), rtol=0, atol=0)


def test_patched_llama_compiles_without_recompiles():
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    torch.manual_seed(26)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.2)
    rt.patch(model)
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        compiled = torch.compile(model, fullgraph=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a recompile-limit warning fails here
            with torch._dynamo.config.patch(error_on_recompile=True):
                got = compiled(input_ids=ids).logits
                again = compiled(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, again)


# ---- the eager entry points -----------------------------------------------------------------


def test_torch_function_subclasses_and_modes_are_honoured():
    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    x = torch.randn(2, 8).as_subclass(Logged)
    y = rt.rms_norm(x, 8)
    assert "rms_norm" in seen
    assert torch.equal(y.as_subclass(torch.Tensor), rt.rms_norm(x.as_subclass(torch.Tensor), 8))

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(("mode", getattr(func, "__name__", str(func))))
            return func(*args, **(kwargs or {}))

    seen.clear()
    with Mode():
        rt.layer_norm(torch.randn(2, 8), 8)
    assert ("mode", "layer_norm") in seen


def test_dispatch_modes_see_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(2, 8)
    with Record():
        rt.rms_norm(x, 8)
    assert calls == ["rmsnorm.rms_norm.default"]


def test_symbolic_normalized_shape_takes_the_ops_path():
    # make_fx with symbolic sizes hands the function SymInts
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: rt.rms_norm(x, x.shape[-1:]), tracing_mode="symbolic")(torch.randn(3, 8))
    assert any("rmsnorm.rms_norm" in str(n.target) for n in gm.graph.nodes)
    x = torch.randn(5, 8)
    torch.testing.assert_close(gm(x), rt.rms_norm(x, 8), rtol=0, atol=0)
