"""Elastic PyTorch data parallelism (MIN_NODES:MAX_NODES): training goes on when a node is
lost and grows when one joins. disttrain.elastic resumes from the latest checkpoint,
checkpoints on every membership change and re-shards the data for the new world size."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

import synthetic
from disttrain import elastic
from disttrain import torch as dt

args = synthetic.arguments()

info = dt.init()
rank, world = dt.rank(), dt.world_size()
device = dt.device()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(synthetic.FEATURES, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
x_all, y_all = synthetic.load(info.data_dir)
dataset = TensorDataset(torch.from_numpy(x_all), torch.from_numpy(y_all))
full_x, full_y = dataset.tensors[0].to(device), dataset.tensors[1].to(device)


def full_loss() -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(full_x), full_y).item()


with elastic.Run(model=model, optimizer=optimizer, every=args.checkpoint_every) as run:
    before = full_loss()
    print(f"ROUND rank={rank} world={world} from_step={run.step} loss={before:.6f}", flush=True)
    ddp = dt.wrap_model(model)
    synthetic.started(rank, run.step)
    for step, (bx, by) in run.batches(dataset, args.batch_size, args.steps):
        synthetic.pause(args)
        loss = nn.functional.mse_loss(ddp(bx.to(device)), by.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f} world {world}", flush=True)

synthetic.report("pytorch-elastic", rank, world, before, full_loss(), dt.parameter_digest(model),
                 resumed_from=run.resumed_from)
dt.finish()
