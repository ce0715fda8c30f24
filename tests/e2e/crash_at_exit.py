"""A rank that leaves without the barrier and crashes at exit, as torch 2.13 + gloo did in
2 runs of 4 ('terminate called without an active exception'); the other rank then waits
in destroy_process_group for a peer that is gone."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
print(f"ALLREDUCED rank={dist.get_rank()}", flush=True)
store = dist.distributed_c10d._get_default_store()
if dist.get_rank() == 0:
    store.set("rank0_allreduced", "1")
else:
    # Not before rank 0 is out of its all_reduce: an abort while rank 0 still reads the
    # last bytes resets the connection under it (rank 0 then failed its all_reduce, once in CI).
    store.wait(["rank0_allreduced"])
    os.abort()                       # SIGABRT, exit 134, no barrier, no goodbye
dist.barrier()                       # rank 0 would wait here for rank 1 until gloo's timeout
dist.destroy_process_group()
