"""Allreduce sweep through one stack; prints `SIZE bytes seconds` (median over iterations),
then `CHECK ok` (or `CHECK FAILED`) after one allreduce whose sum is known.

    --stack hvd | torch | mpi4py     --tensors K: split each size into K tensors (fusion)
    --device cpu | cuda              cuda: tensors on this rank's GPU, torch.distributed on NCCL
"""
import argparse
import os
import statistics
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--stack", required=True, choices=["hvd", "torch", "mpi4py"])
parser.add_argument("--sizes", required=True, help="comma-separated byte counts")
parser.add_argument("--tensors", type=int, default=1)
parser.add_argument("--min-iters", type=int, default=5)
parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
args = parser.parse_args()
sizes = [int(s) for s in args.sizes.split(",")]
if args.device == "cuda" and args.stack == "mpi4py":
    parser.error("--device cuda: only --stack hvd or torch")

done = (lambda: None)            # after each allreduce: on a GPU, wait for the device (NCCL is asynchronous)

if args.stack in ("hvd", "torch"):
    import torch

    def make_one(count: int, value: float):
        return torch.full((count,), value, dtype=torch.float32, device=device)

    if args.device == "cuda":
        done = torch.cuda.synchronize

if args.stack == "hvd":
    import horovod.torch as hvd
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    device = torch.device("cuda", hvd.local_rank()) if args.device == "cuda" else torch.device("cpu")

    def allreduce(tensors):
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"t{i}") for i, t in enumerate(tensors)]
        for h in handles:
            hvd.synchronize(h)
        done()
elif args.stack == "torch":
    import torch.distributed as dist
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def allreduce(tensors):
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        done()
else:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()

    def allreduce(tensors):
        for t in tensors:
            comm.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)

    def make_one(count: int, value: float):
        return np.full(count, value, dtype=np.float32)


def equals(t, value: float) -> bool:
    return bool((t == value).all())


def make(n: int, value: float = 1.0):
    return [make_one(n // 4 // args.tensors, value) for _ in range(args.tensors)]


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
    del tensors

# Rank r contributes r+1: the sum is world*(world+1)/2 on every rank, in every tensor.
check = make(1 << 12, float(rank + 1))
allreduce(check)
expected = world * (world + 1) / 2
ok = all(equals(t, expected) for t in check)
print(f"CHECK {'ok' if ok else 'FAILED'} rank={rank} world={world} device={args.device} expected={expected:g}",
      flush=True)
if args.stack == "hvd":
    hvd.shutdown()
elif args.stack == "torch":
    dist.destroy_process_group()
