"""test_distributed.py - rmsnorm.torch.distributed over torch.distributed (gloo on
localhost): two processes (dist_worker.py) started once for the module run every check
(forward and gradients against the unsharded rmsnorm.torch and a float64 oracle, cuts on
and off the 1024-column blocks, a width-0 shard, pRMSNorm, gradcheck in float64, errors
on every rank when the ranks disagree, whatever each rank's check setting, and no error
for equal arguments written differently); each test reports one check. A hung group is
killed after TIMEOUT seconds (the workers' own collectives time out after 60), so nothing
waits forever. Plus the import paths and the argument errors of one process."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import rmsnorm.torch as rt  # noqa: E402
import rmsnorm.torch.distributed as rd  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")
TIMEOUT = 300  # seconds for the whole group (about 15 on an idle 2-core machine)
WORLD = 2
CHECKS = ["aligned_bitwise", "off_block", "float64", "uneven_cuts", "param_dtype", "width_zero",
          "partial", "leading_dims_and_strides", "gradcheck", "backward_check",
          "disagreement_errors", "equal_arguments_agree", "row_counts", "always_on_agreement"]
# and on three ranks (sums of three partials; a width-0 shard in the middle)
CHECKS3 = ["uneven_cuts", "width_zero", "gradcheck", "disagreement_errors",
           "equal_arguments_agree", "always_on_agreement"]

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")


def run_group(tmp, world, only=""):
    """Starts `world` ranks, waits for them (killing them after TIMEOUT); returns each
    rank's {check: result} and the ranks' output."""
    env = dict(os.environ, RMSNORM_DISTRIBUTED_CHECK="1", OMP_NUM_THREADS="1")
    init = f"file://{tmp}/rendezvous"
    logs = [open(os.path.join(tmp, f"rank{r}.log"), "w+") for r in range(world)]
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(world), init, str(tmp), only],
                              stdout=logs[r], stderr=subprocess.STDOUT, env=env)
             for r in range(world)]
    hung = False
    for p in procs:
        try:
            p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            hung = True
            for q in procs:
                q.kill()
            for q in procs:
                q.wait()
            break
    results, output = [], []
    for r in range(world):
        path = os.path.join(tmp, f"rank{r}.json")
        results.append(json.load(open(path)) if os.path.exists(path) else {})
        logs[r].seek(0)
        output.append(logs[r].read()[-3000:])
        logs[r].close()
    return results, output, hung, [p.returncode for p in procs]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    return run_group(tmp_path_factory.mktemp("dist"), WORLD)


@pytest.fixture(scope="module")
def group3(tmp_path_factory):
    return run_group(tmp_path_factory.mktemp("dist3"), 3, ",".join(CHECKS3))


def report(results, output, hung, codes, check):
    for rank, res in enumerate(results):
        if check not in res:
            pytest.fail(f"rank {rank} did not finish check {check!r} (hung: {hung}, exit codes "
                        f"{codes}); its output:\n{output[rank]}")
        assert res[check] == "ok", f"rank {rank}, check {check}:\n{res[check]}"


@pytest.mark.parametrize("check", CHECKS)
def test_two_ranks(group, check):
    report(*group, check)


@pytest.mark.parametrize("check", CHECKS3)
def test_three_ranks(group3, check):
    report(*group3, check)


def test_every_check_is_run():
    src = open(WORKER).read()
    names = [line[len("def check_"):].split("(")[0] for line in src.splitlines()
             if line.startswith("def check_")]
    assert sorted(names) == sorted(CHECKS)


# ---- one process ---------------------------------------------------------------------------


def test_import_paths():
    import rmsnorm

    assert rmsnorm.torch is rt and rt.distributed is rd
    assert callable(rt.rms_norm) and callable(rd.rms_norm)
    from rmsnorm.torch import RMSNorm, patch  # noqa: F401  (the module's names, as before)


def test_ops_compose_to_the_unsharded_result():
    # the four ops with the sum over the shards taken by hand: the unsharded bits (cut 1024)
    ops = torch.ops.rmsnorm
    g = torch.Generator().manual_seed(5)
    x, dy = torch.randn(2, 7, 2048, generator=g), torch.randn(2, 7, 2048, generator=g)
    w = torch.randn(2048, generator=g)
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()
    y = rt.rms_norm(xr, 2048, wr, 1e-6)
    y.backward(dy)
    cuts = [(0, 1024), (1024, 2048)]
    s = sum(ops.rms_norm_shard_stats(x[..., lo:hi], 2048, lo) for lo, hi in cuts)
    assert s.dtype == torch.float64 and s.shape == (2, 7)
    t = sum(ops.rms_norm_shard_backward_dots(dy[..., lo:hi], x[..., lo:hi], s, 2048, lo,
                                             w[lo:hi], 1e-6) for lo, hi in cuts)
    for lo, hi in cuts:
        ys = ops.rms_norm_shard_forward(x[..., lo:hi], s, 2048, lo, w[lo:hi], 1e-6)
        assert torch.equal(ys, y[..., lo:hi].detach())
        dx, dw, db = ops.rms_norm_shard_backward(dy[..., lo:hi], x[..., lo:hi], s, t, 2048, lo,
                                                 w[lo:hi], 1e-6, [True, True, False])
        assert db is None
        assert torch.equal(dx, xr.grad[..., lo:hi]) and torch.equal(dw, wr.grad[lo:hi])


def test_op_argument_errors():
    ops = torch.ops.rmsnorm
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"rms_norm_shard_stats: the shard's columns \[4, 12\) "
                       "are not inside a row of d_global = 10"):
        ops.rms_norm_shard_stats(x, 10, 4)
    s = ops.rms_norm_shard_stats(x, 8, 0)
    with pytest.raises(TypeError, match="stats has dtype float32; per-row sums are float64"):
        ops.rms_norm_shard_forward(x, s.float(), 8, 0)
    with pytest.raises(ValueError, match="stats has 2 values"):
        ops.rms_norm_shard_forward(x, s[:2], 8, 0)
    with pytest.raises(ValueError, match="rmsnorm_shard_forward"):
        ops.rms_norm_shard_forward(x, -s, 8, 0)  # not a sum of squares
    with pytest.raises(ValueError, match="Expected weight to be of same shape"):
        ops.rms_norm_shard_forward(x, s, 8, 0, torch.ones(7))


def test_needs_an_initialized_group():
    assert not dist.is_initialized()
    with pytest.raises((RuntimeError, ValueError)):
        rd.rms_norm(torch.randn(2, 4))
