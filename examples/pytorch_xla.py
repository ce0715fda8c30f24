"""PyTorch/XLA data-parallel training with the image's API: the XLA device, the 'xla'
process group (xla://) and DDP over it. On a TPU host the entrypoint starts this once per
host and dt.launch starts one process per chip (torch_xla.launch); on XLA's CPU client
(PJRT_DEVICE=CPU) it runs one process. Checkpoints on rank 0, resumes from CHECKPOINT_DIR."""

import time

import torch
from torch import nn

import synthetic
from disttrain import checkpoint
from disttrain import torch as dt
from disttrain.lr import scale_lr


def main(args) -> None:
    info = dt.init()
    rank, world = info.rank, info.world_size
    device = dt.device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(synthetic.FEATURES, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=scale_lr(args.lr, world, "sqrt"))
    start = 0
    resumed = checkpoint.load_latest(reader=lambda f: torch.load(f, map_location="cpu"))
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
    timed_from = start + min(5, max(0, args.steps - start - 1))      # after XLA compiled the step
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
        dt.sync()                       # XLA compiles (once) and runs the traced step here
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps:
            checkpoint.save(dt.to_cpu({"model": model.state_dict(), "optimizer": optimizer.state_dict()}), step + 1,
                            rank=rank, writer=torch.save, ext="pt")
    elapsed = time.perf_counter() - started
    synthetic.report("pytorch", rank, world, before, full_loss(), dt.parameter_digest(model),
                     device=str(device), xla=dt.uses_xla(),
                     samples_per_s=f"{(args.steps - timed_from) * args.batch_size * world / max(elapsed, 1e-9):.0f}")
    dt.shutdown()


if __name__ == "__main__":
    dt.launch(main, synthetic.arguments())
