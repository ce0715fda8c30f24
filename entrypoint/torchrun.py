"""Everything the entrypoint tells torchrun, as one typed value: the seam to torch's agent.

plan.py decides a TorchrunLaunch (pure); `argv` renders it as the command line of a
torchrun subprocess, which the supervisor runs. Each field is one of torchrun's options
(torch.distributed.run) and, equally, one of torch.distributed.launcher.api.LaunchConfig's,
so torch's elastic agent could run from the same value inside the entrypoint instead.

The rendezvous settings (rdzv_conf) decide how fast an elastic job notices a change:

    last_call_timeout       after MIN_NODES joined, how long a round waits for more (30 s in
                            torchrun; ELASTIC_LAST_CALL here)
    keep_alive_interval,    a node is dropped from the rendezvous after interval x attempts
    keep_alive_max_attempt  without a keep-alive (5 s x 3 in torchrun; 1 s x ELASTIC_DEAD_AFTER
                            here). Survivors of a lost node wait this long before re-forming.
    join_timeout            how long a round may take to form (RDZV_TIMEOUT)
"""

from __future__ import annotations

from dataclasses import dataclass

# The agent checks its workers and the rendezvous's waiting nodes this often (seconds);
# torch's default since 2.3, written out because older torch defaulted to 5 s.
MONITOR_INTERVAL_S = 0.1
KEEP_ALIVE_INTERVAL_S = 1


@dataclass(frozen=True)
class TorchrunLaunch:
    nproc_per_node: int
    run_id: str
    max_restarts: int
    script: str                               # a .py runs with torchrun's interpreter; else --no-python
    args: tuple[str, ...]
    env: dict[str, str]                       # on top of the container's environment
    standalone: bool = False                  # one node: torchrun's own store on a free local port
    nnodes: str = "1"                         # "N", or "MIN:MAX" for an elastic job
    rdzv_endpoint: str | None = None          # the job store (c10d, is_host=0)
    rdzv_conf: tuple[tuple[str, int], ...] = ()
    local_addr: str | None = None             # where the other nodes reach this one
    monitor_interval: float = MONITOR_INTERVAL_S

    @property
    def elastic(self) -> bool:
        return ":" in self.nnodes

    def argv(self, python: str) -> tuple[str, ...]:
        argv = [python, "-m", "torch.distributed.run", f"--nproc-per-node={self.nproc_per_node}", "--tee=3",
                f"--max-restarts={self.max_restarts}", f"--monitor-interval={self.monitor_interval:g}",
                f"--rdzv-id={self.run_id}"]
        if self.standalone:
            argv.append("--standalone")
        else:
            conf = ",".join(f"{key}={value}" for key, value in self.rdzv_conf)
            argv += [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.rdzv_endpoint}",
                     f"--rdzv-conf={conf}"]
            if self.local_addr:
                argv.append(f"--local-addr={self.local_addr}")
        argv += [self.script] if self.script.endswith(".py") else ["--no-python", self.script]
        return (*argv, *self.args)


def rendezvous_conf(timeout_s: int, elastic: bool, last_call_s: int, dead_after_s: int) -> tuple[tuple[str, int], ...]:
    """torchrun's c10d settings on the job store. The store is the master entrypoint's
    (is_host=0), so it outlives any one torchrun."""
    conf = [("is_host", 0), ("join_timeout", timeout_s), ("read_timeout", timeout_s)]
    if elastic:
        conf += [("last_call_timeout", last_call_s), ("keep_alive_interval", KEEP_ALIVE_INTERVAL_S),
                 ("keep_alive_max_attempt", max(1, dead_after_s // KEEP_ALIVE_INTERVAL_S))]
    return tuple(conf)
