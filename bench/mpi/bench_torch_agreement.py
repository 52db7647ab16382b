"""bench_torch_agreement.py - what the ranks' agreement costs rmsnorm.torch.distributed:
rms_norm's forward and its backward (shards given, fp32, one thread per rank) with the
agreement and without it (the module's _AGREE switch, there for this measurement only: the
sums alone), the two alternated rep by rep in one run, at 1, 8 and 4096 rows of 4096
columns. Each forward and each backward is timed alone after a barrier; per shape the
median over the reps on each rank, and the largest of the ranks' medians is printed by
rank 0.

    .venv/bin/torchrun --nproc-per-node 2 bench/mpi/bench_torch_agreement.py [REPS REPS_4096]
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist

import rmsnorm.torch.distributed as rd


def bench(rows, d, reps, rank, world):
    width = d // world
    lo = rank * width
    g = torch.Generator().manual_seed(1 + rank)
    xs = torch.randn(rows, width, generator=g)
    dys = torch.randn(rows, width, generator=g)
    ws = torch.randn(width, generator=g)
    times = {(agree, step): [] for agree in (True, False) for step in ("forward", "backward")}
    outs = {}
    for r in range(reps + 2):  # two warm-up reps
        for agree in ((True, False) if r % 2 else (False, True)):
            rd._AGREE = agree
            x = xs.detach().requires_grad_()
            w = ws.detach().requires_grad_()
            dist.barrier()
            t0 = time.perf_counter()
            y = rd.rms_norm(x, w, 1e-6, column_offset=lo, d_global=d)
            t1 = time.perf_counter()
            dist.barrier()
            t2 = time.perf_counter()
            y.backward(dys)
            t3 = time.perf_counter()
            if r >= 2:
                times[agree, "forward"].append(t1 - t0)
                times[agree, "backward"].append(t3 - t2)
            outs[agree] = (y.detach(), x.grad, w.grad)
    rd._AGREE = True
    same = all(torch.equal(a, b) for a, b in zip(outs[True], outs[False]))
    med = torch.tensor([statistics.median(times[k]) for k in sorted(times)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    worst = dict(zip(sorted(times), med.tolist()))
    if rank == 0:
        print(f"fp32, {rows} rows x {d} columns over {world} ranks, {reps} reps (medians, "
              f"slowest rank){'' if same else ' RESULTS DIFFER'}:")
        for step in ("forward", "backward"):
            a, b = worst[True, step], worst[False, step]
            print(f"  {step:9s} {a * 1e6:10.1f} us  without agreement {b * 1e6:10.1f} us  "
                  f"difference {(a - b) * 1e6:+8.1f} us ({(a / b - 1) * 100:+.1f}%)")


def main():
    reps_small = int(sys.argv[1]) if len(sys.argv) > 1 else 2001
    reps_large = int(sys.argv[2]) if len(sys.argv) > 2 else 41
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # one thread per rank, as the ranks share the cores
    bench(1, 4096, reps_small, rank, world)
    bench(8, 4096, reps_small, rank, world)
    bench(4096, 4096, reps_large, rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
