"""test_modules.py - the drop-in modules (RMSNorm, LayerNorm, LlamaRMSNorm, GemmaRMSNorm) as
torch's module machinery uses them: parametrizations (weight norm, a spectral-norm-style
one), torch.func.functional_call, construction on the meta device then to_empty, and
TorchScript; each against the same module of torch or transformers' formula."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

import rmsnorm.torch as rt

D = 8
# TorchScript is deprecated in torch >= 2.9 but still what some deployments use
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:FutureWarning")


def reference(m, x, weight):
    """What module m computes for x with the given weight (torch's own ops)."""
    if isinstance(m, rt.LayerNorm):
        return F.layer_norm(x, m.normalized_shape, weight, m.bias, m.eps)
    if isinstance(m, rt.RMSNorm):
        return F.rms_norm(x, m.normalized_shape, weight, m.eps)
    if isinstance(m, rt.GemmaRMSNorm):
        return F.rms_norm(x, [D], 1 + weight, m.eps)
    return weight * F.rms_norm(x, [D], None, m.variance_epsilon)


def modules():
    return [rt.RMSNorm(D, eps=1e-6), rt.LayerNorm(D), rt.LlamaRMSNorm(D), rt.GemmaRMSNorm(D)]


class Doubled(nn.Module):
    def forward(self, w):
        return 2 * w + 0.5


class UnitNorm(nn.Module):
    """Spectral-norm style: the weight divided by its norm (a vector's only singular value)."""

    def forward(self, w):
        return w / w.norm()


@pytest.mark.parametrize("param", [Doubled, UnitNorm], ids=["affine", "unit_norm"])
@pytest.mark.parametrize("m", modules(), ids=lambda m: type(m).__name__)
def test_parametrized_weight(m, param):
    with torch.no_grad():
        m.weight.copy_(torch.linspace(-1, 2, D))
    parametrize.register_parametrization(m, "weight", param())
    x = torch.randn(3, D, dtype=torch.float64).float()
    y = m(x)
    torch.testing.assert_close(y, reference(m, x, m.weight))
    y.square().sum().backward()
    original = m.parametrizations.weight.original
    assert original.grad is not None and original.grad.abs().sum() > 0


@pytest.mark.parametrize("m", modules(), ids=lambda m: type(m).__name__)
def test_weight_norm(m):
    with torch.no_grad():
        m.weight.copy_(torch.linspace(0.5, 2, D))
    m = nn.utils.parametrizations.weight_norm(m, dim=None)
    x = torch.randn(3, D)
    torch.testing.assert_close(m(x), reference(m, x, m.weight))


@pytest.mark.parametrize("m", modules(), ids=lambda m: type(m).__name__)
def test_functional_call(m):
    x = torch.randn(3, D)
    w = torch.linspace(-1, 1, D)
    y = torch.func.functional_call(m, {"weight": w}, (x,))
    torch.testing.assert_close(y, reference(m, x, w))


@pytest.mark.parametrize("cls", [rt.RMSNorm, rt.LayerNorm, rt.LlamaRMSNorm, rt.GemmaRMSNorm])
def test_meta_device_then_to_empty(cls):
    with torch.device("meta"):
        m = cls(D)
    assert m.weight.is_meta
    m.to_empty(device="cpu")
    m.reset_parameters()
    x = torch.randn(3, D)
    torch.testing.assert_close(m(x), cls(D)(x))


@pytest.mark.parametrize("m", modules() + [rt.RMSNorm(D, bias=True), rt.RMSNorm(D, eps=None),
                                           rt.RMSNorm(D, elementwise_affine=False),
                                           rt.LlamaRMSNorm(D, exact_hf=True)],
                         ids=lambda m: repr(m))
def test_torchscript(m):
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.linspace(-1, 2, p.numel()))
    scripted = torch.jit.script(m)
    x = torch.randn(3, D)
    torch.testing.assert_close(scripted(x), m(x), rtol=0, atol=0)
    assert set(scripted.state_dict()) == set(m.state_dict())


def test_torchscript_with_another_weight_dtype():
    m = rt.LlamaRMSNorm(D).to(torch.bfloat16)
    scripted = torch.jit.script(m)
    x = torch.randn(3, D)
    torch.testing.assert_close(scripted(x), m(x), rtol=0, atol=0)
