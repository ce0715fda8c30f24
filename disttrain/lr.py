"""Learning-rate helpers for large batches. Pure."""

from __future__ import annotations

import math


def scale_lr(base_lr: float, world_size: int, mode: str = "linear") -> float:
    """Scale a single-process learning rate to `world_size` data-parallel replicas.

    linear: base * n (Goyal et al., 2017); sqrt: base * sqrt(n), gentler for adaptive
    optimizers or BatchNorm-heavy models; none: unchanged.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if mode == "linear":
        return base_lr * world_size
    if mode == "sqrt":
        return base_lr * math.sqrt(world_size)
    if mode == "none":
        return base_lr
    raise ValueError(f"mode={mode!r}; allowed: linear, sqrt, none")


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warm-up from 1/warmup_steps to 1 over the first warmup_steps steps."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return (step + 1) / warmup_steps


def warmup_lr(step: int, base_lr: float, world_size: int, warmup_steps: int, mode: str = "linear") -> float:
    """The scaled LR reached gradually: from base_lr at step 0 to scale_lr(...) at warmup_steps."""
    target = scale_lr(base_lr, world_size, mode)
    return base_lr + (target - base_lr) * warmup_factor(step, warmup_steps) if warmup_steps > 0 else target
