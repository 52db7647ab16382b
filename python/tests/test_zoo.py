"""test_zoo.py - patch() on every architecture the docs name, as users meet it: each model
from transformers' own code (a tiny config: 2 layers, hidden 64), its norm weights random
(transformers starts them at ones or zeros, which hides roundings), made on the meta device,
patched there, then materialized and loaded; in float32, bfloat16, float16 and float32 under
bfloat16 autocast; with each option of patch(). Each run is checked against the same model
unpatched: the modules replaced and fused, the logits (float32: 1e-5 of their scale;
exact_hf: the same bits), greedy generation with a cache (and with a static cache where the
attention is fused), one training step's gradients, and once per architecture
torch.compile(fullgraph=True), torch.export and ONNX Runtime. The table ZOO is what
docs/python.md's "Supported models" lists: a model named there without a row here fails.
The results are written to python/build/zoo.md."""

import contextlib
import os
import re
import warnings
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import rmsnorm.torch as rt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


class Arch(NamedTuple):
    name: str       # as docs/python.md names it
    model: str      # transformers' class (its config class: model's prefix + "Config")
    config: dict
    fusions: tuple  # the patch() options that fuse something in it
    norms: int      # norm modules in the model: every one is replaced
    fused: int      # decoder layers (sandwich) plus attentions (qk_rope) fused


ZOO = [
    Arch("Llama", "LlamaForCausalLM", BASE, (), 5, 0),
    Arch("Qwen3", "Qwen3ForCausalLM", dict(BASE, head_dim=16), ("qk_rope",), 9, 2),
    Arch("Qwen3-MoE", "Qwen3MoeForCausalLM", dict(BASE, head_dim=16, **MOE), ("qk_rope",), 9, 2),
    Arch("Qwen3-Next", "Qwen3NextForCausalLM",
         dict(BASE, head_dim=16, **MOE, shared_expert_intermediate_size=32,
              linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
              linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"]),
         ("qk_rope",), 8, 1),
    Arch("Gemma 2", "Gemma2ForCausalLM", dict(BASE, head_dim=16), ("sandwich",), 9, 2),
    Arch("Gemma 3", "Gemma3ForCausalLM", dict(BASE, head_dim=16, sliding_window=8),
         ("sandwich", "qk_rope"), 13, 4),
    Arch("Mamba2", "Mamba2ForCausalLM",
         dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
              state_size=16, n_groups=2, expand=2, chunk_size=16), (), 5, 0),
    Arch("Bamba", "BambaForCausalLM",
         dict(BASE, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
              mamba_chunk_size=16, attn_layer_indices=[1]), (), 6, 0),
    Arch("NemotronH", "NemotronHForCausalLM",
         dict(BASE, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16,
              chunk_size=16, hybrid_override_pattern="M*"), (), 4, 0),
    Arch("Kimi-Linear", "KimiLinearForCausalLM",
         dict(BASE, num_key_value_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              moe_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
              kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
              linear_head_dim=16, linear_num_heads=4,
              layer_types=["linear_attention", "full_attention"]), (), 7, 0),
    Arch("OLMo 2", "Olmo2ForCausalLM", BASE, ("qk_rope",), 9, 2),
    Arch("OLMoE", "OlmoeForCausalLM", dict(BASE, **MOE), ("qk_rope",), 9, 2),
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "autocast": torch.float32}
# bfloat16 and float16 without exact_hf: our roundings are HF's within an ulp of each norm
# output, which the layers amplify; the bound is on max |a - b| over max |b| of the logits
LOOSE = {"bfloat16": 0.1, "float16": 0.02, "autocast": 0.1}
OURS = (rt.LlamaRMSNorm, rt.GemmaRMSNorm, rt.Olmo2RMSNorm, rt.RMSNormGated)
RESULTS = []  # one row per run, for python/build/zoo.md


def _options(arch: Arch) -> dict:
    opts = {"plain": {}}
    if arch.fusions:
        opts["fused"] = {f: True for f in arch.fusions}
    opts["exact"] = dict(opts.get("fused", {}), exact_hf=True)
    return opts


def _is_norm(m) -> bool:
    name = type(m).__name__
    return name.endswith("RMSNorm") or name.endswith("RMSNormGated")


