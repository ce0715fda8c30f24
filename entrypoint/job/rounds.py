"""What every node of an elastic job follows in the job store, besides failures:

* the training rounds the processes report (disttrain.elastic.report_round: world size and
  the step resumed from), logged as one line per membership change;
* the nodes the master found silent (lost/<n>). A node lost without a connection reset
  (its host froze, the network split) leaves the others' collectives waiting for it until
  the process group's timeout (30 minutes by default). The training processes that started
  before it went silent belong to a round that still counts on it: they are ended, and
  torchrun re-forms the job without it (one of MAX_RESTARTS). Processes started since are a
  new round's and are spared; where the loss did reset the connections, that new round has
  already formed. Only for torchrun nodes (given the node token): Horovod's elastic driver
  recovers by itself (Gloo's 30 s timeout).
"""

from __future__ import annotations

from ..running import reaper
from ..running.log import Log
from ..store.tcp import JobStore, StoreGone


class Rounds:
    def __init__(self, store: JobStore, log: Log, token: str | None = None, agent_in_process: bool = False):
        self.store, self.log, self.token = store, log, token
        self.agent_in_process = agent_in_process
        self._round, self._world, self._losses = 0, None, 0
        try:
            # A node that joins a running job follows from its own round on.
            self._round = store.rounds()
            last = store.round(self._round) if self._round else None
            self._world = last["world"] if last else None
            self._losses = store.losses()
        except StoreGone:
            pass

    @property
    def current(self) -> tuple[int, int | None]:
        """(rounds seen, the world size of the last one)."""
        return self._round, self._world

    def follow(self) -> None:
        self._log_rounds()
        if self.token:
            self._restart_stale_processes()

    def _log_rounds(self) -> None:
        while self._round < self.store.rounds():
            data = self.store.round(self._round + 1)
            if data is None:
                return               # counted but not written yet: next time
            self._round += 1
            world, step = data["world"], data["step"]
            if self._world is None:
                self.log.say(f"training: world size {world}, from step {step}")
            elif world == self._world:       # the processes restarted (a failure, a re-rendezvous), same members
                self.log.say(f"training restarted: world size {world}, resumed from step {step}")
            else:
                self.log.say(f"membership changed: world size {self._world} -> {world}, resumed from step {step}")
            self._world = world

    def _restart_stale_processes(self) -> None:
        while self._losses < self.store.losses():
            loss = self.store.loss(self._losses + 1)
            if loss is None:
                return
            self._losses += 1
            stale = reaper.stale(self.token, before=loss["since"], spare_children=not self.agent_in_process)
            if stale:
                self.log.say(f"node {loss['node']} was lost without a connection reset: restarting "
                             f"{len(stale)} training process(es) still waiting for it")
                reaper.end(stale)
