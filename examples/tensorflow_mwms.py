"""TensorFlow / Keras synchronous data-parallel training with MultiWorkerMirroredStrategy.

TensorFlow's own API for the training: the entrypoint wrote TF_CONFIG after the nodes
exchanged addresses, and tf.keras is tf-keras (Keras 2) because it set
TF_USE_LEGACY_KERAS=1. Recovery is Keras's BackupAndRestore, through
disttrain.tf.backup_and_restore: a job killed mid-training and started again (compose
`restart: on-failure`) continues from the last backup, and a rerun with more --steps
continues from where the last run ended.
"""

import json
import os

import numpy as np
import tensorflow as tf

import synthetic
from disttrain import tf as dtf

args = synthetic.arguments()

tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
workers = tf_config.get("cluster", {}).get("worker", [])
index = tf_config.get("task", {}).get("index", 0)
strategy = tf.distribute.MultiWorkerMirroredStrategy() if len(workers) > 1 else tf.distribute.get_strategy()
world = strategy.num_replicas_in_sync
keras = tf.keras

x_all, y_all = synthetic.load()
with strategy.scope():
    model = synthetic.keras_model(keras, hidden=args.hidden)
    model.compile(optimizer=keras.optimizers.SGD(args.lr * world ** 0.5), loss="mse")


def full_loss() -> float:
    return float(np.mean((model(x_all, training=False).numpy() - y_all) ** 2))


before = full_loss()                         # the untrained model's: fit restores the backup
backup = dtf.backup_and_restore(every=args.checkpoint_every,
                                on_restore=lambda step: print(f"RESUMED rank={index} step={step}", flush=True))
data = tf.data.Dataset.from_tensor_slices((x_all, y_all)).repeat().batch(args.batch_size * world)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA


def after_step(step: int, logs: dict) -> None:
    synthetic.pause(args)
    if index == 0 and step % 20 == 0:
        print(f"step {step} loss {logs['loss']:.4f}", flush=True)


progress = keras.callbacks.LambdaCallback(on_train_begin=lambda _: synthetic.started(index, backup.resumed_step),
                                          on_train_batch_end=after_step)
model.fit(data.with_options(options), epochs=1, steps_per_epoch=args.steps, callbacks=[backup, progress],
          verbose=0)
weights = model.get_weights()
synthetic.report(os.environ.get("FRAMEWORK", "tensorflow"), index, world, before, full_loss(),
                 synthetic.digest(weights), keras=synthetic.keras_flavor(keras))
