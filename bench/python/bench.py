"""bench.py - `python bench/python/bench.py` (`make bench-python`): the installed rmsnorm
package against its peers in one process, fp32 RMSNorm with a weight: rmsnorm.torch
(function, modules, out=) against torch's F.rms_norm and nn.RMSNorm (and transformers'
LlamaRMSNorm when installed), the numpy function (fresh output and out=) against ONNX
Runtime's RMSNormalization through InferenceSession.run, and forward+backward against
torch. Not part of the package: it imports the installed one.

Every case of one shape and thread count is timed interleaved: in each round, each
case runs one timed batch (calls lasting at least --batch-ms, after a warm call);
the table gives each case's median over the rounds. Default malloc, torch's default
allocator, one ORT session per thread count (intra_op_num_threads). Prints Markdown.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

SHAPES = ["1x4096", "16x4096", "8x5120", "512x4096", "4096x4096", "1x1048576"]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ort_session(d: int, eps: float, threads: int):
    """An InferenceSession of one RMSNormalization node (opset 23), y = rmsnorm(x) * w,
    or None without onnxruntime/onnx."""
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    w = numpy_helper.from_array(np.ones(d, np.float32), "w")
    node = helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=-1, epsilon=eps)
    graph = helper.make_graph([node], "rmsnorm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", d])],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def cases(rows: int, d: int, threads: int):
    """[(name, peer name or None, {impl: callable})] for one shape."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    import rmsnorm
    import rmsnorm.torch as rt

    eps = 1e-6
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=g)
    w = (torch.randn(d, generator=g) * 0.1 + 1)
    dy = torch.randn(rows, d, generator=g)
    out = torch.empty_like(x)
    xn, wn = x.numpy(), w.numpy()
    outn = np.empty_like(xn)
    tnorm = torch.nn.RMSNorm(d, eps=eps)
    onorm = rt.RMSNorm(d, eps=eps)
    ollama = rt.LlamaRMSNorm(d, eps=eps)
    for m in (tnorm, onorm, ollama):
        with torch.no_grad():
            m.weight.copy_(w)
        m.requires_grad_(False)
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm as HF
        hf = HF(d, eps=eps)
        with torch.no_grad():
            hf.weight.copy_(w)
        hf.requires_grad_(False)
    except ImportError:
        hf = None
    sess = ort_session(d, eps, threads)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()

    def fwd_bwd(f):
        return lambda: torch.autograd.grad(f(xg, wg), (xg, wg), dy)

    out_cases = [
        ("fwd, function", "F.rms_norm", {
            "peer": lambda: F.rms_norm(x, (d,), w, eps),
            "ours": lambda: rt.rms_norm(x, (d,), w, eps)}),
        ("fwd, module", "nn.RMSNorm", {
            "peer": lambda: tnorm(x), "ours": lambda: onorm(x)}),
    ]
    if hf is not None:
        out_cases.append(("fwd, LlamaRMSNorm", "HF module", {
            "peer": lambda: hf(x), "ours": lambda: ollama(x)}))
    out_cases.append(("fwd, fresh output vs out=", "ours out=", {
        "peer": lambda: rt.rms_norm(x, (d,), w, eps, out=out),
        "ours": lambda: rt.rms_norm(x, (d,), w, eps)}))
    if sess is not None:
        out_cases.append(("numpy fwd", "ORT run", {
            "peer": lambda: sess.run(None, {"x": xn}),
            "ours": lambda: rmsnorm.rms_norm(xn, d, wn, eps)}))
    out_cases.append(("numpy fwd, fresh output vs out=", "numpy out=", {
        "peer": lambda: rmsnorm.rms_norm(xn, d, wn, eps, out=outn),
        "ours": lambda: rmsnorm.rms_norm(xn, d, wn, eps)}))
    out_cases.append(("fwd+bwd", "F.rms_norm", {
        "peer": fwd_bwd(lambda a, b: F.rms_norm(a, (d,), b, eps)),
        "ours": fwd_bwd(lambda a, b: rt.rms_norm(a, (d,), b, eps))}))
    return out_cases


def batch(fn, target_s: float) -> int:
    fn()  # warm
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    return max(1, int(target_s / one))


