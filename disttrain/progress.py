"""A training process's progress, reported to its node's entrypoint, with no change to the script.

The image's per-interpreter line (disttrain.pth) calls `install()` in every Python process;
it does nothing unless the entrypoint gave the process DISTTRAIN_PROGRESS (a folder). Then
it hooks the frameworks where a training step shows, as each is imported:

    step      PyTorch: every optimizer step (torch's global step hook; a step that ends
              twice, as Horovod's DistributedOptimizer's does, counts once); Keras/TensorFlow: every
              train batch of fit(); MXNet: Gluon's Trainer.step
    activity  Keras evaluate/predict batches, tf.function calls (custom TensorFlow loops),
              Horovod's synchronize (its PyTorch collectives), MXNet kvstore pushes

and, for straggler detection, the time a PyTorch rank spends between the end of its step
and the start of its next backward pass (its forward and data loading: time it computes on
its own, before any gradient collective can make it wait for the others).

On its first event the process starts a daemon thread that writes `<folder>/<pid>.json`
once a second (written aside, then renamed), and registers faulthandler to dump every
thread's Python stack into `<folder>/<pid>.stack` on STACK_SIGNAL: from the signal
handler, so it works while the main thread waits in C code (a collective) or holds the
GIL. A process that never steps (a data-loader worker, a server) writes nothing.

The cost on a step is a few attribute updates and one clock read (bench/progress.py).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import threading
import time

from .hooks import after_import

VAR = "DISTTRAIN_PROGRESS"
STACK_SIGNAL = signal.SIGRTMIN + 3      # real-time: nothing else in a training stack uses it
WRITE_INTERVAL_S = 1.0
SMOOTHING = 0.2                          # weight of the newest step in the recent step time


class Progress:
    """One process's counters; `step()` and `activity()` are what the hooks call."""

    def __init__(self, folder: str):
        self.folder = folder
        self.pid = os.getpid()
        self.steps = 0
        self.activities = 0
        self.last_step = 0.0               # time.monotonic() (one clock for the whole host)
        self.last_event = 0.0
        self.step_time: float | None = None
        self.compute_time: float | None = None
        self.source = ""
        self._last_optimizer = None       # PyTorch: whose step ended last
        self._computing_since = 0.0        # end of the last step; 0: no step yet, or backward started
        self._started = False

    # ------------------------------------------------------------------ events
    def step(self, source: str) -> None:
        now = time.monotonic()
        if self.steps:
            interval = now - self.last_step
            self.step_time = interval if self.step_time is None else \
                self.step_time + SMOOTHING * (interval - self.step_time)
        self.steps += 1
        self.source = source
        self.last_step = self.last_event = now
        self._computing_since = now
        if not self._started:
            self._start(source)

    def activity(self, source: str) -> None:
        self.activities += 1
        self.last_event = time.monotonic()
        if not self._started:
            self._start(source)

    def backward_starts(self) -> None:
        """PyTorch: the time since the last step was this rank's own work."""
        now = time.monotonic()
        since = self._computing_since
        if since:
            spent = now - since
            self.compute_time = spent if self.compute_time is None else \
                self.compute_time + SMOOTHING * (spent - self.compute_time)
            self._computing_since = 0.0
        self.activities += 1
        self.last_event = now
        if not self._started:
            self._start("torch backward")

    # ------------------------------------------------------------------ reporting
    def record(self) -> dict:
        from .env import RankInfo
        try:
            info = RankInfo.from_env(dict(os.environ))
            rank, local_rank = info.rank, info.local_rank
        except (ValueError, KeyError):
            rank, local_rank = None, None
        return {"pid": self.pid, "rank": rank, "local_rank": local_rank, "host": socket.gethostname(),
                "source": self.source, "steps": self.steps, "activities": self.activities,
                "last_step": self.last_step, "last_event": self.last_event, "step_time": self.step_time,
                "compute_time": self.compute_time, "written": time.monotonic()}

    def write(self) -> None:
        path = os.path.join(self.folder, f"{self.pid}.json")
        aside = path + ".tmp"
        with open(aside, "w") as f:
            json.dump(self.record(), f)
        os.replace(aside, path)

    def _start(self, source: str) -> None:
        self._started = True
        self.source = self.source or source
        try:
            stack_file = open(os.path.join(self.folder, f"{self.pid}.stack"), "a")
            faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
            self.write()
        except OSError:
            return                         # the folder is gone: the entrypoint is not watching
        threading.Thread(target=self._write_every_second, name="disttrain-progress", daemon=True).start()

    def _write_every_second(self) -> None:
        while True:
            time.sleep(WRITE_INTERVAL_S)
            try:
                self.write()
            except OSError:
                return


