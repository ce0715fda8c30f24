"""A worker for torch's elastic agent alone (no entrypoint): gloo over env://, an
all-reduce per step, the step it reached saved by rank 0 to `--state` after every step, a
new round resuming from it. Rank 0 prints `ROUND world=W from=S` at each start and
`STEP s world=W` after each step; `--steps` in all."""

import argparse
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--delay", type=float, default=0.05)
p.add_argument("--state", required=True)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
start = int(open(args.state).read()) if os.path.exists(args.state) else 0
if rank == 0:
    print(f"ROUND world={world} from={start}", flush=True)
for step in range(start + 1, args.steps + 1):
    total = torch.ones(1)
    dist.all_reduce(total)
    assert int(total.item()) == world, (total, world)
    if rank == 0:
        with open(args.state + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(args.state + ".tmp", args.state)
        print(f"STEP {step} world={world}", flush=True)
    time.sleep(args.delay)
dist.barrier()
dist.destroy_process_group()
