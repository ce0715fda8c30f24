"""torchrun, ending with the failed worker's own exit code.

    python -m entrypoint.launchers.torchrun.run TORCHRUN-ARGUMENTS...

takes torchrun's command line and runs it as torchrun does (torch.distributed.run). When a
worker fails, torchrun itself ends with 1 and a report of some thirty lines (a traceback of
its ChildFailedError); this ends with that worker's code, 128 + N for one killed by signal
N, and one line naming the rank. Stopped by a signal (`docker stop`), it says so in one
line rather than a traceback of its SignalException. The entrypoint starts this for its torchrun subprocess
(one node; PyTorch/XLA); its agent across nodes (agent.py) reads the same failure from its
RunResult, through `worker_failure`.
"""

from __future__ import annotations

import logging
import sys

from ...running.outcome import Outcome, signal_code, signal_name
from .node_ids import distinct_node_ids

LABEL = "torchrun"
# torch's report of a failed worker ('failed (exitcode: 1) local_rank: 0 (pid: ...) of
# binary: ...'): worker_failure's one line says the same.
FAILURE_REPORT = "torch.distributed.elastic.multiprocessing.api"


def worker_failure(rank: int, code: int) -> Outcome:
    """The outcome of a worker of global rank `rank` that ended with `code` (negative: killed
    by that signal, as torch reports it, as Popen does): Outcome.of_process's line and code."""
    return Outcome.of_process(f"{LABEL}: rank {rank}", code)


def quiet_warnings() -> None:
    """torch's elastic agent warns of each step of a stop it was asked for ("Received 15
    death signal", "Sending process N closing signal SIGTERM" for each worker): its own
    errors still reach the console, the entrypoint says what stopped."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger(FAILURE_REPORT).setLevel(logging.CRITICAL)


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from .etcd_rendezvous import register as register_etcd_backend

    quiet_warnings()
    distinct_node_ids()
    register_etcd_backend()                    # --rdzv-backend=etcd-v3 (JOB_STORE)
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        outcome = worker_failure(rank, failure.exitcode)
        print(outcome.reason, file=sys.stderr, flush=True)
        return outcome.code
    except SignalException as exc:      # stopped (docker stop): torch has stopped the workers already
        print(f"{LABEL}: stopped by {signal_name(exc.sigval)}; its workers are stopped", file=sys.stderr, flush=True)
        return signal_code(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
