"""bench_torch_distributed.py - times rmsnorm.torch.distributed.rms_norm (forward +
backward of this rank's column shard, the sums of rows float64 with the ranks' agreement)
against the unsharded rmsnorm.torch.rms_norm of the whole rows on one rank, and against
what engines do today (all_gather the shards, then the unsharded norm of the whole rows;
the backward's all_gather of dy included). Each round runs every variant once, interleaved; the medians
and the fastest rounds are printed by rank 0.

    .venv/bin/torchrun --nproc-per-node 2 bench/mpi/bench_torch_distributed.py [ROWS D ROUNDS]
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist

import rmsnorm.torch as rt
import rmsnorm.torch.distributed as rd


def main():
    rows, d, rounds = (int(a) for a in (sys.argv[1:4] if len(sys.argv) > 3 else (4096, 8192, 11)))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # one thread per rank, as the ranks share the cores
    width = d // world
    lo = rank * width
    g = torch.Generator().manual_seed(1)
    x_full = torch.randn(rows, d, generator=g)
    dy_full = torch.randn(rows, d, generator=g)
    w_full = torch.randn(d, generator=g)
    xs, dys = x_full[:, lo:lo + width].contiguous(), dy_full[:, lo:lo + width].contiguous()
    ws = w_full[lo:lo + width].clone()

    def sharded():
        x = xs.detach().requires_grad_()
        w = ws.detach().requires_grad_()
        rd.rms_norm(x, w, column_offset=lo, d_global=d, check=False).backward(dys)

    def gathered():
        parts = [torch.empty_like(xs) for _ in range(world)]
        dist.all_gather(parts, xs)
        x = torch.cat(parts, -1).requires_grad_()
        w = w_full.detach().requires_grad_()
        y = rt.rms_norm(x, d, w)
        dist.all_gather(parts, dys)
        y.backward(torch.cat(parts, -1))

    def unsharded():
        x = x_full.detach().requires_grad_()
        w = w_full.detach().requires_grad_()
        rt.rms_norm(x, d, w).backward(dy_full)

    variants = {"distributed (shard)": sharded, "all_gather + unsharded": gathered,
                "unsharded, one rank": unsharded}
    times = {k: [] for k in variants}
    for _ in range(rounds + 1):  # the first round warms up
        for name, fn in variants.items():
            dist.barrier()
            t = time.perf_counter()
            fn()
            dist.barrier()
            times[name].append(time.perf_counter() - t)
    if rank == 0:
        print(f"{world} ranks, fp32 {rows} x {d} (shards of {width} columns), forward + backward, "
              f"{rounds} rounds, one thread per rank")
        for name, ts in times.items():
            ts = ts[1:]
            print(f"  {name:24s} median {statistics.median(ts) * 1e3:8.1f} ms   "
                  f"fastest {min(ts) * 1e3:8.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
