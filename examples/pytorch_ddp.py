"""PyTorch data-parallel training with the image's API (DDP under torchrun; local SGD when
SYNC_MODE=async). Checkpoints on rank 0 and resumes from CHECKPOINT_DIR; asked to stop
(SIGTERM: preemption, scancel, docker stop), it checkpoints the step it is at and exits 143."""

import time

import torch
from torch import nn

import synthetic
from disttrain import checkpoint, preemption
from disttrain import torch as dt
from disttrain.lr import scale_lr

args = synthetic.arguments()

info = dt.init()
preemption.catch()
rank, world = dt.rank(), dt.world_size()
device = dt.device()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(synthetic.FEATURES, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=scale_lr(args.lr, world, "sqrt"))
start = 0
resumed = checkpoint.load_latest(reader=lambda f: torch.load(f, map_location=device))
if resumed:
    start, state = resumed
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"RESUMED rank={rank} step={start}", flush=True)

x_all, y_all = synthetic.load(info.data_dir)
x, y = synthetic.shard(x_all, y_all, rank, world)
full_x, full_y = torch.from_numpy(x_all).to(device), torch.from_numpy(y_all).to(device)


def full_loss() -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(full_x), full_y).item()


before = full_loss()
ddp = dt.wrap_model(model)
optimizer = dt.wrap_optimizer(optimizer, ddp)
synthetic.started(rank, start)
timed_from = start + min(5, max(0, args.steps - start - 1))      # throughput after 5 warm-up steps
started = time.perf_counter()
for step in range(start, args.steps):
    if step == timed_from:
        started = time.perf_counter()
    synthetic.pause(args)
    bx, by = synthetic.batches(x, y, args.batch_size, step)
    loss = nn.functional.mse_loss(ddp(torch.from_numpy(bx).to(device)), torch.from_numpy(by).to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0 and step % 20 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    stopping = dt.stop_requested()
    if stopping or (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps:
        checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step + 1,
                        writer=torch.save, ext="pt")
    if stopping:
        synthetic.preempted(rank, step + 1)
        dt.finish(preemption.exit_code())
elapsed = time.perf_counter() - started
if info.sync_mode == "async":
    dt.average_parameters(model)        # local SGD ends with one final average
synthetic.report("pytorch", rank, world, before, full_loss(), dt.parameter_digest(model),
                 device=str(device), sync=info.sync_mode,
                 samples_per_s=f"{(args.steps - timed_from) * args.batch_size * world / max(elapsed, 1e-9):.0f}")
dt.finish()
