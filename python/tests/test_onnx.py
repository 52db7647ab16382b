"""test_onnx.py - ONNX export of the rmsnorm ops (rmsnorm.torch.onnx): each translated op,
in a small module, exported with torch.onnx.export's TorchScript exporter (dynamo=False,
opsets 17 and 20) and its torch.export-based one (dynamo=True, opsets 18 and 23, without
passing a translation table), run under onnxruntime and compared with eager (float32 within
1e-5; float16/bfloat16 within a rounding of the dtype); RMSNormalization in the graph at
opset 23; a dynamic batch dim; the refusals; the registration made on importing torch.onnx (not at import of
rmsnorm.torch); and patched tiny transformers models (Llama; Qwen3 with qk_rope=True)
exported and compared on their logits."""

import io
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import rmsnorm.torch as rt  # noqa: E402
import rmsnorm.torch.onnx as rto  # noqa: E402

ops = torch.ops.rmsnorm
# the rounding of one result to the dtype, relative to the result's scale
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


class Op(torch.nn.Module):
    """fn(*inputs, **kwargs), its tensor arguments held as buffers, the last inputs passed by
    the names in `by_name`; with dtype, the inputs are cast to it (the graph's inputs stay
    float32) and the outputs back to float32."""

    def __init__(self, fn, dtype=None, by_name=(), **kwargs):
        super().__init__()
        self.fn, self.dtype, self.by_name = fn, dtype, by_name
        self.kwargs = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
        self.tensors = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        for k in self.tensors:
            v = kwargs[k]
            self.register_buffer(k, v.to(dtype) if dtype and v.is_floating_point() else v)

    def forward(self, *inputs):
        if self.dtype:
            inputs = [x.to(self.dtype) if x.is_floating_point() else x for x in inputs]
        n = len(inputs) - len(self.by_name)
        named = dict(zip(self.by_name, inputs[n:]))
        out = self.fn(*inputs[:n], **named, **self.kwargs,
                      **{k: getattr(self, k) for k in self.tensors})
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(o.float() for o in outs) if self.dtype else outs


def export(module, inputs, exporter, opset) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation, dynamo's progress notes
        if exporter == "torchscript":
            f = io.BytesIO()
            torch.onnx.export(module, inputs, f, dynamo=False, opset_version=opset)
            return f.getvalue()
        program = torch.onnx.export(module, inputs, dynamo=True, opset_version=opset,
                                    verbose=False)
        return program.model_proto.SerializeToString()


def run(model: bytes, inputs):
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: x.numpy() for n, x in zip(names, inputs)})


def node_types(model: bytes) -> set:
    return {n.op_type for n in onnx.load_from_string(model).graph.node}


def close(got, want, tol):
    got = torch.from_numpy(got).double()
    want = want.double()
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(want.abs().max()))
    err = float((got - want).abs().max())
    assert err <= tol * scale, f"max error {err} > {tol} x {scale}"


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


D = 16
W, B = randn(D, seed=1), randn(D, seed=2)
X = randn(3, 5, D, seed=3)
HEADS = randn(2, 3, 4, D, seed=4)  # (batch, tokens, heads, head_dim)
TABLE = torch.cat([randn(8, 4, seed=5).cos(), randn(8, 4, seed=5).sin()], -1)  # rot 8


