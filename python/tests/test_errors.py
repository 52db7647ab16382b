"""test_errors.py - bad inputs raise ValueError/TypeError with a message that says
what was wrong, from the Python checks and from the library's status codes."""

import math
import os
import subprocess
import sys

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


# A static quantization scale that float32 cannot hold is refused before it is narrowed,
# with a message that names it: (value, message).
BAD_SCALES = [
    (1e-50, r"scale 1e-50 would round to 0 in float32, whose smallest positive value is 1e-45 "),
    (2.0**-150, r"scale 7\.006492321624085e-46 would round to 0 in float32"),  # a tie: to 0
    (1e50, r"scale 1e\+50 would overflow float32, whose largest value is 3\.4028235e\+38 "),
    (3.4028235677973366e38, r"scale 3\.4028235677973366e\+38 would overflow"),  # a tie: to inf
    (-1.0, r"scale must be a finite number > 0, got -1 "),
    (0.0, r"scale must be a finite number > 0, got 0 "),
    (-0.0, r"scale must be a finite number > 0, got -0 "),
    (math.nan, r"scale must be a finite number > 0, got nan "),
    (math.inf, r"scale must be a finite number > 0, got inf "),
    (-math.inf, r"scale must be a finite number > 0, got -inf "),
]
# The extremes float32 holds are taken, rounded to float32 as numpy rounds them.
GOOD_SCALES = [1e-45, 7.006492321624087e-46, 1e-40, 1.1754943508222875e-38,
               3.4028234663852886e38, 3.4028235677973362e38]


@pytest.mark.parametrize("scale, message", BAD_SCALES, ids=[repr(v) for v, _ in BAD_SCALES])
def test_bad_static_scale(scale, message):
    for fn in (rmsnorm.rms_norm_int8, rmsnorm.rms_norm_fp8):
        for x, d in ((X, 8), (X[:, :0], 0)):  # also with nothing to quantize
            with pytest.raises(rmsnorm.ArgumentError, match=message) as info:
                fn(x, d, scale=scale)
            assert info.value.name == "RMSNORM_ERROR_BAD_ARGUMENT"
            assert "dweight" not in str(info.value)


@pytest.mark.parametrize("scale", GOOD_SCALES)
def test_extreme_static_scale(scale):
    q, s = rmsnorm.rms_norm_int8(X, 8, scale=scale)
    assert s.dtype == np.float32 and float(s) == float(np.float32(scale)) and float(s) > 0


# A normalized_shape list whose items' __index__ changes the list while it is read: the
# call reads the shape the list had when it began and the interpreter lives on. Run in a
# child process: reading items through a pointer into the list's storage would crash it
# (an emptied list) or read the objects made since in freed memory (a wrong shape).
_CHANGING_SHAPE = """
import sys
import numpy as np
front, how, container = sys.argv[1:]
if front == "numpy":
    import rmsnorm as api
    x = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4)
else:
    import torch
    import rmsnorm.torch as api
    x = torch.arange(1, 25, dtype=torch.float32).reshape(2, 3, 4)


class Shape(list):
    pass


class Dim:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        if how == "clear":  # frees the other items: the list held their only reference
            shape.clear()
        else:  # moves the list's item array
            shape.extend(Dim(1) for _ in range(10000))
        # new objects of the sizes just freed, kept: a stale read finds one of them
        kept.extend([Dim(5), Dim(5)] for _ in range(1000))
        return self.v


kept = []
shape = (Shape if container == "subclass" else list)([Dim(3), Dim(4)])
y = api.rms_norm(x, shape)
want = api.rms_norm(x, (3, 4))
assert (y == want).all() and tuple(y.shape) == (2, 3, 4)
del y, want, shape, kept
import gc
gc.collect()
print("same result")
"""


@pytest.mark.parametrize("front", ["numpy", "torch"])
@pytest.mark.parametrize("how", ["clear", "grow"])
@pytest.mark.parametrize("container", ["list", "subclass"])
def test_normalized_shape_changed_by_index(front, how, container):
    if front == "torch":
        pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", _CHANGING_SHAPE, front, how, container], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "same result", (r.returncode, r.stderr[-2000:])


# ---- torch ------------------------------------------------------------------------------


@pytest.fixture
def rt():
    pytest.importorskip("torch")
    import rmsnorm.torch as rt

    return rt


