"""LAUNCHER=horovod with MIN_NODES/MAX_NODES: elastic Horovod (hvd.elastic) without SSH or
horovodrun. Horovod's ElasticDriver runs on the master (elastic_driver.py) and orders
workers through the job store; every node's entrypoint starts the ones ordered for it,
with the same Horovod environment builders as fixed-size jobs (horovod.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ...running.specs import ProcessSpec
from ..base import Launcher
from .fixed import ServesOnHorovodPort, node_env


@dataclass(frozen=True)
class HorovodElastic(ServesOnHorovodPort, Launcher):
    """hvd.elastic: workers are started on demand by Horovod's ElasticDriver on the master."""
    serves = False             # its driver serves its own rendezvous; the nodes exchange nothing
    transport = "Horovod over Gloo"

    def describe(self) -> str:
        c = self.config
        return (f"Horovod elastic, no SSH: Horovod's ElasticDriver on the master, {c.min_nodes}:"
                f"{c.max_nodes} nodes from the job store; the job goes on without any worker, not "
                f"without the master, where the driver lives (docs/rendezvous.md)")

    def open_despite_secret(self) -> list[str]:
        return ["the workers' notification services, which Horovod's driver calls on each node (they check "
                "Horovod's HMAC key)"]

    def serve(self, plan, nodes, store, log):
        from .elastic_driver import HorovodElasticDriver

        driver = HorovodElasticDriver(store, plan, log)
        driver.start()
        return driver

    def processes(self, plan, placement) -> list[ProcessSpec]:
        return []                  # Horovod's ElasticDriver orders them, one at a time

    def ordered(self, plan, placement, order_env: dict[str, str],
                rendezvous: tuple[str, int] | None = None) -> ProcessSpec:
        """One worker the driver ordered for this node: the slot's environment (the driver's)
        on top of what this node gives every Horovod worker; `rendezvous`, this node's own
        way to the driver's rendezvous where it differs from the driver's address (behind
        JOB_SECRET: the master's loopback port, another node's tunnel to the Gate)."""
        env = {**plan.env, **node_env(placement.iface, placement.node_rank), **order_env}
        if rendezvous is not None:
            addr, port = rendezvous
            env.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=addr, HOROVOD_GLOO_RENDEZVOUS_PORT=str(port))
        return ProcessSpec(f"rank {env['HOROVOD_RANK']}", self.script(plan.python), env)

    def runner(self, plan, job, base_env, log, signals):
        from ...health.watching import watching
        from .elastic_driver import HorovodElasticNode

        log.say(f"running Horovod workers as the driver asks: {self.describe()}")
        return HorovodElasticNode(job.store, plan, job.placement, base_env, log, signals,
                                  watching(job, serverless=False, worker_links=True))
