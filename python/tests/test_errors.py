"""test_errors.py - bad inputs raise ValueError/TypeError with a message that says
what was wrong, from the Python checks and from the library's status codes."""

import math
from unittest import mock

import numpy as np
import pytest

import rmsnorm

X = np.ones((2, 8), np.float32)


@pytest.mark.parametrize("eps", [math.nan, math.inf, -math.inf, -1e-6])
def test_bad_eps(eps):
    with pytest.raises(ValueError, match=r"eps must be finite and >= 0 \(RMSNORM_ERROR_BAD_EPS\)"):
        rmsnorm.rms_norm(X, 8, eps=eps)
    with pytest.raises(ValueError, match="RMSNORM_ERROR_BAD_EPS"):
        rmsnorm.layer_norm(X, 8, eps=eps)
    with pytest.raises(ValueError, match="RMSNORM_ERROR_BAD_EPS"):
        rmsnorm.rms_norm_backward(X, X, 8, eps=eps)
    # also for an input with no rows
    with pytest.raises(ValueError, match="RMSNORM_ERROR_BAD_EPS"):
        rmsnorm.rms_norm(X[:0], 8, eps=eps)


def test_library_errors_carry_their_status():
    with pytest.raises(rmsnorm.ArgumentError) as info:
        rmsnorm.rms_norm(X, 8, eps=math.nan)
    assert info.value.status == 4 and info.value.name == "RMSNORM_ERROR_BAD_EPS"
    assert isinstance(info.value, rmsnorm.Error) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("partial", [0.0, -0.5, 1.5, math.nan])
def test_bad_partial(partial):
    with pytest.raises(ValueError, match="partial fraction"):
        rmsnorm.rms_norm(X, 8, partial=partial)


def test_wrong_normalized_shape():
    with pytest.raises(ValueError, match=r"expected input with shape \[\*, 4\], but got input of size \[2, 8\]"):
        rmsnorm.rms_norm(X, 4)
    with pytest.raises(ValueError, match="expected input with shape"):
        rmsnorm.layer_norm(X, (2, 8, 1))
    with pytest.raises(ValueError, match="at least 1-dimensional"):
        rmsnorm.rms_norm(X, ())
    with pytest.raises(TypeError, match="normalized_shape must be"):
        rmsnorm.rms_norm(X, None)


def test_wrong_weight_shape():
    with pytest.raises(ValueError, match=r"weight to be of same shape as normalized_shape.*\[4\]"):
        rmsnorm.rms_norm(X, 8, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="bias to be of same shape"):
        rmsnorm.layer_norm(X, 8, None, np.ones((1, 8), np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.complex64, np.bool_, np.uint16])
def test_wrong_dtype(dtype):
    with pytest.raises(TypeError, match=f"input has dtype {np.dtype(dtype)}; rmsnorm takes float32"):
        rmsnorm.rms_norm(X.astype(dtype), 8)
    with pytest.raises(TypeError, match="weight has dtype"):
        rmsnorm.rms_norm(X, 8, np.ones(8, dtype))


def test_backward_argument_checks():
    with pytest.raises(ValueError, match="grad_output has shape"):
        rmsnorm.rms_norm_backward(X[:1], X, 8)
    with pytest.raises(TypeError, match="grad_output has dtype float64"):
        rmsnorm.rms_norm_backward(X.astype(np.float64), X, 8)
    with pytest.raises(TypeError, match="rstd has dtype float64; it must be float32"):
        rmsnorm.rms_norm_backward(X, X, 8, rstd=np.ones((2, 1)))
    with pytest.raises(ValueError, match="one per row"):
        rmsnorm.rms_norm_backward(X, X, 8, rstd=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="both mean and rstd"):
        rmsnorm.layer_norm_backward(X, X, 8, rstd=np.ones(2, np.float32))


# ---- torch ------------------------------------------------------------------------------


@pytest.fixture
def rt():
    pytest.importorskip("torch")
    import rmsnorm.torch as rt

    return rt


def test_torch_cuda_tensor_is_refused(rt):
    import torch

    # A tensor that says it lives on a CUDA device: the check needs no GPU.
    fake = mock.NonCallableMagicMock(spec=torch.Tensor)
    fake.device = torch.device("cuda", 0)
    fake.is_cpu = False
    fake.requires_grad = False
    with pytest.raises(TypeError, match=r"input is on device cuda:0; rmsnorm.torch runs on CPU tensors only"):
        rt.rms_norm(fake, 8)
    with pytest.raises(TypeError, match="on device cuda:0"):
        rt.layer_norm(fake, 8)
    # And a real tensor on another device than the CPU.
    meta = torch.empty(2, 8, device="meta")
    with pytest.raises(TypeError, match="on device meta"):
        rt.rms_norm(meta, 8)
    with pytest.raises(TypeError, match="weight is on device meta"):
        rt.rms_norm(torch.ones(2, 8), 8, torch.ones(8, device="meta"))
    if torch.cuda.is_available():  # a machine with a GPU checks the real thing too
        with pytest.raises(TypeError, match="on device cuda"):
            rt.rms_norm(torch.ones(2, 8, device="cuda"), 8)


def test_torch_bad_inputs(rt):
    import torch

    x = torch.ones(2, 8)
    with pytest.raises(ValueError, match=r"expected input with shape \[\*, 4\]"):
        rt.rms_norm(x, [4])
    with pytest.raises(ValueError, match="weight to be of same shape"):
        rt.rms_norm(x, [8], torch.ones(4))
    with pytest.raises(TypeError, match="input has dtype int64"):
        rt.rms_norm(x.long(), [8])
    with pytest.raises(TypeError, match="input has dtype complex64"):
        rt.layer_norm(torch.ones(2, 8, dtype=torch.complex64), [8])
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        rt.rms_norm(np.ones((2, 8), np.float32), [8])
    with pytest.raises(TypeError, match="dense tensors"):
        rt.rms_norm(x.to_sparse(), [8])
    for eps in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="eps must be finite"):
            rt.rms_norm(x, [8], eps=eps)
        with pytest.raises(ValueError, match="eps must be finite"):
            rt.rms_norm(x.requires_grad_(), [8], eps=eps)
        x = x.detach()
    with pytest.raises(ValueError, match="eps must be finite"):
        rt.RMSNorm(8, eps=math.nan)(x)


def test_torch_patch_refuses_gpu_models(rt):
    import torch

    m = torch.nn.Sequential(torch.nn.RMSNorm(8, device="meta"))
    with pytest.raises(TypeError, match="parameters on meta"):
        rt.patch(m)
