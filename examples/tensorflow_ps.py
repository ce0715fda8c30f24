"""Asynchronous TensorFlow training with ParameterServerStrategy (SYNC_MODE=async).

Runs on the chief only; the entrypoint started the parameter servers and the workers
(disttrain.tf_server) from the same TF_CONFIG cluster. Workers apply their updates to the
variables on the parameter servers without waiting for each other.
"""

import os

import numpy as np
import tensorflow as tf

import synthetic

args = synthetic.arguments()

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
workers = resolver.cluster_spec().num_tasks("worker")
keras = tf.keras
x_all, y_all = synthetic.load()

with strategy.scope():
    model = synthetic.keras_model(keras, hidden=args.hidden)
    optimizer = keras.optimizers.SGD(args.lr)


def dataset_fn():
    return tf.data.Dataset.from_tensor_slices((x_all, y_all)).shuffle(1024, seed=0).repeat().batch(args.batch_size)


@tf.function
def train_step(iterator):
    def step(bx, by):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(bx, training=True) - by))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss
    bx, by = next(iterator)
    return strategy.run(step, args=(bx, by))


def full_loss() -> float:
    return float(np.mean((model(x_all, training=False).numpy() - y_all) ** 2))


before = full_loss()
iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
synthetic.started(0, 0)
for _ in range(args.steps):
    synthetic.pause(args)
    coordinator.schedule(train_step, args=(iterator,))
coordinator.join()
weights = model.get_weights()
synthetic.report(os.environ.get("FRAMEWORK", "tensorflow") + "-ps", 0, workers, before, full_loss(),
                 synthetic.digest(weights), keras=synthetic.keras_flavor(keras))
