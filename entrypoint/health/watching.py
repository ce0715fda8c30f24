"""What a runner watches while its node's processes run: the job's liveness (job/watch.py)
with the hang protocol as its PeerCheck, or on one node its own ranks' progress.

    watch = watching(job, serverless=..., token=...)    # in a launcher's runner()
"""

from __future__ import annotations

from ..job.join import JoinedJob
from ..job.watch import JobWatch
from .hang_protocol import HangProtocol
from .vigil import LocalWatch, Vigil


def watching(job: JoinedJob, serverless: bool, token: str | None = None,
             agent_in_process: bool = False, worker_links: bool = False) -> JobWatch | LocalWatch | None:
    """`serverless`: the node has no process of its own to wait for (TF servers, MPI
    hosts); `token`: the node token of its processes, for elastic torchrun (job/watch.py);
    `agent_in_process`: torch's agent runs in the entrypoint (launchers/torchrun/agent.py);
    `worker_links`: the workers publish link ports, which the master holds (job/links.py).
    On one node: its ranks' progress (LocalWatch), or None when nothing reports it."""
    if job.store is None:
        return LocalWatch(job.config, job.log, job.progress) if job.progress else None
    rank = job.placement.node_rank
    hangs = None
    if job.progress:
        hangs = HangProtocol(job.store, job.config, rank, job.log, Vigil(job.config, rank, job.log, job.progress))
    return JobWatch(job.store, job.config, rank, job.log, job.signals, serverless=serverless, token=token,
                    agent_in_process=agent_in_process, peer_check=hangs, worker_links=worker_links)
