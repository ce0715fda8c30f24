"""PyTorch + Horovod with Horovod's own API only (hvd.init, DistributedOptimizer,
broadcast). Under LAUNCHER=horovod the entrypoint set up rendezvous; no SSH, no horovodrun."""

import hashlib
import os

import horovod.torch as hvd
import torch
from torch import nn

import synthetic

args = synthetic.arguments()

hvd.init()
device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(hvd.rank())                       # different on purpose: broadcast fixes it
model = nn.Sequential(nn.Linear(synthetic.FEATURES, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size() ** 0.5)

ckpt = os.path.join(os.environ.get("CHECKPOINT_DIR", "/app/checkpoints"), "horovod_torch.pt")
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt, map_location=device)
    model.load_state_dict(state["model"])
    start = state["step"]
    print(f"RESUMED rank={hvd.rank()} step={start}", flush=True)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

x_all, y_all = synthetic.load()
x, y = synthetic.shard(x_all, y_all, hvd.rank(), hvd.size())
full_x, full_y = torch.from_numpy(x_all).to(device), torch.from_numpy(y_all).to(device)


def full_loss() -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(full_x), full_y).item()


before = full_loss()
synthetic.started(hvd.rank(), start)
for step in range(start, args.steps):
    synthetic.pause(args)
    bx, by = synthetic.batches(x, y, args.batch_size, step)
    loss = nn.functional.mse_loss(model(torch.from_numpy(bx).to(device)), torch.from_numpy(by).to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if hvd.rank() == 0 and step % 20 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
if hvd.rank() == 0 and start < args.steps:
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    torch.save({"model": model.state_dict(), "step": args.steps}, ckpt + ".tmp")
    os.replace(ckpt + ".tmp", ckpt)
digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.state_dict().values()))
synthetic.report("horovod-pytorch", hvd.rank(), hvd.size(), before, full_loss(), digest.hexdigest()[:16],
                 device=str(device))
hvd.allreduce(torch.zeros(1), name="final-barrier")
hvd.shutdown()
