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

Keys (RoundKeys):

    rounds           counter: training rounds reported by the processes
    round/<n>        {"world": W, "step": S}: round n's world size and the step it resumed
                     from, written by global rank 0 through disttrain.elastic
    lost             counter: nodes the master found silent
    lost/<n>         {"node": k, "since": T}: node k, silent since wall-clock time T
"""

from __future__ import annotations

import json

from ..running import reaper
from ..running.log import Log
from ..store.transport import JobStore, StoreGone, read_json


class RoundKeys:
    def __init__(self, store: JobStore):
        self.store = store

    def rounds(self) -> int:
        return self.store.add("rounds", 0)

    def round(self, n: int) -> dict | None:
        return read_json(self.store, f"round/{n}")

    def report_lost(self, node: int, since: float) -> None:
        n = self.store.add("lost", 1)
        self.store.set(f"lost/{n}", json.dumps({"node": node, "since": since}))

    def losses(self) -> int:
        return self.store.add("lost", 0)

    def loss(self, n: int) -> dict | None:
        return read_json(self.store, f"lost/{n}")


class Rounds:
    def __init__(self, store: JobStore, log: Log, token: str | None = None, agent_in_process: bool = False):
        self.keys, self.log, self.token = RoundKeys(store), log, token
        self.agent_in_process = agent_in_process
        self._round, self._world, self._losses = 0, None, 0
        try:
            # A node that joins a running job follows from its own round on.
            self._round = self.keys.rounds()
            last = self.keys.round(self._round) if self._round else None
            self._world = last["world"] if last else None
            self._losses = self.keys.losses()
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
        while self._round < self.keys.rounds():
            data = self.keys.round(self._round + 1)
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
        while self._losses < self.keys.losses():
            loss = self.keys.loss(self._losses + 1)
            if loss is None:
                return
            self._losses += 1
            stale = reaper.stale(self.token, before=loss["since"], spare_children=not self.agent_in_process)
            if stale:
                self.log.say(f"node {loss['node']} was lost without a connection reset: restarting "
                             f"{len(stale)} training process(es) still waiting for it")
                reaper.end(stale)
