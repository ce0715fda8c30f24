"""The examples' data: DATA_DIR/dataset.npz if present, else a seeded synthetic regression.

    python make_dataset.py /app/data     writes dataset.npz for the examples to read
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import numpy as np

FEATURES = 16


def arguments() -> argparse.Namespace:
    """The options every example takes (arguments after the image name reach them)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60, help="total optimizer steps")
    parser.add_argument("--batch-size", type=int, default=32, help="per-process batch size")
    parser.add_argument("--lr", type=float, default=0.05, help="single-process learning rate")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (demos)")
    parser.add_argument("--hidden", type=int, default=32, help="width of the model's hidden layer")
    return parser.parse_args()


def started(rank: int, step: int) -> None:
    print(f"TRAINING rank={rank} from_step={step}", flush=True)


def preempted(rank: int, step: int) -> None:
    """Asked to stop: the checkpoint of `step` is written (the tests look for this line)."""
    print(f"PREEMPTED rank={rank} checkpoint_step={step}", flush=True)


def pause(args: argparse.Namespace) -> None:
    if args.step_delay > 0:
        time.sleep(args.step_delay)


def make(samples: int = 4096, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, 1)).astype(np.float32)
    y = (np.tanh(x @ w) + 0.05 * rng.normal(size=(samples, 1))).astype(np.float32)
    return x, y


def load(data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    path = os.path.join(data_dir or os.environ.get("DATA_DIR", "/app/data"), "dataset.npz")
    if os.path.exists(path):
        with np.load(path) as data:
            return data["x"].astype(np.float32), data["y"].astype(np.float32)
    return make()


def shard(x: np.ndarray, y: np.ndarray, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    return x[rank::world], y[rank::world]


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The step-th batch, cycling through the shard in a fixed order."""
    start = (step * batch_size) % max(1, len(x) - batch_size + 1)
    return x[start:start + batch_size], y[start:start + batch_size]


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


def report(framework: str, rank: int, world: int, before: float, after: float, param_digest: str, **extra) -> None:
    """One line per rank that tests and people can read: did it learn, do replicas agree?"""
    fields = " ".join(f"{k}={v}" for k, v in extra.items())
    line = (f"RESULT framework={framework} rank={rank} world={world} loss_before={before:.6f} "
            f"loss_after={after:.6f} digest={param_digest} {fields}".rstrip())
    # One write with its newline: under PYTHONUNBUFFERED=1 print() writes the text and the newline
    # separately, and another rank's line can land between them on a shared pipe.
    print(line + "\n", end="", flush=True)


def keras_model(keras, seed: int = 0, hidden: int = 32):
    """The examples' Keras model (the same architecture as the PyTorch one), seeded."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(hidden, activation="tanh"),
                             keras.layers.Dense(1)])


def keras_flavor(keras_module) -> str:
    """'tf-keras 2.21.0' (Keras 2 API) or 'keras 3.x' — which Keras tf.keras resolved to."""
    if keras_module.__name__.startswith("tf_keras"):
        import tf_keras
        return f"tf-keras-{tf_keras.__version__}"
    import keras
    return f"keras-{keras.__version__}"