def _reference(arch: Arch, dtype):
    """The model made on the CPU, with random norm weights, in eval mode."""
    cls = getattr(transformers, arch.model)
    config = getattr(transformers, arch.model.replace("ForCausalLM", "Config"))(**arch.config)
    if arch.model == "Gemma3ForCausalLM":
        config = transformers.Gemma3TextConfig(**arch.config)
    torch.manual_seed(0)
    ref = cls(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in ref.modules():
            if _is_norm(m):
                m.weight.add_(0.3 * torch.randn(m.weight.shape, generator=g))
    return ref.to(dtype).eval(), cls, config


def _patched(ref, cls, config, dtype, options: dict):
    """A second model: made on the meta device, patched there, then materialized on the CPU
    with ref's weights and buffers."""
    with torch.device("meta"):
        model = cls(config).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # every norm and fusion recognised
        rt.patch(model, **options)
    model.to_empty(device="cpu")  # (a new tensor per parameter: tied ones tied again below)
    model.load_state_dict(ref.state_dict())
    model.tie_weights()
    with torch.no_grad():
        for (name, b), (ref_name, rb) in zip(model.named_buffers(), ref.named_buffers()):
            assert name == ref_name
            b.copy_(rb)
    return model.eval()


def _fused(model) -> int:
    return sum("forward" in m.__dict__ for m in model.modules())


def _rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def _ctx(dname):
    return (torch.autocast("cpu", dtype=torch.bfloat16) if dname == "autocast"
            else contextlib.nullcontext())


def _generate(model, ids, **kw):
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, **kw)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("arch", ZOO, ids=[a.name for a in ZOO])
def test_zoo(arch: Arch, dname: str):
    dtype = DTYPES[dname]
    ref, cls, config = _reference(arch, dtype)
    norms = sum(_is_norm(m) for m in ref.modules())
    assert norms == arch.norms, f"{arch.name}: {norms} norm modules, the table says {arch.norms}"
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), _ctx(dname):
        want = ref(ids).logits
        want_tokens = _generate(ref, ids[:1])
    for oname, options in _options(arch).items():
        model = _patched(ref, cls, config, dtype, options)
        ours = sum(isinstance(m, OURS) for m in model.modules())
        fused = _fused(model)
        assert ours == arch.norms, f"{arch.name} {oname}: {ours} of {arch.norms} replaced"
        assert fused == (arch.fused if options else 0), f"{arch.name} {oname}: {fused} fused"
        with torch.no_grad(), _ctx(dname):
            got = model(ids).logits
            tokens = _generate(model, ids[:1])
        err = _rel(got, want)
        exact = options.get("exact_hf", False)
        row = dict(arch=arch.name, dtype=dname, option=oname, replaced=f"{ours}/{norms}",
                   fused=fused, logits=f"{err:.1e}", tokens="same" if torch.equal(tokens,
                   want_tokens) else "differ")
        RESULTS.append(row)
        assert got.dtype == want.dtype
        if exact:
            assert torch.equal(got, want), f"{arch.name} {dname} exact_hf: logits {err:.1e}"
        else:
            assert err <= (1e-5 if dname == "float32" else LOOSE[dname]), row
        if exact or dname == "float32":
            assert torch.equal(tokens, want_tokens), row
        if options and "qk_rope" in options and dname == "float32":
            with torch.no_grad():
                static = _generate(model, ids[:1], cache_implementation="static")
            assert torch.equal(static, want_tokens), row
            row["static cache"] = "same"


@pytest.mark.parametrize("arch", ZOO, ids=[a.name for a in ZOO])
def test_zoo_training_step(arch: Arch):
    """One step's gradients of every parameter, patched with every fusion, against
    unpatched, in float32: within float32 noise of each gradient's scale."""
    ref, cls, config = _reference(arch, torch.float32)
    model = _patched(ref, cls, config, torch.float32, _options(arch).get("fused", {}))
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    worst = 0.0
    for m in (ref, model):
        m.train()
        m(ids, labels=ids).loss.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        if q.grad is None:
            assert p.grad is None, name
            continue
        scale = q.grad.abs().max().item()
        if scale:
            worst = max(worst, (p.grad - q.grad).abs().max().item() / scale)
    RESULTS.append(dict(arch=arch.name, dtype="float32", option="train step",
                        grads=f"{worst:.1e}"))
    assert worst <= 1e-4, f"{arch.name}: gradients differ by {worst:.1e} of their scale"


@pytest.mark.parametrize("arch", ZOO, ids=[a.name for a in ZOO])
def test_zoo_compile_export_onnx(arch: Arch):
    """Patched with every fusion, float32: torch.compile(fullgraph=True) (no graph break)
    and torch.export give the eager logits, and the model exported to ONNX (the dynamo
    exporter, with rmsnorm.torch.onnx's translations) gives them under ONNX Runtime."""
    ref, cls, config = _reference(arch, torch.float32)
    model = _patched(ref, cls, config, torch.float32, _options(arch).get("fused", {}))
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        row = dict(arch=arch.name, dtype="float32", option="compile/export")
        RESULTS.append(row)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(ids, use_cache=False).logits, want, rtol=0, atol=0)
        row["compile"] = "fullgraph"
        exported = torch.export.export(model, (ids,), dict(use_cache=False))
        torch.testing.assert_close(exported.module()(ids, use_cache=False).logits, want,
                                   rtol=1e-6, atol=1e-6)
        row["export"] = "ok"
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    if getattr(model, "_can_set_experts_implementation", lambda: False)():
        # (experts as batched matmuls: transformers' grouped-matmul op has no translation)
        model.set_experts_implementation("batched_mm")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's progress notes and deprecations
        program = torch.onnx.export(_Logits(model), (ids,), dynamo=True, verbose=False)
    session = ort.InferenceSession(program.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: ids.numpy()})[0])
    err = _rel(got, want)
    row["onnx"] = f"{err:.1e}"
    assert err <= 1e-5, f"{arch.name}: ONNX Runtime's logits differ by {err:.1e}"


class _Logits(torch.nn.Module):
    """The model's logits without a cache: what an ONNX graph of it returns."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids, use_cache=False).logits


def test_docs_name_the_zoo():
    """docs/python.md's table of supported models is this file's table."""
    path = os.path.join(HERE, "..", "..", "docs", "python.md")
    text = open(path).read()
    section = text.split("## Supported models", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \|", section, re.M)
    named = [r for r in rows if r not in ("model",) and not set(r) <= set("- ")]
    assert sorted(named) == sorted(a.name for a in ZOO)


@pytest.fixture(scope="module", autouse=True)
def _write_results():
    yield
    if not RESULTS:
        return
    cols = ["arch", "dtype", "option", "replaced", "fused", "logits", "tokens", "static cache",
            "grads", "compile", "export", "onnx"]
    cols = [c for c in cols if any(c in r for r in RESULTS)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in RESULTS]
    out = os.path.join(HERE, "..", "build", "zoo.md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