_progress: Progress | None = None


def current() -> Progress | None:
    """This process's Progress (a forked child starts its own: _forked)."""
    return _progress


def _forked() -> None:
    global _progress
    if _progress is not None:
        _progress = Progress(_progress.folder)


def _step(source: str) -> None:
    p = current()
    if p is not None:
        p.step(source)


def _activity(source: str) -> None:
    p = current()
    if p is not None:
        p.activity(source)


# ---------------------------------------------------------------------- the frameworks' hooks

def _hook_torch_optimizer(module) -> None:
    # Runs on every step: module globals, one call. Horovod's DistributedOptimizer calls its
    # base class's step inside its own, so one step ends twice, with the same optimizer and
    # no backward pass in between: the second end is not counted.
    def post(optimizer, args, kwargs):
        p = _progress
        if p is None:
            return
        if optimizer is p._last_optimizer and p._computing_since:
            return
        p._last_optimizer = optimizer
        p.step("torch optimizer")

    module.register_optimizer_step_post_hook(post)


def _hook_torch_backward(module) -> None:
    original = module.backward

    def backward(*args, **kwargs):
        if _progress is not None:
            _progress.backward_starts()
        return original(*args, **kwargs)

    backward.__wrapped__ = original
    backward.__doc__ = original.__doc__
    module.backward = backward


def _wrap(cls, name: str, before=None, after=None) -> None:
    original = getattr(cls, name)
    if getattr(original, "_disttrain", False):       # one class under two module names (Keras 3)
        return

    def wrapper(*args, **kwargs):
        if before:
            before()
        result = original(*args, **kwargs)
        if after:
            after()
        return result

    wrapper.__wrapped__ = original
    wrapper.__doc__ = original.__doc__
    wrapper.__name__ = original.__name__
    wrapper._disttrain = True
    setattr(cls, name, wrapper)


def _hook_keras_callbacks(module) -> None:
    cls = module.CallbackList
    _wrap(cls, "on_train_batch_end", after=lambda: _step("keras train batch"))
    _wrap(cls, "on_test_batch_end", after=lambda: _activity("keras test batch"))
    _wrap(cls, "on_predict_batch_end", after=lambda: _activity("keras predict batch"))


def _hook_tf_function(module) -> None:
    _wrap(module.Function, "__call__", after=lambda: _activity("tf.function"))


def _hook_horovod_torch(module) -> None:
    original = module.synchronize

    def synchronize(handle):
        result = original(handle)
        _activity("horovod collective")
        return result

    synchronize.__wrapped__ = original
    synchronize.__doc__ = original.__doc__
    module.synchronize = synchronize


def _hook_mxnet_trainer(module) -> None:
    _wrap(module.Trainer, "step", after=lambda: _step("mxnet trainer"))


def _hook_mxnet_kvstore(module) -> None:
    _wrap(module.KVStore, "push", after=lambda: _activity("mxnet kvstore push"))


HOOKS = {
    "torch.optim.optimizer": _hook_torch_optimizer,
    "torch.autograd": _hook_torch_backward,
    "tf_keras.src.callbacks": _hook_keras_callbacks,                 # tf-keras (TF_USE_LEGACY_KERAS=1)
    "keras.src.callbacks": _hook_keras_callbacks,                    # Keras 2.13-2.15
    "keras.callbacks": _hook_keras_callbacks,                        # Keras 2.12 and older
    "keras.src.callbacks.callback_list": _hook_keras_callbacks,      # Keras 3
    "tensorflow.python.eager.polymorphic_function.polymorphic_function": _hook_tf_function,
    "horovod.torch.mpi_ops": _hook_horovod_torch,
    "mxnet.gluon.trainer": _hook_mxnet_trainer,
    "mxnet.kvstore.kvstore": _hook_mxnet_kvstore,
}


def install() -> None:
    """Hook the frameworks if the entrypoint watches this process's progress."""
    global _progress
    folder = os.environ.get(VAR)
    if not folder or _progress is not None:
        return
    _progress = Progress(folder)
    os.register_at_fork(after_in_child=_forked)
    for name, hook in HOOKS.items():
        after_import(name, hook)
