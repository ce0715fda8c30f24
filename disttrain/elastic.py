"""Elastic-safe PyTorch training loops, for jobs that shrink and grow (MIN_NODES:MAX_NODES).

When a node is lost or one joins, torchrun stops every training process and starts them
again at the new world size. A loop written with `Run`:

* resumes from the latest checkpoint: the objects you give it (model, optimizer, ...),
  the step, and the position in the epoch's data;
* checkpoints when the membership changes: at the next step boundary after torchrun's
  SIGTERM (a node joins or leaves cleanly), or, when a peer is lost in the middle of a
  step, the last completed step (a failed collective leaves parameters and optimizer
  untouched: DDP averages gradients inside backward(), before optimizer.step());
* re-shards the data for the new world size, from where the job was: each epoch is one
  seeded permutation of the dataset, and every step consumes the next batch_size x
  world samples of it, so no sample is seen twice or skipped when the world size changes
  (torch's ElasticDistributedSampler restarts from an index of the unshuffled dataset
  instead);
* reports each round (world size, step resumed from) to the job store, where every
  node's entrypoint logs it as one line.

    from disttrain import elastic, torch as dt

    dt.init()
    with elastic.Run(model=model, optimizer=optimizer, every=50) as run:
        ddp = dt.wrap_model(model)
        for step, (x, y) in run.batches(dataset, batch_size=32, steps=1000):
            loss = loss_fn(ddp(x), y)
            optimizer.zero_grad(); loss.backward(); optimizer.step()

Give Run the objects whose state_dict() is the training state, as you built them (the
model before wrap_model). Checkpoints are disttrain.checkpoint's (rank 0 writes, atomic,
the last few kept), so the model's state is taken to be replicated: data parallel.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Iterator

import torch
import torch.distributed as dist

from . import checkpoint
from .env import context

ROUNDS_KEY, ROUND_KEY = "rounds", "round/{n}"           # the job store's keys (entrypoint/job/rounds.py)


class ResumableSampler(torch.utils.data.Sampler):
    """This rank's share of one epoch, from position `offset` of the epoch's permutation:
    rank r takes positions offset + r, offset + r + world, ... Ranks get equal shares;
    the tail that cannot be split evenly waits for the next epoch's permutation."""

    def __init__(self, size: int, rank: int, world: int, epoch: int, offset: int = 0, seed: int = 0,
                 shuffle: bool = True):
        self.size, self.rank, self.world, self.epoch, self.offset = size, rank, world, epoch, offset
        self.seed, self.shuffle = seed, shuffle

    def order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.size)
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=generator)

    def __len__(self) -> int:
        return max(0, self.size - self.offset) // self.world

    def __iter__(self) -> Iterator[int]:
        rest = self.order()[self.offset:]
        usable = len(self) * self.world
        return iter(rest[self.rank:usable:self.world].tolist())