def rope_table(n, rot):
    angle = torch.arange(n, dtype=torch.float64)[:, None] * 10000.0 ** (
        -2.0 * torch.arange(rot // 2, dtype=torch.float64) / rot)
    return torch.cat([angle.cos(), angle.sin()], -1).float()


def case(make, inputs, *, fused=False, dynamo=True):
    """A module maker and its inputs; fused: RMSNormalization is expected at opset 23.
    Every case is exported with the TorchScript exporter (opsets 17 and 20); with dynamo,
    with the dynamo exporter too at opset 18, and at 23 when fused (else the same graph)."""
    opsets = ([18] if dynamo else []) + ([23] if fused else [])
    return make, inputs, fused, [("torchscript", 17), ("torchscript", 20)] + [
        ("dynamo", o) for o in opsets]


GATE, RESIDUAL = randn(3, 5, D, seed=8), randn(3, 5, D, seed=7)
POSITIONS = torch.tensor([[5, 0, 7], [1, 1, 2]])
# One case per op through both exporters; the variants of its options (the same builders)
# through TorchScript, and through dynamo where opset 23 takes another path.
CASES = {
    "rms_norm": case(lambda: Op(rt.rms_norm, normalized_shape=(D,), weight=W, eps=1e-6),
                     (X,), fused=True),
    "rms_norm-no-weight-default-eps": case(lambda: Op(rt.rms_norm, normalized_shape=(D,)),
                                           (X,), fused=True, dynamo=False),
    "rms_norm-bias-offset": case(lambda: Op(rt.rms_norm, normalized_shape=(D,), weight=W,
                                            bias=B, offset=True, eps=1e-5),
                                 (X,), fused=True, dynamo=False),
    "rms_norm-eps-outside": case(lambda: Op(rt.rms_norm, normalized_shape=(D,), weight=W,
                                            eps=1e-3, eps_outside=True), (X,), dynamo=False),
    "rms_norm-partial": case(lambda: Op(rt.rms_norm, normalized_shape=(D,), weight=W,
                                        partial=0.3), (X,), dynamo=False),
    "rms_norm-2d-partial": case(lambda: Op(rt.rms_norm, normalized_shape=(5, D),
                                           weight=randn(5, D, seed=6), partial=0.55), (X,)),
    "rms_norm-round-before-weight": case(lambda: Op(rt.rms_norm, normalized_shape=(D,),
                                                    weight=W, round_before_weight=True),
                                         (X,), dynamo=False),
    "rms_norm_with_rstd": case(lambda: Op(rt.rms_norm_with_rstd, normalized_shape=(D,),
                                          weight=W, bias=B), (X,)),
    "layer_norm": case(lambda: Op(rt.layer_norm, normalized_shape=(D,), weight=W, bias=B),
                       (X,), dynamo=False),
    "layer_norm-2d-offset": case(lambda: Op(rt.layer_norm, normalized_shape=(5, D),
                                            weight=randn(5, D, seed=6), offset=True, eps=1e-3),
                                 (X,), dynamo=False),
    "layer_norm_forward": case(lambda: Op(ops.layer_norm_forward, normalized_shape=[D],
                                          weight=W, bias=B), (X,)),
    "fused_add_rms_norm": case(lambda: Op(rt.fused_add_rms_norm, normalized_shape=(D,),
                                          weight=W, bias=B, eps=1e-6), (X, RESIDUAL),
                               fused=True),
    "sandwich_rms_norm": case(lambda: Op(rt.sandwich_rms_norm, normalized_shape=(D,),
                                         post_weight=W, pre_weight=B, eps=1e-6, offset=True),
                              (X, RESIDUAL), fused=True),
    "qk_norm": case(lambda: Op(rt.qk_norm, weight=W, eps=1e-6), (HEADS,), fused=True),
    "qk_norm-partial-bias": case(lambda: Op(rt.qk_norm, weight=W, bias=B, partial=0.5),
                                 (HEADS,), dynamo=False),
    "gated_rms_norm-groups": case(lambda: Op(rt.gated_rms_norm, weight=W, eps=1e-5,
                                             group_size=4), (X, GATE), fused=True),
    "gated_rms_norm-norm-first-sigmoid": case(
        lambda: Op(rt.gated_rms_norm, weight=W, norm_before_gate=True, activation="sigmoid",
                   offset=True), (X, GATE), fused=True, dynamo=False),
    "gated_rms_norm_with_rstd": case(lambda: Op(rt.gated_rms_norm_with_rstd, weight=W,
                                                group_size=8), (X, GATE)),
    "qk_norm_rope": case(lambda: Op(rt.qk_norm_rope, weight=W, cos_sin=rope_table(6, D),
                                    eps=1e-6), (HEADS,), fused=True),
    "qk_norm_rope-gptj-positions-partial-offset": case(
        lambda: Op(rt.qk_norm_rope, by_name=("positions",), weight=W, cos_sin=TABLE,
                   style="gptj", rotary_dim=8, offset=True), (HEADS, POSITIONS), fused=True),
    "qk_norm_rope-neox-positions-no-weight": case(
        lambda: Op(rt.qk_norm_rope, by_name=("positions",), weight=None, cos_sin=TABLE,
                   rotary_dim=8), (HEADS, POSITIONS.flip(0)), fused=True, dynamo=False),
    "qk_norm_rope_with_rstd": case(lambda: Op(rt.qk_norm_rope_with_rstd, weight=W,
                                              cos_sin=rope_table(6, D)), (HEADS,)),
    "qk_norm_rope-across-heads": case(
        lambda: Op(rt.qk_norm_rope_with_rstd, weight=randn(HEADS.shape[-2] * D, seed=9),
                   cos_sin=rope_table(6, D), across_heads=True), (HEADS,)),
}
# float16/bfloat16 data (cast inside the module): the roundings in the graph
HALF_CASES = {
    "rms_norm-bfloat16": case(lambda: Op(rt.rms_norm, torch.bfloat16, normalized_shape=(D,),
                                         weight=W, bias=B, eps=1e-6), (X,), fused=True,
                              dynamo=False),
    "rms_norm-float16-round-before-weight": case(
        lambda: Op(rt.rms_norm, torch.float16, normalized_shape=(D,), weight=W, eps=1e-6,
                   round_before_weight=True), (X,), fused=True, dynamo=False),
    "gated_rms_norm-bfloat16-round-before-weight": case(
        lambda: Op(rt.gated_rms_norm, torch.bfloat16, weight=W, norm_before_gate=True,
                   round_before_weight=True), (X, GATE), fused=True, dynamo=False),
    "gated_rms_norm-float16-groups-round-before-weight": case(
        lambda: Op(rt.gated_rms_norm, torch.float16, weight=W, group_size=4,
                   round_before_weight=True), (X, GATE), fused=True, dynamo=False),
    "layer_norm-bfloat16-round-before-weight": case(
        lambda: Op(rt.layer_norm, torch.bfloat16, normalized_shape=(D,), weight=W, bias=B,
                   round_before_weight=True), (X,), dynamo=False),
    "fused_add_rms_norm-bfloat16": case(
        lambda: Op(rt.fused_add_rms_norm, torch.bfloat16, normalized_shape=(D,), weight=W),
        (X, RESIDUAL), fused=True, dynamo=False),
    "sandwich_rms_norm-float16": case(
        lambda: Op(rt.sandwich_rms_norm, torch.float16, normalized_shape=(D,), post_weight=W,
                   pre_weight=B, offset=True), (X, RESIDUAL), dynamo=False),
    "qk_norm_rope-bfloat16-round-before-rotation": case(  # Gemma 3's roundings
        lambda: Op(rt.qk_norm_rope, torch.bfloat16, weight=W, cos_sin=rope_table(6, D),
                   offset=True, round_before_rotation=True), (HEADS,), dynamo=False),
    "qk_norm_rope-float16-across-heads-float-rotation": case(  # OLMo 2's
        lambda: Op(rt.qk_norm_rope, torch.float16, weight=randn(HEADS.shape[-2] * D, seed=9),
                   cos_sin=rope_table(6, D), across_heads=True, round_before_rotation=True,
                   float_rotation=True), (HEADS,), dynamo=False),
    "qk_norm_rope-bfloat16-round-before-weight": case(
        lambda: Op(rt.qk_norm_rope, torch.bfloat16, weight=W, cos_sin=rope_table(6, D),
                   round_before_weight=True), (HEADS,), fused=True, dynamo=False),
}


def matrix(cases):
    return [pytest.param(c, e, o, id=f"{c}-{e}{o}") for c in cases for e, o in cases[c][3]]


@pytest.mark.parametrize("case,exporter,opset", matrix(CASES))
def test_op_exports_and_matches_eager(case, exporter, opset):
    make, inputs, fused, _ = CASES[case]
    module = make().eval()
    with torch.no_grad():
        want = module(*inputs)
    model = export(module, inputs, exporter, opset)
    got = run(model, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        close(g, w, TOL[torch.float32])
    # ai.onnx's RMSNormalization where the opset has it and it computes the same
    assert ("RMSNormalization" in node_types(model)) == (fused and opset >= 23)


@pytest.mark.parametrize("case,exporter,opset", matrix(HALF_CASES))
def test_half_precision_roundings_match_eager(case, exporter, opset):
    make, inputs, _, _ = HALF_CASES[case]
    module = make().eval()
    with torch.no_grad():
        want = module(*inputs)
    got = run(export(module, inputs, exporter, opset), inputs)
    for g, w in zip(got, want):
        close(g, w, TOL[module.dtype])


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", ["rms_norm-2d-partial", "qk_norm_rope"])
def test_dynamic_batch(case, exporter):
    """Exported with a dynamic first dim, run with another: the shapes the graphs compute
    (the leading dims, the token count that picks the table's rows) follow the input."""
    make, inputs, _, _ = CASES[case]
    module = make().eval()
    names = [f"x{i}" for i in range(len(inputs))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            f = io.BytesIO()
            torch.onnx.export(module, inputs, f, dynamo=False, input_names=names,
                              dynamic_axes={n: {0: "batch"} for n in names})
            model = f.getvalue()
        else:
            batch = torch.export.Dim("batch")
            program = torch.onnx.export(module, inputs, dynamo=True, verbose=False,
                                        dynamic_shapes=(tuple({0: batch} for _ in inputs),))
            model = program.model_proto.SerializeToString()
    other = tuple(x[:1] for x in inputs)  # the table's rows suffice for fewer tokens only
    with torch.no_grad():
        want = module(*other)
    for g, w in zip(run(model, other), want):
        close(g, w, TOL[torch.float32])


def test_translated_ops_are_the_forward_ops():
    assert set(rto.OPS) == {
        "rms_norm", "rms_norm_forward", "layer_norm", "layer_norm_forward",
        "fused_add_rms_norm", "sandwich_rms_norm", "qk_norm", "qk_norm_rope",
        "qk_norm_rope_forward", "gated_rms_norm", "gated_rms_norm_forward"}
    table = rto.translation_table()
    assert set(table) == {getattr(ops, name).default for name in rto.OPS}


def test_translation_table_passed_explicitly():
    make, inputs, _, _ = CASES["fused_add_rms_norm"]
    module = make().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, inputs, dynamo=True, verbose=False,
                                    custom_translation_table=rto.translation_table())
    got = run(program.model_proto.SerializeToString(), inputs)
    with torch.no_grad():
        for g, w in zip(got, module(*inputs)):
            close(g, w, TOL[torch.float32])


def test_refusals():
    module = Op(rt.rms_norm, normalized_shape=(D,), weight=W).eval()
    with pytest.raises(rto.ExportError, match="opset 12 is below 13"):
        export(module, (X,), "torchscript", 12)
    translate = rto.translation_table()[ops.rms_norm.default]
    with pytest.raises(rto.ExportError, match="only inside torch.onnx.export"):
        translate(X, [D])


def test_registered_when_torch_onnx_is_imported():
    """Importing rmsnorm.torch imports neither torch.onnx nor onnxscript; a plain export
    with either exporter, after, finds the translations."""
    code = """if True:
        import io, sys, warnings
        import torch, rmsnorm.torch as rt
        assert "torch.onnx" not in sys.modules and "onnxscript" not in sys.modules
        warnings.simplefilter("ignore")
        m = rt.RMSNorm(8).eval()
        torch.onnx.export(m, (torch.randn(2, 8),), io.BytesIO(), dynamo=False)
        torch.onnx.export(m, (torch.randn(2, 8),), dynamo=True, verbose=False)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


# ---- patched tiny transformers models ---------------------------------------------------------


class Logits(torch.nn.Module):
    """The model's logits for input_ids (an all-ones attention mask: transformers' mask
    helpers then take no data-dependent step)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                          use_cache=False).logits


# model -> the op its patch puts in the graph
PATCHED = {"llama": "rms_norm", "qwen3": "qk_norm_rope"}


@pytest.fixture(scope="module", params=list(PATCHED))
def patched(request):
    """A tiny random model of transformers' code, patched (Qwen3 with qk_rope=True), whose
    exported program holds the op its patch puts there."""
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                  max_position_embeddings=64)
    torch.manual_seed(0)
    if request.param == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
        rt.patch(model)
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
        rt.patch(model, qk_rope=True)
    model = Logits(model.eval()).eval()
    graph = torch.export.export(model, (torch.zeros(1, 3, dtype=torch.int64),)).graph
    assert f"rmsnorm.{PATCHED[request.param]}.default" in {str(n.target) for n in graph.nodes}
    return model


MODEL_EXPORTS = [("torchscript", None), ("dynamo", None), ("dynamo", 23)]


@pytest.mark.parametrize("exporter,opset", MODEL_EXPORTS,
                         ids=[f"{e}{o or ''}" for e, o in MODEL_EXPORTS])
def test_patched_model_exports(patched, exporter, opset):
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = patched(ids)
    got = run(export(patched, (ids,), exporter, opset), (ids,))
    close(got[0], want, TOL[torch.float32])
