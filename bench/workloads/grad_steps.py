"""Step time of a ~25M-parameter model under DDP on synthetic data, for bench/grad_sync.py.
Written against torch's own API (DDP(model)): GRAD_COMPRESSION and GRAD_ACCUMULATION act
on it through the image. One "micro-batch" is a forward and backward pass of --batch
samples followed by optimizer.step(); under GRAD_ACCUMULATION=N only every Nth syncs and
steps.

    python grad_steps.py --warmup 4 --steps 12
prints 'GRADSTEPS rank=R params=P per_batch=S sent_per_batch=B loss0=L loss=L' (S: median
seconds per micro-batch over the timed steps, each timed step N micro-batches; B: bytes this
container's eth0 sent per micro-batch over the timed steps, as the kernel counts them).
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--warmup", type=int, default=4)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--width", type=int, default=4096)
args = p.parse_args()

gpu = torch.cuda.is_available()            # the GPU check (bench/gpu_check.py) runs it on NCCL
device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if gpu else "cpu")
if gpu:
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if gpu else "gloo")
rank = dist.get_rank()
n = int(os.environ.get("GRAD_ACCUMULATION", "1"))
torch.manual_seed(0)
w = args.width
model = torch.nn.Sequential(torch.nn.Linear(w // 2, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                            torch.nn.Linear(w, 10)).to(device)
params = sum(q.numel() for q in model.parameters())
model = DDP(model, device_ids=[device.index] if gpu else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
x = torch.randn(args.batch, w // 2, generator=g).to(device)
y = torch.randint(0, 10, (args.batch,), generator=g).to(device)



def sent() -> int:
    try:
        with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:                         # not in a container with an eth0
        return 0


times, losses, sent_from = [], [], 0
for step in range(args.warmup + args.steps):
    if step == args.warmup:
        sent_from = sent()
    start = time.perf_counter()
    for _ in range(n):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    if gpu:
        torch.cuda.synchronize()
    if step >= args.warmup:
        times.append((time.perf_counter() - start) / n)
    losses.append(loss.item())
sent_per_batch = (sent() - sent_from) // (args.steps * n)
print(f"GRADSTEPS rank={rank} params={params} per_batch={statistics.median(times):.4f} sent_per_batch={sent_per_batch} "
      f"loss0={losses[0]:.4f} loss={losses[-1]:.4f}", flush=True)
dist.barrier()
dist.destroy_process_group()
