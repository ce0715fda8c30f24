"""MXNet (Gluon) + Horovod with Horovod's own API only (hvd.init, broadcast_parameters,
DistributedTrainer). Under LAUNCHER=horovod the entrypoint set up rendezvous; no SSH, no
horovodrun. Checkpoints on rank 0 and resumes from CHECKPOINT_DIR."""

import os
import pickle

import horovod.mxnet as hvd
import mxnet as mx
from mxnet import autograd, gluon, nd

import synthetic

args = synthetic.arguments()

hvd.init()
mx.random.seed(hvd.rank())                       # different on purpose: the broadcast fixes it
net = gluon.nn.Sequential()
net.add(gluon.nn.Dense(args.hidden, activation="tanh", in_units=synthetic.FEATURES),
        gluon.nn.Dense(1, in_units=args.hidden))
net.initialize(mx.init.Xavier())
params = net.collect_params()

ckpt = os.path.join(os.environ.get("CHECKPOINT_DIR", "/app/checkpoints"), "horovod_mxnet.pkl")
start = 0
if os.path.exists(ckpt):
    with open(ckpt, "rb") as f:
        state = pickle.load(f)
    for name, value in state["params"].items():
        params[name].set_data(nd.array(value))
    start = state["step"]
    print(f"RESUMED rank={hvd.rank()} step={start}", flush=True)
hvd.broadcast_parameters(params, root_rank=0)
# DistributedTrainer averages the gradients over the ranks (allreduce) before each update.
trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": args.lr * hvd.size() ** 0.5})

x_all, y_all = synthetic.load()
x, y = synthetic.shard(x_all, y_all, hvd.rank(), hvd.size())
full_x, full_y = nd.array(x_all), nd.array(y_all)


def full_loss() -> float:
    return float(((net(full_x) - full_y) ** 2).mean().asscalar())


def weights() -> dict:
    return {name: p.data().asnumpy() for name, p in sorted(params.items())}


before = full_loss()
synthetic.started(hvd.rank(), start)
for step in range(start, args.steps):
    synthetic.pause(args)
    bx, by = synthetic.batches(x, y, args.batch_size, step)
    with autograd.record():
        loss = ((net(nd.array(bx)) - nd.array(by)) ** 2).mean()
    loss.backward()
    trainer.step(1)                              # the loss is already a mean over the batch
    if hvd.rank() == 0 and step % 20 == 0:
        print(f"step {step} loss {loss.asscalar():.4f}", flush=True)
if hvd.rank() == 0 and start < args.steps:
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    with open(ckpt + ".tmp", "wb") as f:
        pickle.dump({"params": weights(), "step": args.steps}, f)
    os.replace(ckpt + ".tmp", ckpt)
synthetic.report("horovod-mxnet", hvd.rank(), hvd.size(), before, full_loss(),
                 synthetic.digest(weights().values()))
# MXNet runs operations asynchronously: wait for the last allreduce (and everything else)
# before Horovod shuts down, or MXNet's own exit hook finds a Horovod op still pending.
hvd.allreduce(nd.zeros((1,)), name="final-barrier").wait_to_read()
nd.waitall()
hvd.shutdown()
