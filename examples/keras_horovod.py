"""Keras (tf-keras) data-parallel training through Horovod: horovod.tensorflow.keras.

Horovod's own API for the training. Keras 3 breaks this path ('Variable' object has no
attribute 'ref'); the entrypoint's TF_USE_LEGACY_KERAS=1 makes tf.keras the Keras 2 API it
needs. Recovery is Keras's BackupAndRestore, through disttrain.tf.backup_and_restore: rank
0 writes the backup, every rank restores it, so a job killed mid-training and started
again continues from the last backup.
"""

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import synthetic
from disttrain import tf as dtf

args = synthetic.arguments()

hvd.init()
keras = tf.keras
model = synthetic.keras_model(keras, seed=hvd.rank(), hidden=args.hidden)   # different on purpose: the broadcast fixes it
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size() ** 0.5))
model.compile(optimizer=optimizer, loss="mse")

x_all, y_all = synthetic.load()
x, y = synthetic.shard(x_all, y_all, hvd.rank(), hvd.size())


def full_loss() -> float:
    return float(np.mean((model(x_all, training=False).numpy() - y_all) ** 2))


hvd_tf.broadcast_variables(model.variables, root_rank=0)   # every rank starts from rank 0's weights
before = full_loss()                                        # the untrained model's: fit restores the backup
backup = dtf.backup_and_restore(every=args.checkpoint_every,
                                on_restore=lambda step: print(f"RESUMED rank={hvd.rank()} step={step}", flush=True))


def after_step(step: int, logs: dict) -> None:
    synthetic.pause(args)
    if hvd.rank() == 0 and step % 20 == 0:
        print(f"step {step} loss {logs['loss']:.4f}", flush=True)


progress = keras.callbacks.LambdaCallback(
    on_train_begin=lambda _: synthetic.started(hvd.rank(), backup.resumed_step), on_train_batch_end=after_step)
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)
# Horovod's own callbacks, as its examples use them (they need patch 0005: tf.keras's backend);
# the backup first, so every rank restores before anything runs.
model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0,
          callbacks=[backup, hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                     progress])
weights = model.get_weights()
synthetic.report("keras-horovod", hvd.rank(), hvd.size(), before, full_loss(), synthetic.digest(weights),
                 keras=synthetic.keras_flavor(keras))
hvd_tf.join()
