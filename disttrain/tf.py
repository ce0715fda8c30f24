"""TensorFlow / Keras helpers: the strategy the launcher prepared, the Keras 2 API, and
recovery from a backup in one call.

The entrypoint sets TF_USE_LEGACY_KERAS=1, so `tf.keras` is tf-keras (Keras 2): Keras 3
fails with MultiWorkerMirroredStrategy and horovod.tensorflow.keras.

    from disttrain import tf as dtf
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[dtf.backup_and_restore(every=20)])

A job that is killed and started again (compose `restart: on-failure`) continues from the
last backup, not from step 0.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from .env import context


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


def backup_and_restore(every: int | str = "epoch", directory: str | None = None,
                       on_restore: Callable[[int], None] | None = None, keep_after_training: bool = True):
    """tf-keras's BackupAndRestore callback, placed and configured for this launch.

    It backs up the training state (weights, optimizer, epoch and step) under
    `directory` (default CHECKPOINT_DIR/backup) every `every` steps, or each epoch, and at
    the end of training; `fit` restores it first and skips the steps already done.

    Who writes: under MultiWorkerMirroredStrategy, TensorFlow's own rule (every worker takes
    part in the save; the chief's copy is kept, the others write to per-worker temporary
    folders that TensorFlow removes). Without a multi-worker strategy (Horovod, mpirun),
    only rank 0 writes. Every worker reads the chief's copy, so `directory` must be on
    storage all nodes share.

    `on_restore(step)` is called on each worker when training resumes from a backup
    (step > 0). With `keep_after_training` (the default) the last backup stays after
    `fit` returns, so a later run with more steps continues from it; tf-keras's own default
    deletes it.
    """
    keras_ = keras()
    folder = directory or os.path.join(context().checkpoint_dir, "backup")

    class BackupAndRestore(keras_.callbacks.BackupAndRestore):
        resumed_step = 0
        _last = None              # (epoch, batch) of the newest step, and whether it is backed up

        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)           # restores the backup, if any
            strategy = self.model.distribute_strategy
            multi_worker = getattr(strategy.extended, "_in_multi_worker_mode", lambda: False)()
            self._writes = multi_worker or context().rank == 0
            self.resumed_step = int(self.model._train_counter.numpy())
            if self.resumed_step and on_restore:
                on_restore(self.resumed_step)

        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            self._last = (self._current_epoch, batch, self._batches_count == 0)

        def _backup(self, epoch, batch=0):
            if self._writes:
                super()._backup(epoch, batch)

        def on_train_end(self, logs=None):
            if self._last and not self._last[2] and self.save_freq != "epoch":
                self._backup(self._last[0], self._last[1])     # the final state, too
            super().on_train_end(logs)

    return BackupAndRestore(folder, save_freq=every, delete_checkpoint=not keep_after_training)
