"""Elastic Horovod with Keras (tf-keras): LAUNCHER=horovod, FRAMEWORK=tensorflow|keras,
MIN_NODES:MAX_NODES. Horovod's own elastic API for Keras: hvd.elastic.run, KerasState and
its CommitStateCallback. When a node is lost, the others roll back to the last commit and
go on at the new size; when one joins, it receives the state (the model, the optimizer and
the step) and the data is split again. Rank 0 reports each round to the entrypoint
(disttrain.elastic).

The step count is this example's own callback (`Steps`): Horovod's UpdateBatchStateCallback
records Keras's batch index, which restarts at 0 in the shortened epoch after a reset.
"""

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import synthetic
from disttrain.elastic import first_step_done, report_round

args = synthetic.arguments()
COMMIT_EVERY = 10                      # steps between commits: what a lost node costs at most

hvd.init()
keras = tf.keras
model = synthetic.keras_model(keras, seed=0, hidden=args.hidden)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr)), loss="mse")
# The optimizer's variables exist before the first sync on every rank, also on a node that
# joins later: tf-keras creates them at the first step, and KerasState broadcasts the
# model's and the optimizer's variables, so a newcomer without them would wait in a
# broadcast the others never make. (Horovod's own example runs one step of fit instead.)
model.optimizer.build(model.trainable_variables)
x_all, y_all = synthetic.load()


def full_loss() -> float:
    return float(np.mean((model(x_all, training=False).numpy() - y_all) ** 2))


class Steps(keras.callbacks.Callback):
    """state.step: optimizer steps over every round; progress lines as the other examples'."""

    def __init__(self, state):
        super().__init__()
        self.state, self.resumed_from = state, state.step

    def on_train_begin(self, logs=None):
        self.resumed_from = self.state.step

    def on_train_batch_end(self, batch, logs=None):
        synthetic.pause(args)
        self.state.step += 1
        if hvd.rank() == 0 and self.state.step == self.resumed_from + 1:
            first_step_done(hvd.size(), self.resumed_from)
        if hvd.rank() == 0 and self.state.step % 20 == 0:
            print(f"step {self.state.step} loss {logs['loss']:.4f} world {hvd.size()}", flush=True)


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        report_round(hvd.size(), state.step)
        print(f"ROUND rank=0 world={hvd.size()} from_step={state.step} loss={full_loss():.6f}", flush=True)
    synthetic.started(hvd.rank(), state.step)
    x, y = synthetic.shard(x_all, y_all, hvd.rank(), hvd.size())
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)
    remaining = args.steps - state.step
    if remaining > 0:
        # Steps first: a commit (where a host change interrupts) records the step it follows.
        state.model.fit(data, epochs=1, steps_per_epoch=remaining, verbose=0,
                        callbacks=[Steps(state), hvd.elastic.CommitStateCallback(state, batches_per_commit=COMMIT_EVERY)])


before = full_loss()
state = hvd.elastic.KerasState(model, step=0)
train(state)
synthetic.report("keras-horovod-elastic", hvd.rank(), hvd.size(), before, full_loss(),
                 synthetic.digest(model.get_weights()), keras=synthetic.keras_flavor(keras))
hvd.shutdown()
