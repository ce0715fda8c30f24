"""Keras and TensorFlow under Horovod, written against Horovod's own API with no disttrain
import: whatever GRAD_COMPRESSION and GRAD_ACCUMULATION do, the image does to it.

Prints, from every rank:
  AGG rank=R passes=N        the backward passes per update of the running Keras optimizer
  FIRST rank=R max_diff=D    after fit() on --batches batches: the weights against one
                             plain SGD step on every rank's batches together
  GRADS rank=R fp16=0|1      a gradient from hvd.DistributedGradientTape: exactly fp16 numbers?
  KERAS rank=R fp16=0|1      a gradient through the running Keras optimizer's own all-reduce
                             (the function fit() applies gradients with): exactly fp16 numbers?
"""

import argparse
import os

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

keras = tf.keras
hvd.init()
rank, world = hvd.rank(), hvd.size()
p = argparse.ArgumentParser()
p.add_argument("--batches", type=int, default=int(os.environ.get("GRAD_ACCUMULATION", "1")),
               help="batches this rank fits (the script does nothing else with it)")
n = p.parse_args().batches
IN, BATCH, LR = 8, 16, 0.1


def batch(i, r):
    rng = np.random.default_rng(1000 * i + r)
    x = rng.standard_normal((BATCH, IN)).astype("float32")
    return x, x @ np.linspace(-1, 1, IN, dtype="float32").reshape(IN, 1)


def net():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((IN,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])


reference = net()
xs, ys = (np.concatenate(part) for part in zip(*(batch(i, r) for r in range(world) for i in range(n))))
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(reference(xs) - ys))
expected = [v.numpy() - LR * g.numpy() for v, g in zip(reference.trainable_variables,
                                                        tape.gradient(loss, reference.trainable_variables))]

model = net()
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))
model.compile(optimizer, loss="mse")
helper = getattr(optimizer, "_agg_helper", None)
print(f"AGG rank={rank} passes={helper.backward_passes_per_step if helper else 1}", flush=True)
mine = [batch(i, rank) for i in range(n)]
model.fit(np.concatenate([x for x, _ in mine]), np.concatenate([y for _, y in mine]), batch_size=BATCH,
          epochs=1, shuffle=False, verbose=0)
diff = max(float(np.abs(a - b.numpy()).max()) for a, b in zip(expected, model.trainable_variables))
print(f"FIRST rank={rank} max_diff={diff:.3g}", flush=True)



def fp16(grad) -> int:
    grad = np.asarray(grad)
    return int(np.array_equal(grad, grad.astype(np.float16).astype(np.float32)))


x, y = batch(99, rank)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
local = tape.gradient(loss, model.trainable_variables)
print(f"KERAS rank={rank} fp16={fp16(optimizer._allreduce_grads(local, model.trainable_variables)[0])}", flush=True)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
grad = hvd_tf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)[0].numpy()
print(f"GRADS rank={rank} fp16={fp16(grad)}", flush=True)
