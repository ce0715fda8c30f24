"""Allreduce sweep through one stack; prints `SIZE bytes seconds` (median over iterations).

    --stack hvd | torch | mpi4py     --tensors K: split each size into K tensors (fusion)
"""
import argparse
import statistics
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--stack", required=True, choices=["hvd", "torch", "mpi4py"])
parser.add_argument("--sizes", required=True, help="comma-separated byte counts")
parser.add_argument("--tensors", type=int, default=1)
parser.add_argument("--min-iters", type=int, default=5)
args = parser.parse_args()
sizes = [int(s) for s in args.sizes.split(",")]

if args.stack == "hvd":
    import horovod.torch as hvd
    import torch
    hvd.init()
    rank = hvd.rank()

    def allreduce(tensors):
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"t{i}") for i, t in enumerate(tensors)]
        for h in handles:
            hvd.synchronize(h)

    def make(n):
        return [torch.ones(n // 4 // args.tensors, dtype=torch.float32) for _ in range(args.tensors)]
elif args.stack == "torch":
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def allreduce(tensors):
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()

    def make(n):
        return [torch.ones(n // 4 // args.tensors, dtype=torch.float32) for _ in range(args.tensors)]
else:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def allreduce(tensors):
        for t in tensors:
            comm.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)

    def make(n):
        return [np.ones(n // 4 // args.tensors, dtype=np.float32) for _ in range(args.tensors)]

for size in sizes:
    tensors = make(size)
    allreduce(tensors)                                  # warm-up
    # The same count on every rank (collectives must pair up): fewer for large sizes.
    iters = max(args.min_iters, 5 if size >= 16 << 20 else 10 if size >= 1 << 20 else 20)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        allreduce(tensors)
        times.append(time.perf_counter() - start)
    if rank == 0:
        print(f"SIZE {size} {statistics.median(times):.9f} iters={iters}", flush=True)
if args.stack == "hvd":
    hvd.shutdown()
elif args.stack == "torch":
    dist.destroy_process_group()
