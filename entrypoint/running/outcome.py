"""What became of a node and its processes: one typed result instead of bare exit codes.

As torch's elastic agent has WorkerState and RunResult, a node here ends in one Outcome:
a state (what happened), the exit code it means, and a one-line reason. Exit codes are
derived here and only here (128 + signal number for a stopped node, as a shell reports
it), and outcomes travel through the job store as JSON, so every node reads "stopped" or
"lost" from the state, never from arithmetic on a code.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from enum import Enum


class NodeState(str, Enum):
    SUCCEEDED = "succeeded"     # every critical process exited 0 (or the job finished for a server-only node)
    FAILED = "failed"           # one of this node's processes failed; the code is its exit code
    STOPPED = "stopped"         # this node was stopped by a signal (docker stop, Ctrl-C): 128 + signal
    ABORTED = "aborted"         # another node ended the job: its failure (1) or its stop (128 + signal)
    LOST = "lost"               # the master or a peer stopped answering: 1
    LEFT = "left"               # elastic: this worker node was stopped and left a job that goes on
    HUNG = "hung"               # a rank made no progress for HANG_TIMEOUT seconds: EXIT_HUNG

    def __str__(self) -> str:
        return self.value


EXIT_HUNG = 124                 # as timeout(1) reports a command that ran past its limit


def signal_code(signum: int) -> int:
    """The exit code of a process ended by `signum`, as a shell reports it."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@dataclass(frozen=True)
class Outcome:
    state: NodeState
    code: int
    reason: str = ""
    cause: NodeState | None = None       # ABORTED: the state of the node that ended the job

    # ----------------------------------------------------------------- constructors
    @staticmethod
    def succeeded(reason: str = "") -> "Outcome":
        return Outcome(NodeState.SUCCEEDED, 0, reason)

    @staticmethod
    def failed(reason: str, code: int = 1) -> "Outcome":
        return Outcome(NodeState.FAILED, code if code != 0 else 1, reason)

    @staticmethod
    def stopped(signum: int, who: str = "node") -> "Outcome":
        return Outcome(NodeState.STOPPED, signal_code(signum), f"{who} was stopped ({signal_name(signum)})")

    @staticmethod
    def lost(reason: str) -> "Outcome":
        return Outcome(NodeState.LOST, 1, reason)

    @staticmethod
    def left(signum: int, who: str = "node") -> "Outcome":
        return Outcome(NodeState.LEFT, signal_code(signum), f"{who} left the job ({signal_name(signum)})")

    @staticmethod
    def hung(reason: str) -> "Outcome":
        return Outcome(NodeState.HUNG, EXIT_HUNG, reason)

    @staticmethod
    def left_hung(reason: str) -> "Outcome":
        """Elastic: this node's ranks stalled; it leaves, and the job goes on without it."""
        return Outcome(NodeState.LEFT, EXIT_HUNG, reason)

    @staticmethod
    def of_process(label: str, returncode: int) -> "Outcome":
        """A critical process's end: Popen's returncode (-N when killed by signal N)."""
        if returncode == 0:
            return Outcome.succeeded()
        code = signal_code(-returncode) if returncode < 0 else returncode
        how = f"was killed by {signal_name(-returncode)}" if returncode < 0 else f"exited with {code}"
        return Outcome.failed(f"{label} {how}", code)

    def aborting(self) -> "Outcome":
        """What this node's outcome means for the other nodes of the job: every node ends
        with its code (a failed rank's own, 143 for a stop, 124 for a hang), so that the job's
        exit code is the same wherever it is read; a lost node (no code of its own) fails them with 1."""
        code = self.code if self.state in (NodeState.STOPPED, NodeState.HUNG, NodeState.FAILED) else 1
        return Outcome(NodeState.ABORTED, code, self.reason, cause=self.state)

    # ----------------------------------------------------------------- properties
    @property
    def ok(self) -> bool:
        return self.state is NodeState.SUCCEEDED

    @property
    def ends_job(self) -> bool:
        """Whether the other nodes must stop too: anything but success, or an elastic
        worker leaving a job that goes on without it."""
        return self.state not in (NodeState.SUCCEEDED, NodeState.LEFT)

    @property
    def on_purpose(self) -> bool:
        """Stopped by a person or an orchestrator, not failed: 143 rather than 1 downstream."""
        return NodeState.STOPPED in (self.state, self.cause)

    # ----------------------------------------------------------------- the job store's form
    def to_json(self) -> str:
        return json.dumps({"state": self.state.value, "code": self.code, "reason": self.reason,
                           "cause": self.cause.value if self.cause else None})

    @staticmethod
    def from_json(text: str | bytes) -> "Outcome":
        data = json.loads(text)
        cause = data.get("cause")
        return Outcome(NodeState(data["state"]), int(data["code"]), data.get("reason", ""),
                       NodeState(cause) if cause else None)
