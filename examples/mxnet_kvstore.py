"""MXNet (Gluon) data-parallel training on MXNet's parameter servers (LAUNCHER=native).

The entrypoint started a scheduler and NUM_PS servers on the master and gave every worker
its DMLC_* role; `disttrain.mxnet.kvstore()` joins them as `dist_sync` (SYNC_MODE=sync:
one update per step from every worker's gradients) or `dist_async` (each worker's
gradients are applied as they arrive). The servers run the optimizer (update_on_kvstore).
Checkpoints on rank 0 and resumes from CHECKPOINT_DIR.
"""

import pickle

import mxnet as mx
from mxnet import autograd, gluon, nd

import synthetic
from disttrain import checkpoint
from disttrain import mxnet as dmx
from disttrain.env import context

args = synthetic.arguments()

info = context()
kv = dmx.kvstore()
rank, world = kv.rank, kv.num_workers
sync = kv.type != "dist_async"

mx.random.seed(0)
net = gluon.nn.Sequential()
net.add(gluon.nn.Dense(args.hidden, activation="tanh", in_units=synthetic.FEATURES),
        gluon.nn.Dense(1, in_units=args.hidden))
net.initialize(mx.init.Xavier())
params = net.collect_params()
start = 0
resumed = checkpoint.load_latest()
if resumed:
    start, state = resumed
    for name, value in state.items():
        params[name].set_data(nd.array(value))
    print(f"RESUMED rank={rank} step={start}", flush=True)

# Sync: the servers sum the workers' gradients, so each step rescales by 1/world (the mean).
lr = args.lr * world ** 0.5 if sync else args.lr
trainer = dmx.trainer(params, "sgd", {"learning_rate": lr})

x_all, y_all = synthetic.load(info.data_dir)
x, y = synthetic.shard(x_all, y_all, rank, world)
full_x, full_y = nd.array(x_all), nd.array(y_all)


def full_loss() -> float:
    return float(((net(full_x) - full_y) ** 2).mean().asscalar())


def weights() -> dict:
    return {name: p.data().asnumpy() for name, p in sorted(params.items())}


before = full_loss()
synthetic.started(rank, start)
for step in range(start, args.steps):
    synthetic.pause(args)
    bx, by = synthetic.batches(x, y, args.batch_size, step)
    with autograd.record():
        loss = ((net(nd.array(bx)) - nd.array(by)) ** 2).mean()
    loss.backward()
    trainer.step(world if sync else 1)           # pushes gradients, pulls the servers' weights
    if rank == 0 and step % 20 == 0:
        print(f"step {step} loss {loss.asscalar():.4f}", flush=True)
    if (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps:
        checkpoint.save(weights(), step + 1, rank=rank, writer=pickle.dump)
synthetic.report("mxnet", rank, world, before, full_loss(), synthetic.digest(weights().values()),
                 kvstore=kv.type, sync=info.sync_mode)
