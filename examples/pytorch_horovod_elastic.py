"""Elastic Horovod with PyTorch (LAUNCHER=horovod, MIN_NODES:MAX_NODES), with Horovod's own
elastic API: hvd.elastic.run, TorchState and ElasticSampler. When a node is lost, the
others roll back to the last commit and go on; when one joins, it receives the state and
the data is split again. Rank 0 reports each round to the entrypoint (disttrain.elastic)."""

import horovod.torch as hvd
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import synthetic
from disttrain import torch as dt
from disttrain.elastic import first_step_done, report_round

args = synthetic.arguments()
COMMIT_EVERY = 10                      # steps between commits: what a lost node costs at most

hvd.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(synthetic.FEATURES, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                     named_parameters=model.named_parameters())
x_all, y_all = synthetic.load()
dataset = TensorDataset(torch.from_numpy(x_all), torch.from_numpy(y_all))
full_x, full_y = dataset.tensors


def full_loss() -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(full_x), full_y).item()


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        report_round(hvd.size(), state.step)
        print(f"ROUND rank=0 world={hvd.size()} from_step={state.step} loss={full_loss():.6f}", flush=True)
    synthetic.started(hvd.rank(), state.step)
    resumed_from = state.step
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=state.sampler)
    while state.step < args.steps:
        for batch, (bx, by) in enumerate(loader):
            synthetic.pause(args)
            loss = nn.functional.mse_loss(model(bx), by)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            state.step += 1
            state.sampler.record_batch(batch, args.batch_size)
            if hvd.rank() == 0 and state.step == resumed_from + 1:
                first_step_done(hvd.size(), resumed_from)
            if hvd.rank() == 0 and state.step % 20 == 0:
                print(f"step {state.step} loss {loss.item():.4f} world {hvd.size()}", flush=True)
            if state.step % COMMIT_EVERY == 0:
                state.commit()                   # also where a host change interrupts
            if state.step >= args.steps:
                break
        else:
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()


before = full_loss()
sampler = hvd.elastic.ElasticSampler(dataset)
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, step=0, epoch=0)
train(state)
synthetic.report("pytorch-horovod-elastic", hvd.rank(), hvd.size(), before, full_loss(), dt.parameter_digest(model))
hvd.shutdown()
