"""TensorFlow / Keras helpers: the strategy the launcher prepared, and the Keras 2 API.

The entrypoint sets TF_USE_LEGACY_KERAS=1, so `tf.keras` is tf-keras (Keras 2): Keras 3
fails with MultiWorkerMirroredStrategy and horovod.tensorflow.keras.
"""

from __future__ import annotations

import json
import os


def keras():
    """The Keras module that works with the strategies and Horovod here."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "1") == "1":
        import tf_keras
        return tf_keras
    import tensorflow as tf
    return tf.keras


def strategy():
    """MultiWorkerMirroredStrategy when TF_CONFIG lists several workers, the
    ParameterServerStrategy (on the chief) for SYNC_MODE=async, else the default."""
    import tensorflow as tf

    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    cluster = tf_config.get("cluster", {})
    if "ps" in cluster:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if len(cluster.get("worker", [])) > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def is_chief() -> bool:
    """The task that writes checkpoints and logs: the chief if the cluster has one, else worker 0."""
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = tf_config.get("task", {})
    if "chief" in tf_config.get("cluster", {}):
        return task.get("type") == "chief"
    return task.get("type", "worker") in ("worker", "chief") and int(task.get("index", 0)) == 0