def _cuda_like(torch, shape):
    """A tensor whose dispatch keys are CUDA's, made without a GPU: a wrapper
    subclass on device cuda:0 that passes every op on to the dispatcher below
    the Python key, so it reaches the kernels registered for CUDA."""

    class CudaLike(torch.Tensor):
        @staticmethod
        def __new__(cls):
            return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32,
                                                       device=torch.device("cuda", 0))

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            with torch._C._ExcludeDispatchKeyGuard(
                    torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
                return func(*args, **(kwargs or {}))

    return CudaLike()


def test_torch_cuda_tensor_is_refused(rt):
    import torch

    fake = _cuda_like(torch, (2, 8))
    assert fake.device.type == "cuda" and fake.is_cuda
    for fn, name in [(lambda: rt.rms_norm(fake, 8), "rms_norm"),
                     (lambda: rt.layer_norm(fake, 8), "layer_norm"),
                     (lambda: rt.qk_norm(fake.view(2, 2, 4)), "qk_norm"),
                     (lambda: rt.rms_norm_int8(fake, 8), "rms_norm_int8")]:
        with pytest.raises(TypeError, match=rf"rmsnorm::{name}: input is on device cuda:0; "
                                            "rmsnorm runs on CPU tensors only"):
            fn()
    # a CUDA weight with a CPU input reaches the same kernels
    with pytest.raises(TypeError, match="rmsnorm::rms_norm: weight is on device cuda:0"):
        torch.ops.rmsnorm.rms_norm(torch.ones(2, 8), [8], _cuda_like(torch, (8,)))
    if torch.cuda.is_available():  # a machine with a GPU checks the real thing too
        with pytest.raises(TypeError, match="on device cuda"):
            rt.rms_norm(torch.ones(2, 8, device="cuda"), 8)


def test_torch_other_layouts_and_dtypes_name_the_op(rt):
    import torch

    x = torch.ones(2, 8)
    cases = [
        (x.to_sparse(), r"input has layout torch.sparse_coo; rmsnorm takes dense \(strided\)"),
        (x.to_sparse_csr(), "input has layout torch.sparse_csr"),
        (torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), "input is a quantized tensor"),
        (x.to(torch.complex64), "input has dtype complex64; rmsnorm takes float32"),
        (x.long(), "input has dtype int64"),
    ]
    for t, msg in cases:
        with pytest.raises(TypeError, match="rmsnorm::rms_norm: " + msg):
            rt.rms_norm(t, 8)
        with pytest.raises(TypeError, match="rmsnorm::layer_norm: " + msg):
            torch.ops.rmsnorm.layer_norm(t, [8])
    with pytest.raises(TypeError, match="rmsnorm::fused_add_rms_norm: residual has layout"):
        rt.fused_add_rms_norm(x, x.to_sparse(), 8)


def test_torch_nothing_written_on_error(rt):
    import torch

    x = torch.randn(3, 8)
    for bad in [dict(eps=float("nan")), dict(weight=torch.ones(4)), dict(partial=0.0)]:
        out = torch.full((3, 8), 7.0)
        kw = dict(eps=bad.get("eps", 1e-6), partial=bad.get("partial", 1.0))
        with pytest.raises((ValueError, TypeError)):
            rt.rms_norm(x, 8, bad.get("weight"), out=out, **kw)
        assert torch.equal(out, torch.full((3, 8), 7.0))
    h, u = torch.randn(3, 8), torch.randn(3, 8)
    h0, u0 = h.clone(), u.clone()
    with pytest.raises(ValueError, match="RMSNORM_ERROR_BAD_EPS"):
        rt.fused_add_rms_norm(u, h, 8, eps=-1.0, inplace=True)
    assert torch.equal(h, h0) and torch.equal(u, u0)
    # an out= that cannot be written in place is refused, not copied
    out = torch.zeros(8, 3).t()
    with pytest.raises(ValueError, match="out must hold the normalized dims contiguously"):
        rt.rms_norm(x, 8, out=out)
    assert not out.any()


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
    with pytest.raises(TypeError, match=r"dense \(strided\) tensors"):
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

    class OnGpu(torch.nn.RMSNorm):  # what patch() sees of a module moved to a GPU
        def parameters(self, recurse=True):
            yield _cuda_like(torch, (8,))

    m = torch.nn.Sequential(OnGpu(8))
    with pytest.raises(TypeError, match="parameters on cuda:0"):
        rt.patch(m)
    meta = torch.nn.Sequential(torch.nn.RMSNorm(8, device="meta"))  # patched, then materialized
    assert isinstance(rt.patch(meta)[0], rt.RMSNorm)


@pytest.mark.parametrize("scale, message", BAD_SCALES, ids=[repr(v) for v, _ in BAD_SCALES])
def test_torch_bad_static_scale(rt, scale, message):
    import torch

    x = torch.ones(2, 8)
    for fn in (rt.rms_norm_int8, rt.rms_norm_fp8):
        for t, d in ((x, 8), (x[:, :0], 0)):
            with pytest.raises(ValueError, match=message) as info:
                fn(t, d, scale=scale)
            assert "dweight" not in str(info.value)
    with pytest.raises(ValueError, match=message):
        torch.ops.rmsnorm.rms_norm_int8(x, [8], scale=scale)


@pytest.mark.parametrize("scale", GOOD_SCALES)
def test_torch_extreme_static_scale(rt, scale):
    import torch

    q, s = rt.rms_norm_int8(torch.ones(2, 8), 8, scale=scale)
    assert s.dtype == torch.float32 and float(s) == float(np.float32(scale)) and float(s) > 0
