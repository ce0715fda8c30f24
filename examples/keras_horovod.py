"""Keras (tf-keras) data-parallel training through Horovod: horovod.tensorflow.keras.

Horovod's own API only. Keras 3 breaks this path ('Variable' object has no attribute
'ref'); the entrypoint's TF_USE_LEGACY_KERAS=1 makes tf.keras the Keras 2 API it needs.
"""

import os
import pickle

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import synthetic

args = synthetic.arguments()

hvd.init()
keras = tf.keras
keras.utils.set_random_seed(hvd.rank())             # different on purpose: the broadcast fixes it
model = keras.Sequential([keras.Input((synthetic.FEATURES,)), keras.layers.Dense(32, activation="tanh"),
                          keras.layers.Dense(1)])
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size() ** 0.5))
model.compile(optimizer=optimizer, loss="mse")

ckpt = os.path.join(os.environ.get("CHECKPOINT_DIR", "/app/checkpoints"), "keras_horovod.pkl")
start = 0
if os.path.exists(ckpt):
    with open(ckpt, "rb") as f:
        state = pickle.load(f)
    model.set_weights(state["weights"])
    start = state["step"]
    print(f"RESUMED rank={hvd.rank()} step={start}", flush=True)

x_all, y_all = synthetic.load()
x, y = synthetic.shard(x_all, y_all, hvd.rank(), hvd.size())


def full_loss() -> float:
    return float(np.mean((model(x_all, training=False).numpy() - y_all) ** 2))


hvd_tf.broadcast_variables(model.variables, root_rank=0)   # every rank starts from rank 0's weights
before = full_loss()
synthetic.started(hvd.rank(), start)
if start < args.steps:
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)
    model.fit(data, epochs=1, steps_per_epoch=args.steps - start,
              callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_: synthetic.pause(args))],
              verbose=0)
weights = model.get_weights()
if hvd.rank() == 0 and start < args.steps:
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    with open(ckpt + ".tmp", "wb") as f:
        pickle.dump({"weights": weights, "step": args.steps}, f)
    os.replace(ckpt + ".tmp", ckpt)
after = full_loss()
synthetic.report("keras-horovod", hvd.rank(), hvd.size(), before, after, synthetic.digest(weights),
                 keras=synthetic.keras_flavor(keras))
hvd_tf.join()
