"""Checkpoint when the job is asked to stop: preemption, `scancel`, `scontrol requeue`,
`docker stop`, a Kubernetes pod's deletion, a spot instance's reclaim.

Each of these sends SIGTERM (Slurm's `--signal=TERM@<s>` sends it ahead of the time limit)
and kills what is left after a grace period: Slurm's KillWait, `docker stop -t`, the pod's
terminationGracePeriodSeconds. The entrypoint passes SIGTERM on to every training process
and gives them GRACE_PERIOD seconds (keep it under the platform's) before SIGKILL.
By default Python ends at SIGTERM, and the steps since the last checkpoint are lost. With

    from disttrain import preemption
    from disttrain import torch as dt

    preemption.catch()                   # from here on, SIGTERM asks the loop to stop
    for step in range(start, steps):
        ...one step...
        if dt.stop_requested():          # every rank, the same step
            checkpoint.save(state, step + 1, ...)
            dt.finish(preemption.exit_code())   # exit 143, as the signal would have

the loop finishes its step, checkpoints, and the job resumes from there when it is
restarted or requeued (same RUN_ID and CHECKPOINT_DIR). The signal reaches the ranks at
different steps (the nodes hear of it one after the other), so the ranks agree on the step:
`dt.stop_requested()` is one all-reduce of one number per call; `requested()` here is this
process's own flag, for code with one process or its own agreement.
"""

from __future__ import annotations

import signal
import sys

EXIT_CODE = 128 + signal.SIGTERM
_state: dict = {"signal": None, "said": False}


def catch() -> None:
    """SIGTERM (and SIGINT) set the flag instead of ending the process. Call it early, in
    every rank, before the first step."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _record)


def _record(signum: int, _frame) -> None:
    _state["signal"] = signum               # only this: a handler that writes could interrupt a write


def requested() -> bool:
    """Whether this process was asked to stop (said once on stderr when it first was)."""
    signum = _state["signal"]
    if signum is not None and not _state["said"]:
        _state["said"] = True
        print(f"PREEMPTION signal {signal.Signals(signum).name}: checkpointing at this step boundary",
              file=sys.stderr, flush=True)
    return signum is not None


def exit_code() -> int:
    """What the signal would have ended the process with: 128 + its number."""
    return 128 + (_state["signal"] or signal.SIGTERM)


def leave() -> None:
    """End the process as the signal would have (exit_code()). A PyTorch job ends with
    disttrain.torch.finish(preemption.exit_code()) instead: the group torn down, no
    interpreter teardown."""
    sys.stdout.flush()
    sys.exit(exit_code())
