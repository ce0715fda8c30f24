"""TensorFlow / Keras synchronous data-parallel training with MultiWorkerMirroredStrategy.

Only TensorFlow's own API: the entrypoint wrote TF_CONFIG after the nodes exchanged
addresses. tf.keras is tf-keras (Keras 2) because the entrypoint set TF_USE_LEGACY_KERAS=1.
"""

import json
import os

import numpy as np
import tensorflow as tf

import synthetic

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
start = synthetic.load_weights(model, "tf_mwms.pkl", index)


def full_loss() -> float:
    return float(np.mean((model(x_all, training=False).numpy() - y_all) ** 2))


before = full_loss()
synthetic.started(index, start)
if start < args.steps:
    data = tf.data.Dataset.from_tensor_slices((x_all, y_all)).repeat().batch(args.batch_size * world)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    model.fit(data.with_options(options), epochs=1, steps_per_epoch=args.steps - start,
              callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_: synthetic.pause(args))],
              verbose=0)
weights = model.get_weights()
if index == 0 and start < args.steps:
    synthetic.save_weights(weights, "tf_mwms.pkl", args.steps)
synthetic.report(os.environ.get("FRAMEWORK", "tensorflow"), index, world, before, full_loss(),
                 synthetic.digest(weights), keras=synthetic.keras_flavor(keras))
