"""Hybrid parallel PyTorch: a (dp x tp) DeviceMesh from PARALLEL_MODE/TP_SIZE.

The MLP's layers are split across the 'tp' dimension with torch's tensor parallelism
(ColwiseParallel, then RowwiseParallel: Megatron-style); gradients are averaged across
the 'dp' dimension. PARALLEL_MODE=model_parallel is the case dp = 1.
"""


import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import synthetic
from disttrain import torch as dt

args = synthetic.arguments()
HIDDEN = max(args.hidden, 2)          # split across the tp dimension

info = dt.init()
mesh = dt.mesh()
tp_mesh, dp_group = mesh["tp"], mesh.get_group("dp")
dp_rank, dp_size = mesh.get_local_rank("dp"), mesh.size(0)

torch.manual_seed(0)                        # the same full model everywhere, then sharded
model = nn.Sequential(nn.Linear(synthetic.FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
model = parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

x_all, y_all = synthetic.load(info.data_dir)
x, y = synthetic.shard(x_all, y_all, dp_rank, dp_size)      # data splits over dp only
full_x, full_y = torch.from_numpy(x_all), torch.from_numpy(y_all)


def full_loss() -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(full_x), full_y).item()


before = full_loss()
synthetic.started(dist.get_rank(), 0)
for step in range(args.steps):
    synthetic.pause(args)
    bx, by = synthetic.batches(x, y, args.batch_size, step)
    loss = nn.functional.mse_loss(model(torch.from_numpy(bx)), torch.from_numpy(by))
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():             # data parallelism across the dp dimension
        local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(local, group=dp_group)
        local.div_(dp_size)
    optimizer.step()
    if dist.get_rank() == 0 and step % 20 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)

shards = [(p.to_local() if hasattr(p, "to_local") else p).detach() for p in model.parameters()]
synthetic.report("pytorch-hybrid", dist.get_rank(), dist.get_world_size(), before, full_loss(),
                 synthetic.digest([s.numpy() for s in shards]), dp=f"{dp_rank}/{dp_size}",
                 tp=f"{mesh.get_local_rank('tp')}/{mesh.size(1)}")
dt.shutdown()
