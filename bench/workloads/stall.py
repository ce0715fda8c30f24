"""A training script for the hang and straggler tests and bench/hangs.py: real collectives,
one rank stalls.

    FRAMEWORK=pytorch LAUNCHER=native   DDP (gloo)
    FRAMEWORK=pytorch LAUNCHER=horovod  Horovod's DistributedOptimizer
    FRAMEWORK=tensorflow LAUNCHER=native  MultiWorkerMirroredStrategy, Keras fit
    FRAMEWORK=keras LAUNCHER=horovod    horovod.tensorflow.keras, Keras fit
    FRAMEWORK=mxnet LAUNCHER=native     Gluon on MXNet's parameter servers (dist_sync)

STALL_STEP (default 15): at that step the stalling rank waits forever in `wait_forever`
(STALL_RANK, default 1; or the local rank 0 of the node whose NODE_ADDR is STALL_ADDR),
while the others go on into the next collective. STALL_STEP=0: nobody stalls.
HEALTHY=1: nobody stalls, but the first step comes FIRST_S late, rank 0 "saves a
checkpoint" for SAVE_S at step 10 while the others wait in a barrier, and every rank
evaluates for EVAL_S at step 20. STEPS (default 40) steps, then 'STALL-SCRIPT done rank=R';
the stalling rank says 'STALL-SCRIPT stalls t=<wall clock>' first.
"""

import argparse
import os
import time

# Every setting is a variable, or an argument (--stall-step 0: compose passes arguments, TRAIN_ARGS).
_settings = argparse.ArgumentParser()
for _name, _default in (("STEPS", "40"), ("STALL_STEP", "15"), ("WORK", "64"), ("STEP_SLEEP", "0.05")):
    _settings.add_argument("--" + _name.lower().replace("_", "-"), default=os.environ.get(_name, _default))
_args, _ = _settings.parse_known_args()

FRAMEWORK = os.environ.get("FRAMEWORK", "pytorch")
LAUNCHER = os.environ.get("LAUNCHER", "native")
STEPS = int(_args.steps)
STALL_STEP = int(_args.stall_step)
HEALTHY = os.environ.get("HEALTHY") == "1"
WORK = int(_args.work)                              # matrix size: how long a rank's own work takes
STEP_SLEEP = float(_args.step_sleep)


def stalls(rank: int) -> bool:
    if HEALTHY or STALL_STEP <= 0:
        return False
    addr = os.environ.get("STALL_ADDR")
    if addr:
        return os.environ.get("NODE_ADDR") == addr and int(os.environ.get("LOCAL_RANK", "0")) == 0
    return rank == int(os.environ.get("STALL_RANK", "1"))


def wait_forever():
    print(f"STALL-SCRIPT stalls t={time.time():.3f}", flush=True)
    while True:
        time.sleep(0.1)


def slow_parts(rank: int, step: int, barrier, evaluate) -> None:
    if not HEALTHY:
        return
    if step == 10:
        if rank == 0:
            time.sleep(float(os.environ.get("SAVE_S", "3")))    # a long checkpoint save
        barrier()
    if step == 20:
        evaluate(float(os.environ.get("EVAL_S", "3")))


def torch_main():
    import torch
    if LAUNCHER == "horovod":
        import horovod.torch as hvd
        hvd.init()
        rank, barrier = hvd.rank(), lambda: hvd.allreduce(torch.zeros(1), name="barrier")
        model = torch.nn.Sequential(torch.nn.Linear(WORK, WORK), torch.nn.Tanh(), torch.nn.Linear(WORK, 1))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, barrier = dist.get_rank(), dist.barrier
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(WORK, WORK), torch.nn.Tanh(), torch.nn.Linear(WORK, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def evaluate(seconds):
        end = time.monotonic() + seconds
        with torch.no_grad():
            while time.monotonic() < end:
                model(torch.randn(32, WORK))

    if HEALTHY:
        time.sleep(float(os.environ.get("FIRST_S", "8")))       # a slow first step (loading, compiling)
    x = torch.randn(256, WORK)
    for step in range(1, STEPS + 1):
        if step == STALL_STEP and stalls(rank):
            wait_forever()
        slow_parts(rank, step, barrier, evaluate)
        for _ in range(8):                                       # this rank's own work
            x = torch.tanh(x @ torch.randn(WORK, WORK) * 0.1)
        loss = model(x.detach()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(STEP_SLEEP)
    print(f"STALL-SCRIPT done rank={rank}", flush=True)


def keras_main():
    import numpy as np
    import tensorflow as tf
    if LAUNCHER == "horovod":
        import horovod.tensorflow.keras as hvd
        hvd.init()
        rank = hvd.rank()
        strategy = None
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = strategy.cluster_resolver.task_id

    class Stall(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch + 1 == STALL_STEP and stalls(rank):
                wait_forever()

    def build():
        model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(16, activation="tanh"),
                                     tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.01)
        if LAUNCHER == "horovod":
            opt = hvd.DistributedOptimizer(opt)
        model.compile(optimizer=opt, loss="mse")
        return model

    if strategy is None:
        model = build()
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), Stall()]
    else:
        with strategy.scope():
            model = build()
        callbacks = [Stall()]
    x = np.random.rand(STEPS * 8, 16).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8).repeat()
    if strategy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        data = data.with_options(options)
    model.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0, callbacks=callbacks)
    print(f"STALL-SCRIPT done rank={rank}", flush=True)


def mxnet_main():
    import mxnet as mx
    from mxnet import autograd, gluon, nd

    kv = mx.kv.create("dist_sync" if os.environ.get("DMLC_ROLE") == "worker" else "local")
    rank = kv.rank
    net = gluon.nn.Dense(1, in_units=WORK)
    net.initialize(mx.init.Constant(0.01))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv,
                            update_on_kvstore=True if kv.type.startswith("dist") else None)
    x, y = nd.random.uniform(shape=(32, WORK)), nd.random.uniform(shape=(32, 1))
    for step in range(1, STEPS + 1):
        if step == STALL_STEP and stalls(rank):
            wait_forever()
        with autograd.record():
            loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        trainer.step(32)
        loss.asscalar()                      # wait for this step's update (the servers' reply)
        time.sleep(STEP_SLEEP)
    print(f"STALL-SCRIPT done rank={rank}", flush=True)


if __name__ == "__main__":
    {"pytorch": torch_main, "mxnet": mxnet_main}.get(FRAMEWORK, keras_main)()
