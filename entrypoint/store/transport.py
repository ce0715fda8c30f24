"""The job store's transport: what every backend of the job store offers, and nothing more.

A job's nodes meet, number and watch each other through a few keys (job/members.py,
job/ends.py, job/watch.py's heartbeats, job/rounds.py, health/hang_protocol.py). Those
families know what the keys mean; a backend only moves strings: today torch's TCPStore,
served by the master (tcp.py). Another one (an external, replicated store) implements
this class and nothing else. Keys are relative to the job's prefix (`job_prefix`), which
the backend applies; they are never deleted during a job, so there is no delete. A node
waiting for one key calls `wait`, which a backend that can block on the store does (a
poll through a secret's relay costs CPU on every node, and on 2 cores that shows in the
job's start); the rest poll.

Every operation raises StoreGone once the store cannot be reached; `connect` raises
RendezvousError when it cannot reach it in time, naming the endpoint and why.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from typing import Callable, TypeVar

T = TypeVar("T")

POLL_S = 0.05          # JobStore.wait's interval where the backend cannot block on the store


def job_prefix(run_id: str) -> str:
    """Where one job's keys live in the job store."""
    return f"disttrain/{run_id}/"


class StoreGone(Exception):
    """The job store cannot be reached (its host stopped, or the network failed)."""


class RendezvousError(Exception):
    """Joining failed; str() names MASTER_ADDR:MASTER_PORT and what was waited for.
    `ends_job`: the job cannot go on without this node (False for a node it never needed)."""

    def __init__(self, text: str, ends_job: bool = True):
        super().__init__(text)
        self.ends_job = ends_job


class JobStore(ABC):
    """A job's key-value store, as every node sees it. `endpoint`: where it is, as the
    user named it (for messages); `local_endpoint`: where this node's own clients (torch's
    agent, the training processes) reach it; `identity`: the job's TLS identity
    (security/secret.py, JOB_SECRET), or None, for the launchers' own servers and tunnels."""

    endpoint: str
    identity = None

    @property
    @abstractmethod
    def local_endpoint(self) -> str: ...

    @abstractmethod
    def connect(self, deadline: float, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Reach the store (or serve it) before `deadline` (time.monotonic()), unless
        `cancelled()`; a later call makes a new connection, to whichever store then serves."""

    @abstractmethod
    def close(self) -> None:
        """This node's last writes reach the store; stop serving or relaying."""

    @abstractmethod
    def has(self, key: str) -> bool: ...

    @abstractmethod
    def get(self, key: str) -> str | None:
        """The key's value, or None while it is not set."""

    @abstractmethod
    def set(self, key: str, value: str) -> None: ...

    @abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Add to a counter (0 if unset) and return its new value; add(key, 0) reads it."""

    @abstractmethod
    def compare_set(self, key: str, expected: str, desired: str) -> str:
        """Set `desired` if the key holds `expected` ("": the key is unset); returns what is stored."""

    def wait(self, key: str, timeout_s: float) -> bool:
        """Whether `key` is set within `timeout_s`: here by looking every POLL_S."""
        deadline = time.monotonic() + timeout_s
        while not self.has(key):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True


def read(store: JobStore, key: str, parse: Callable[[str], T]) -> T | None:
    """The key's value parsed, or None while it is not set."""
    found = store.get(key)
    return parse(found) if found is not None else None


def read_json(store: JobStore, key: str):
    return read(store, key, json.loads)
