"""test_hf.py - the HF-compatible modules against transformers' own LlamaRMSNorm
and GemmaRMSNorm, and patch() on real (tiny, randomly initialised) Llama, Gemma
and Qwen2 models: logits and every parameter gradient match the unpatched model."""

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import rmsnorm.torch as rt  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm as HFGemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm as HFLlamaRMSNorm  # noqa: E402

HALF_ULP = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("pair", [(HFLlamaRMSNorm, rt.LlamaRMSNorm), (HFGemmaRMSNorm, rt.GemmaRMSNorm)],
                         ids=["llama", "gemma"])
def test_hf_modules_match_transformers(dtype, pair):
    hf_cls, our_cls = pair
    g = torch.Generator().manual_seed(11)
    theirs = hf_cls(256, eps=1e-6).to(dtype)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(256, generator=g) * 0.5)
    ours = our_cls(256, eps=1e-6).to(dtype)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = (torch.randn(4, 7, 256, generator=g) * 3).to(dtype)
    with torch.no_grad():
        a, b = theirs(x), ours(x)
    assert a.dtype == b.dtype
    # HF's order of rounding is reproduced: equal but for an ulp here and there.
    ulps = (a.double() - b.double()).abs() / (a.double().abs() * HALF_ULP[dtype] * 2).clamp_min(1e-30)
    assert float(ulps.max()) <= 1.0 + 1e-9
    assert float((a != b).double().mean()) < (0.5 if dtype == torch.float32 else 0.01)
    # gradients
    dy = torch.randn(x.shape, generator=g).to(dtype)
    grads = []
    for m in (theirs, ours):
        xx = x.clone().requires_grad_()
        m.zero_grad()
        m(xx).backward(dy)
        grads.append((xx.grad.double(), m.weight.grad.double()))
    for ga, gb, what in zip(grads[0], grads[1], ["input", "weight"]):
        tol = 64 * HALF_ULP[dtype] * max(1.0, float(ga.abs().max()))
        assert float((ga - gb).abs().max()) <= tol, what


def test_llama_mixed_precision_weight():
    # A float32 weight with bfloat16 activations: HF's product promotes to float32.
    theirs = HFLlamaRMSNorm(64)
    with torch.no_grad():
        theirs.weight.normal_()
    ours = rt.LlamaRMSNorm(64)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 64).bfloat16()
    a, b = theirs(x), ours(x)
    assert a.dtype == b.dtype == torch.float32
    assert torch.equal(a, b)


# ---- whole models --------------------------------------------------------------------------

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def build(name):
    torch.manual_seed(12)
    if name == "llama":
        cfg = transformers.LlamaConfig(**TINY)
        model = transformers.LlamaForCausalLM(cfg)
    elif name == "gemma":
        cfg = transformers.GemmaConfig(head_dim=16, **TINY)
        model = transformers.GemmaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**TINY)
        model = transformers.Qwen2ForCausalLM(cfg)
    cfg._attn_implementation = "eager"
    # Random norm weights, so that a wrong (1 + w) or w would show.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0.0, 0.3).add_(1.0 if name != "gemma" else 0.0)
    return model.float().eval()


def forward_backward(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name,norm_cls", [("llama", rt.LlamaRMSNorm), ("gemma", rt.GemmaRMSNorm),
                                           ("qwen2", rt.LlamaRMSNorm)])
def test_patched_model_matches(name, norm_cls):
    model = build(name)
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(13))
    logits0, grads0 = forward_backward(model, ids)

    patched = copy.deepcopy(model)
    norms_before = {n: m.weight for n, m in patched.named_modules() if type(m).__name__.endswith("RMSNorm")}
    assert len(norms_before) == 2 * TINY["num_hidden_layers"] + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every norm is recognised: no warning
        assert rt.patch(patched) is patched
    for n, m in patched.named_modules():
        if n in norms_before:
            assert type(m) is norm_cls, n
            assert m.weight is norms_before[n]  # the same Parameter object
    assert list(patched.state_dict()) == list(model.state_dict())
    assert sum(p.numel() for p in patched.parameters()) == sum(p.numel() for p in model.parameters())

    logits1, grads1 = forward_backward(patched, ids)
    torch.testing.assert_close(logits1, logits0, rtol=1e-4, atol=1e-5)
    assert grads1.keys() == grads0.keys()
    for n in grads0:
        g0, g1 = grads0[n], grads1[n]
        torch.testing.assert_close(g1, g0, rtol=1e-3, atol=1e-5 * max(1.0, float(g0.abs().max())),
                                   msg=lambda m: f"{name} grad {n}: {m}")


@pytest.mark.parametrize("name", ["llama", "gemma"])
def test_patched_bfloat16_model_matches(name):
    # In bfloat16 the HF rounding order matters; patch() also verifies each norm
    # (with float32 inputs against bfloat16 weights) before replacing it.
    model = build(name).bfloat16()
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(15))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.patch(model)
    assert any(isinstance(m, (rt.LlamaRMSNorm, rt.GemmaRMSNorm)) for m in model.modules())
    with torch.no_grad():
        got = model(input_ids=ids).logits
    # (bitwise equal with torch 2.15 and transformers 5.24)
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)


