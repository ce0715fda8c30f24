"""Fails once, then trains. In the job's first round the last rank exits 1 and the others
wait in a barrier until torch's agents restart every rank; in the next round every rank
forms a new group, allreduces and says so. The second round's group must not meet the
first's keys in its store.

"First round" is a marker in FAIL_ONCE_DIR, shared by the nodes, not
TORCHELASTIC_RESTART_COUNT: a node's agent that restarts its ranks because another node
asked for a new round (not because its own failed) counts no restart, so the nodes'
counts can differ in the same round."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

marker = Path(os.environ["FAIL_ONCE_DIR"]) / "failed-once"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
last = rank == world - 1
first_round = torch.tensor([0 if marker.exists() else 1]) if last else torch.zeros(1, dtype=torch.long)
dist.all_reduce(first_round)                # every rank takes the last rank's word for it
if first_round.item():
    if last:
        marker.touch()
        print(f"FAILING rank={rank}", flush=True)
        sys.exit(1)
    dist.barrier()                          # waits for the rank that left: torch's agents restart the group
for _ in range(5):
    total = torch.ones(1) * (rank + 1)
    dist.all_reduce(total)
print(f"PASSED rank={rank} world={world} sum={int(total.item())}", flush=True)
dist.destroy_process_group()