class Run:
    """One elastic training run on this process: resume, batches, checkpoints."""

    def __init__(self, every: int = 100, directory: str | None = None, seed: int = 0, shuffle: bool = True,
                 **state: Any):
        if not state:
            raise ValueError("Run needs the training state: Run(model=model, optimizer=optimizer, ...)")
        for name, obj in state.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"{name}: needs state_dict() and load_state_dict(), got {type(obj).__name__}")
        self.state, self.every, self.directory = state, every, directory
        self.seed, self.shuffle = seed, shuffle
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.local_rank = context().local_rank
        self.step, self.epoch, self.offset = 0, 0, 0       # completed steps; position in the epoch
        self.resumed_from = 0
        self._saved_step: int | None = None
        self._stop_signal: int | None = None
        self._first_step_done = False

    # ----------------------------------------------------------------- entering and leaving
    def __enter__(self) -> "Run":
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.resume()
        self._report()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and not issubclass(exc_type, SystemExit):
            # A collective failed (a peer was lost) or the step raised: the state is still
            # that of the last completed step. One process per node writes it; the state is
            # replicated and the write atomic, so several nodes writing the same step is safe.
            if self.local_rank == 0:
                self.save(reason=f"{exc_type.__name__} during step {self.step}", every_node=True)
            if under_torchrun():
                traceback.print_exception(exc_type, exc, tb)
                _leave(1)
        return False

    def _on_sigterm(self, signum, _frame) -> None:
        self._stop_signal = signum          # acted on at the next step boundary

    # ----------------------------------------------------------------- state
    def resume(self) -> int:
        found = checkpoint.load_latest(self.directory,
                                       reader=lambda f: torch.load(f, map_location="cpu", weights_only=False))
        found = self._newest_of_every_rank(found)
        if found is None:
            return 0
        step, saved = found
        for name, obj in self.state.items():
            obj.load_state_dict(saved["state"][name])
        self.step, self.epoch, self.offset = step, saved["epoch"], saved["offset"]
        self.resumed_from, self._saved_step = step, step
        return step

    def _newest_of_every_rank(self, found):
        """The newest checkpoint any rank has, on every rank. Without a folder the nodes
        share (CHECKPOINT_DIR in a bucket: each node has its own copy), a node that joined
        holds the bucket's checkpoint, while the membership change's own checkpoint is on
        the node of global rank 0; the rank that has the newest sends it to the others."""
        if not dist.is_initialized() or self.world_size < 2:
            return found
        steps: list = [None] * self.world_size
        dist.all_gather_object(steps, found[0] if found else -1)
        newest = max(steps)
        if newest < 0 or min(steps) == newest:
            return found
        payload = [found[1] if found and found[0] == newest else None]
        dist.broadcast_object_list(payload, src=steps.index(newest))
        return newest, payload[0]

    def save(self, reason: str = "", every_node: bool = False) -> None:
        """Write the state as of the last completed step (once per step): global rank 0
        writes, or with `every_node` the process that calls it."""
        if self._saved_step == self.step:
            return
        saved = {"state": {name: obj.state_dict() for name, obj in self.state.items()},
                 "epoch": self.epoch, "offset": self.offset, "world": self.world_size}
        path = checkpoint.save(saved, self.step, directory=self.directory, writer=torch.save, ext="pt",
                               rank=0 if every_node else self.rank)
        self._saved_step = self.step
        if path is not None and reason:
            print(f"ELASTIC checkpoint at step {self.step} ({reason})", flush=True)

    # ----------------------------------------------------------------- the loop
    def sampler(self, size: int) -> ResumableSampler:
        return ResumableSampler(size, self.rank, self.world_size, self.epoch, self.offset, self.seed, self.shuffle)

    def batches(self, dataset, batch_size: int, steps: int, **loader_args) -> Iterator[tuple[int, Any]]:
        """(step, batch) until `steps` steps are done, epoch after epoch, from where the
        job was, this rank's share at the current world size."""
        consumed = batch_size * self.world_size
        while self.step < steps:
            if len(dataset) - self.offset < consumed:
                self.epoch, self.offset = self.epoch + 1, 0
                if len(dataset) < consumed:
                    raise ValueError(f"dataset of {len(dataset)} samples < batch_size {batch_size} x world "
                                     f"size {self.world_size}")
            loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, drop_last=True,
                                                 sampler=self.sampler(len(dataset)), **loader_args)
            for batch in loader:
                yield self.step, batch
                self.step += 1
                self.offset += consumed
                self._after_step()
                if self.step >= steps:
                    break
            else:
                self.offset = len(dataset)          # this epoch is used up
        self.save()

    def _after_step(self) -> None:
        if not self._first_step_done:
            self._first_step_done = True
            if self.rank == 0:
                first_step_done(self.world_size, self.resumed_from)
        if self._stop_signal is not None:
            # torchrun stops the workers to re-form the group (or the node is stopping).
            self.save(reason="membership change")
            _leave(128 + self._stop_signal)
        if self.every and self.step % self.every == 0:
            self.save()

    # ----------------------------------------------------------------- reporting
    def _report(self) -> None:
        """Global rank 0 tells the job store about this round; the entrypoints log it."""
        if self.rank == 0:
            report_round(self.world_size, self.step)


def first_step_done(world: int, resumed_from: int) -> None:
    """One line when a round's first step is done (bench/elastic.py measures with it)."""
    print(f"ELASTIC first step at world size {world} (resumed from step {resumed_from}) t={time.time():.3f}",
          flush=True)


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def _leave(code: int) -> None:
    """End this process now. torchrun replaces it with one in a new process group; an
    orderly interpreter exit with the old, broken group takes seconds (1.7 s measured
    on loopback), and torchrun re-forms the job only once every old process is gone."""
    sys.stdout.flush()
    sys.stderr.flush()
    if under_torchrun():
        os._exit(code)
    sys.exit(code)


def report_round(world: int, step: int) -> bool:
    """Record a training round in the job store (DISTTRAIN_JOB_STORE, set by the entrypoint
    for multi-node jobs). False where there is no job store."""
    endpoint, prefix = os.environ.get("DISTTRAIN_JOB_STORE"), os.environ.get("DISTTRAIN_JOB_PREFIX", "")
    if not endpoint:
        return False
    host, port = endpoint.rsplit(":", 1)
    try:
        store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                              timeout=_dt.timedelta(seconds=10))
        n = int(store.add(prefix + ROUNDS_KEY, 1))
        store.set(prefix + ROUND_KEY.format(n=n), json.dumps({"world": world, "step": step}))
        return True
    except (RuntimeError, ValueError) as exc:
        print(f"ELASTIC could not report the round to the job store at {endpoint}: {exc}", flush=True)
        return False
