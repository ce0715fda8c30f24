"""torch.distributed (gloo) allreduce of [rank + 1] * 4, launched by torchrun."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
tensor = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(tensor)
print(f"RESULT torch rank={dist.get_rank()} size={dist.get_world_size()} sum={tensor.tolist()}", flush=True)
dist.barrier()
dist.destroy_process_group()
