"""Fails once, then trains: on torch's first attempt (TORCHELASTIC_RESTART_COUNT=0) the last
rank exits 1 after a few allreduces; on the next every rank forms a new group, allreduces
and says so. The second attempt's group must not meet the first's keys in its store."""
import os
import sys

import torch
import torch.distributed as dist

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for _ in range(5):
    total = torch.ones(1) * (rank + 1)
    dist.all_reduce(total)
if attempt == 0 and rank == world - 1:
    print(f"FAILING rank={rank} attempt={attempt}", flush=True)
    sys.exit(1)
if attempt == 0:
    dist.barrier()                  # waits for the rank that left: torch's agent restarts the group
print(f"PASSED rank={rank} world={world} attempt={attempt} sum={int(total.item())}", flush=True)
dist.destroy_process_group()
