"""Keras (tf-keras) data-parallel training through Horovod: horovod.tensorflow.keras.

Horovod's own API only. Keras 3 breaks this path ('Variable' object has no attribute
'ref'); the entrypoint's TF_USE_LEGACY_KERAS=1 makes tf.keras the Keras 2 API it needs.
"""

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import synthetic

args = synthetic.arguments()

hvd.init()
keras = tf.keras
model = synthetic.keras_model(keras, seed=hvd.rank(), hidden=args.hidden)   # different on purpose: the broadcast fixes it
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size() ** 0.5))
model.compile(optimizer=optimizer, loss="mse")
start = synthetic.load_weights(model, "keras_horovod.pkl", hvd.rank())

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
              # Horovod's own callbacks, as its examples use them (they need patch 0005: tf.keras's backend).
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                         keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_: synthetic.pause(args))],
              verbose=0)
weights = model.get_weights()
if hvd.rank() == 0 and start < args.steps:
    synthetic.save_weights(weights, "keras_horovod.pkl", args.steps)
after = full_loss()
synthetic.report("keras-horovod", hvd.rank(), hvd.size(), before, after, synthetic.digest(weights),
                 keras=synthetic.keras_flavor(keras))
hvd_tf.join()
