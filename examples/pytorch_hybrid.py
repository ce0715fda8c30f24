"""Hybrid parallel PyTorch: a (dp x tp) DeviceMesh from PARALLEL_MODE/TP_SIZE.

The MLP's layers are split across the 'tp' dimension with torch's tensor parallelism
(ColwiseParallel, then RowwiseParallel: Megatron-style); gradients are averaged across
the 'dp' dimension. PARALLEL_MODE=model_parallel is the case dp = 1.

Each tp rank holds a different shard, so every rank saves its own with
torch.distributed.checkpoint (disttrain.checkpoint.save_sharded), and a resumed job loads
them resharded to its own layout: another world size or TP_SIZE works too.
"""


import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import synthetic
from disttrain import checkpoint
from disttrain import torch as dt

args = synthetic.arguments()
HIDDEN = max(args.hidden, 2)          # split across the tp dimension

info = dt.init()
mesh = dt.mesh()
tp_mesh, dp_group = mesh["tp"], mesh.get_group("dp")
dp_rank, dp_size = mesh.get_local_rank("dp"), mesh.size(0)
rank = dist.get_rank()

torch.manual_seed(0)                        # the same full model everywhere, then sharded
model = nn.Sequential(nn.Linear(synthetic.FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
model = parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)


def digests() -> dict[str, str]:
    """This rank's shards, and the full parameters (gathered over tp: the same on every rank)."""
    shards = [(p.to_local() if hasattr(p, "to_local") else p).detach().numpy() for p in model.parameters()]
    full = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy() for p in model.parameters()]
    return {"digest": synthetic.digest(shards), "full": synthetic.digest(full)}


start = checkpoint.load_sharded(model, optimizer)
if start:
    found = digests()
    print(f"RESUMED rank={rank} step={start} shard={found['digest']} full={found['full']}", flush=True)

x_all, y_all = synthetic.load(info.data_dir)
x, y = synthetic.shard(x_all, y_all, dp_rank, dp_size)      # data splits over dp only
full_x, full_y = torch.from_numpy(x_all), torch.from_numpy(y_all)


def full_loss() -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(full_x), full_y).item()


before = full_loss()
synthetic.started(rank, start)
for step in range(start, args.steps):
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
    if rank == 0 and step % 20 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    if (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps:
        checkpoint.save_sharded(step + 1, model, optimizer)          # every rank: its own shards
        found = digests()
        print(f"SAVED rank={rank} step={step + 1} shard={found['digest']} full={found['full']}", flush=True)

found = digests()
synthetic.report("pytorch-hybrid", rank, dist.get_world_size(), before, full_loss(), found["digest"],
                 full=found["full"], dp=f"{dp_rank}/{dp_size}", tp=f"{mesh.get_local_rank('tp')}/{mesh.size(1)}")
dt.finish()