def run_shape(rows: int, d: int, threads: int, rounds: int, batch_s: float):
    import torch

    flat = []
    for name, peer, impls in cases(rows, d, threads):
        for who, fn in impls.items():
            flat.append((name, peer, who, fn))
    def grad_mode(name):  # forward cases without autograd, as inference runs
        return torch.enable_grad() if "bwd" in name else torch.no_grad()

    inner = []
    for name, _, _, fn in flat:
        with grad_mode(name):
            inner.append(batch(fn, batch_s))
    samples = [[] for _ in flat]
    for _ in range(rounds):
        for i, (name, _, _, fn) in enumerate(flat):
            with grad_mode(name):
                t0 = time.perf_counter()
                for _ in range(inner[i]):
                    fn()
                samples[i].append((time.perf_counter() - t0) / inner[i])
    med = {(n, who): statistics.median(s) for (n, _, who, _), s in zip(flat, samples)}
    seen = []
    for name, peer, _, _ in flat:
        if name not in seen:
            seen.append(name)
            yield name, peer, med[(name, "peer")], med[(name, "ours")]


def llama(threads: int, rounds: int) -> None:
    """A patched random-init transformers Llama (hidden 512, 4 layers, 9 norms):
    forward of a 32-token prompt and of a single token (no KV cache), eager against
    torch.compile(fullgraph=True) (the compile itself is not timed)."""
    import torch
    import transformers

    import rmsnorm.torch as rt

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1408,
                                   num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=4, max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).eval()
    rt.patch(model)
    compiled = torch.compile(model, fullgraph=True)
    prompt = torch.randint(0, 1000, (1, 32))
    torch.set_num_threads(threads)

    def step(m, ids):
        return lambda: m(input_ids=ids, use_cache=False).logits

    with torch.no_grad():
        fns = {"eager": step(model, prompt), "compiled": step(compiled, prompt),
               "eager, 1 token": step(model, prompt[:, :1]),
               "compiled, 1 token": step(compiled, prompt[:, :1])}
        for fn in fns.values():
            fn()
            fn()
        inner = {k: batch(f, 0.05) for k, f in fns.items()}
        samples = {k: [] for k in fns}
        for _ in range(rounds):
            for k, f in fns.items():
                t0 = time.perf_counter()
                for _ in range(inner[k]):
                    f()
                samples[k].append((time.perf_counter() - t0) / inner[k])
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"| Llama 512x4, 32 tokens | {threads} | {fmt(med['eager'])} | "
          f"{fmt(med['compiled'])} | {med['compiled'] / med['eager']:.2f} |")
    print(f"| Llama 512x4, 1 token | {threads} | {fmt(med['eager, 1 token'])} | "
          f"{fmt(med['compiled, 1 token'])} | "
          f"{med['compiled, 1 token'] / med['eager, 1 token']:.2f} |", flush=True)


def fmt(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/python/bench.py", description=__doc__)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated ROWSxD")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds (median)")
    ap.add_argument("--batch-ms", type=float, default=20.0, help="least time of one batch")
    ap.add_argument("--quick", action="store_true", help="--rounds 5 --batch-ms 5")
    ap.add_argument("--llama", action="store_true",
                    help="also a patched transformers Llama, eager against torch.compile")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.batch_ms = 5, 5.0

    import torch

    import rmsnorm

    try:
        import onnxruntime
        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "not installed"
    print(f"rmsnorm {rmsnorm.__version__} (kernels {rmsnorm.isa()}), torch {torch.__version__} "
          f"(cpu capability {torch.backends.cpu.get_cpu_capability()}), onnxruntime "
          f"{ort_version}, float32, {_cpu_name()}, {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}")
    print(f"medians of {args.rounds} interleaved rounds, batches of >= {args.batch_ms:g} ms; "
          "ours/peer < 1: rmsnorm is faster (for the out= rows: what a fresh output costs)\n")
    print("| shape | threads | case | peer | peer time | rmsnorm | ours/peer |")
    print("|---|---:|---|---|---:|---:|---:|")
    before = torch.get_num_threads()
    try:
        for shape in args.shapes.split(","):
            rows, d = (int(v) for v in shape.lower().split("x"))
            for n in (int(t) for t in args.threads.split(",")):
                torch.set_num_threads(n)
                rmsnorm.set_num_threads(n)
                for name, peer, tp, to in run_shape(rows, d, n, args.rounds,
                                                    args.batch_ms / 1e3):
                    print(f"| {rows}x{d} | {n} | {name} | {peer} | {fmt(tp)} | {fmt(to)} | "
                          f"{to / tp:.2f} |", flush=True)
        if args.llama:
            print("\n| model | threads | eager | compiled | compiled/eager |")
            print("|---|---:|---:|---:|---:|")
            for n in (int(t) for t in args.threads.split(",")):
                llama(n, args.rounds)
    finally:
        torch.set_num_threads(before)
        rmsnorm.set_num_threads(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
