"""TensorFlow and Keras, LAUNCHER=native: TF_CONFIG for TensorFlow's own strategies.

sync: MultiWorkerMirroredStrategy, every process a worker in global-rank order.
async: ParameterServerStrategy, the chief and NUM_PS parameter servers on the master
(each with a port of its own ahead of the workers'), the workers as servers the chief
drives (disttrain.tf_server), stopped once the chief ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..running.specs import ProcessSpec, iface_env, rank_env, tagged
from .base import Launcher


@dataclass(frozen=True)
class TfConfig(Launcher):
    exchange = True

    @property
    def servers(self) -> int:
        """Server processes on the master: the chief and parameter servers (async)."""
        return 1 + self.config.num_ps if self.config.sync_mode == "async" else 0

    def ports_needed(self, master: bool) -> int:
        return self.nproc + (self.servers if master else 0)

    def describe(self) -> str:
        strategy = "ParameterServerStrategy (chief + ps on the master)" if self.config.sync_mode == "async" \
            else "MultiWorkerMirroredStrategy"
        return f"TF_CONFIG for {strategy}"

    def cluster(self, nodes) -> dict[str, list[str]]:
        """TF_CONFIG's cluster: workers in global-rank order; chief and ps on the master for async."""
        cluster: dict[str, list[str]] = {"worker": []}
        async_ = self.config.sync_mode == "async"
        for node in sorted(nodes, key=lambda n: n.node_rank):
            ports = list(node.ports)
            if async_ and node.node_rank == 0:
                cluster["chief"] = [f"{node.addr}:{ports.pop(0)}"]
                cluster["ps"] = [f"{node.addr}:{ports.pop(0)}" for _ in range(self.config.num_ps)]
            if len(ports) != node.nproc:
                raise ValueError(f"node {node.node_rank} published {len(node.ports)} ports for {node.nproc} "
                                 f"processes")
            cluster["worker"] += [f"{node.addr}:{p}" for p in ports]
        return cluster

    def processes(self, plan, placement) -> list[ProcessSpec]:
        c, node_rank = self.config, placement.node_rank
        cluster = self.cluster(placement.nodes)
        ordered = placement.ordered
        first = sum(n.nproc for n in ordered if n.node_rank < node_rank)
        world = sum(n.nproc for n in ordered)
        server = (plan.python, "-u", "-m", "disttrain.tf_server")

        def spec(label, task_type, index, argv, critical, rank):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
            env = {**plan.env, **iface_env(placement.iface), "TF_CONFIG": tf_config,
                   **rank_env(rank, world, max(rank - first, 0), self.nproc, node_rank)}
            return ProcessSpec(label, argv, env, critical)

        script, procs = self.script(plan.python), []
        if c.sync_mode == "async":
            if node_rank == 0:
                procs.append(spec("chief", "chief", 0, script, True, 0))
                procs += [spec(f"ps {i}", "ps", i, server, False, 0) for i in range(c.num_ps)]
            procs += [spec(f"worker {first + i}", "worker", first + i, server, False, first + i)
                      for i in range(self.nproc)]
        else:
            procs += [spec(f"rank {first + i}", "worker", first + i, script, True, first + i)
                      for i in range(self.nproc)]
        return tagged(procs, c.launcher)
