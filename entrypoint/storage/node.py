"""One node's buckets from start to end, for main.py.

    storage = NodeStorage.prepare(plan.config, env, say)   # before anything: probes (ConfigError)
    storage.before_ranks(say)                          # stage the data, fetch the resume
    storage.start_mirror(node_rank, say)               # once the node has joined
    outcome = storage.finish(outcome, deadline, say)   # flush; a failed final upload fails the node
"""

from __future__ import annotations

import time
from typing import Callable

from ..contract.config import Config, ConfigError
from ..running.outcome import Outcome
from .client import endpoint_of, make_client
from .mirror import CheckpointMirror, report_line
from .probe import Wait, check_readable, check_writable
from .resume import fetch_for_resume
from .stage import stage_data

# At a normal end, the uploads may take this long beyond the processes' end; after a
# signal, GRACE_PERIOD from the signal bounds them.
FLUSH_S = 600.0


class NodeStorage:
    def __init__(self, config: Config, env: dict[str, str], clients: dict[str, object]):
        self.config, self.env, self.clients = config, env, clients
        self.mirror: CheckpointMirror | None = None

    @classmethod
    def prepare(cls, config: Config, env: dict[str, str],
                say: Callable[[str], None] = lambda line: None) -> "NodeStorage | None":
        """None without a bucket URL. Each store answers (within RDZV_TIMEOUT, saying so while
        it waits), and this node may read (data) and write (checkpoints): else one
        ConfigError. Nothing is fetched yet."""
        wanted = {name: url for name, url in (("DATA_DIR", config.data_url), ("CHECKPOINT_DIR", config.checkpoint_url))
                  if url is not None}
        if not wanted:
            return None
        clients = {}
        for name, url in wanted.items():
            if url.scheme == "oss" and not endpoint_of(env):
                raise ConfigError(f"{name}={str(url)!r}: oss:// needs its region's endpoint in AWS_ENDPOINT_URL, "
                                  f"e.g. https://oss-cn-hangzhou.aliyuncs.com (docs/storage.md)")
            probe = make_client(url, env, config.s3_addressing_style, attempts=2, connect_timeout=3, read_timeout=10)
            wait = Wait(config.rdzv_timeout, name, say)
            if name == "CHECKPOINT_DIR":        # written first: a store may make the bucket on a write
                check_writable(probe, url, name, env, wait)
            check_readable(probe, url, name, env, wait)
            clients[name] = make_client(url, env, config.s3_addressing_style)
        return cls(config, env, clients)

    def before_ranks(self, say: Callable[[str], None]) -> None:
        """The data staged and the resume fetched into the node's folders (StorageError)."""
        c = self.config
        if c.data_url:
            stage_data(self.clients["DATA_DIR"], c.data_url, c.data_dir, say, self.env)
        if c.checkpoint_url:
            fetch_for_resume(self.clients["CHECKPOINT_DIR"], c.checkpoint_url, c.checkpoint_dir, say, self.env)

    def start_mirror(self, node_rank: int, say: Callable[[str], None]) -> None:
        c = self.config
        if c.checkpoint_url and self.mirror is None:
            self.mirror = CheckpointMirror(self.clients["CHECKPOINT_DIR"], c.checkpoint_url, c.checkpoint_dir,
                                           node_rank, c.run_id, say, self.env).start()

    def finish(self, outcome: Outcome, signalled_at: float | None, say: Callable[[str], None]) -> Outcome:
        """Upload what is left; one line. A node whose final upload failed fails (its local
        copy stays), unless it already failed for another reason."""
        if self.mirror is None:
            return outcome
        now = time.monotonic()
        deadline = (max(signalled_at + self.config.grace_period, now + 1.0) if signalled_at is not None
                    else now + FLUSH_S)
        report = self.mirror.finish(deadline)
        line = report_line(self.config.checkpoint_url, self.config.checkpoint_dir, report)
        say(line)
        if not report.complete and outcome.ok:
            return Outcome.failed(line)
        return outcome
