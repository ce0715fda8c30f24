"""Says where each global rank runs: the node's role and rank, after one allreduce (so the
process group really formed with these ranks)."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
print(f"PLACED rank={dist.get_rank()} world={dist.get_world_size()} role={os.environ['ROLE']} "
      f"node={os.environ['NODE_RANK']} local={os.environ['LOCAL_RANK']}", flush=True)
dist.destroy_process_group()