# ---- patch() on plain torch modules and odd cases ----------------------------------------------


def test_patch_torch_modules_shared_and_root():
    torch.manual_seed(14)
    shared = torch.nn.RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        shared.weight.normal_()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), shared, torch.nn.GELU(), shared,
                                torch.nn.LayerNorm(16))
    x = torch.randn(3, 16)
    y0 = model(x)
    model.eval()
    rt.patch(model)
    assert isinstance(model[1], rt.RMSNorm) and model[1] is model[3]  # still shared
    assert model[1].weight is shared.weight and not model[1].training
    assert type(model[4]) is torch.nn.LayerNorm  # LayerNorm only when asked
    rt.patch(model, layer_norm=True)
    assert isinstance(model[4], rt.LayerNorm)
    torch.testing.assert_close(model(x), y0, rtol=1e-5, atol=1e-5)
    root = rt.patch(torch.nn.RMSNorm(16))  # the model itself is a norm
    assert isinstance(root, rt.RMSNorm)


def test_patch_leaves_unknown_numerics_alone():
    class ScaledRMSNorm(torch.nn.Module):  # an RMSNorm by name, not by numerics
        def __init__(self, n):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(n))
            self.eps = 1e-6

        def forward(self, x):
            return 2.0 * self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    class MistralStyleRMSNorm(HFLlamaRMSNorm):  # another name, Llama's numerics
        pass

    model = torch.nn.Sequential(ScaledRMSNorm(8), MistralStyleRMSNorm(8))
    w0 = model[0].weight.detach().clone()
    with pytest.warns(UserWarning, match="left .*ScaledRMSNorm in place"):
        rt.patch(model)
    assert type(model[0]) is ScaledRMSNorm and torch.equal(model[0].weight, w0)
    assert type(model[1]) is rt.LlamaRMSNorm
    g = torch.get_rng_state()
    rt.patch(torch.nn.Sequential(MistralStyleRMSNorm(8)))
    assert torch.equal(g, torch.get_rng_state())  # the check used its own generator


# ---- HF numerics on activations like a real model's ---------------------------------------


def real_looking(dtype, rows=48, d=1024, seed=31):
    """Rows with a few outlier channels 20-30x the row's RMS (as in trained LLMs),
    and rows scaled so that r is close to 1.5 * 2^k, where x * r of a bfloat16 or
    float16 x lands on or next to a rounding tie of the dtype."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g)
    channels = torch.randperm(d, generator=g)[:5]
    x[:, channels] *= 20 + 10 * torch.rand(5, generator=g)
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()  # RMS 1 per row
    x[rows // 2:] *= (2.0 / 3.0) * 2.0 ** torch.randint(-3, 4, (rows - rows // 2, 1), generator=g)
    return x.to(dtype)


def ulps(a, b, dtype):
    fi = torch.finfo(dtype)
    scale = a.double().abs().clamp_min(fi.smallest_normal)
    return (a.double() - b.double()).abs() / (scale.log2().floor().exp2() * fi.eps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_hf_numerics_bound_on_real_looking_activations(dtype):
    x = real_looking(dtype)
    d = x.shape[-1]
    g = torch.Generator().manual_seed(32)
    theirs = HFLlamaRMSNorm(d, eps=1e-5).to(dtype)
    ours = rt.LlamaRMSNorm(d, eps=1e-5).to(dtype)
    exact = rt.LlamaRMSNorm(d, eps=1e-5, exact_hf=True).to(dtype)
    for weight in (torch.ones(d), (1 + 0.15 * torch.randn(d, generator=g)).clamp(0.5, 1.5)):
        for m in (theirs, ours, exact):
            with torch.no_grad():
                m.weight.copy_(weight.to(dtype))
        with torch.no_grad():
            a, b, c = theirs(x), ours(x), exact(x)
        # exact_hf: bit for bit
        assert torch.equal(a, c)
        # default: the row statistic may differ from HF's in its last float32 bits, so
        # the normalized value (the output with a unit weight) is within 1 ulp of
        # HF's and the output within 1 + max|w| ulps; almost all elements are equal
        bound = 1.0 if bool((weight == 1).all()) else 1.0 + float(weight.abs().max())
        assert float(ulps(a, b, dtype).max()) <= bound
        assert float((a != b).double().mean()) < 1e-3
    # our r is within one float32 ulp of the exact r
    r = rt.rms_norm_with_rstd(x, d, None, 1e-5)[1].double()
    exact_r = 1 / (x.double().pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    assert float(((r - exact_r) / exact_r).abs().max()) <= 2.0 ** -23


def test_patch_exact_hf_keeps_hf_bits():
    model = build("llama").bfloat16()
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(33))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    rt.patch(model, exact_hf=True)
    assert all(m.exact_hf for m in model.modules() if isinstance(m, rt.LlamaRMSNorm))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, want)
