"""The hang protocol across nodes: every node publishes its ranks' progress with its
heartbeat and answers a hang with its stacks; the master judges the whole job (vigil.py's
Decider) and, in an elastic job, may send the stalled nodes away. It runs as the job
watch's PeerCheck (job/watch.py), once a second. Keys (HangKeys):

    node/<k>/progress  node k's ranks' progress (a list of progress.RankProgress records)
    job/hang           the master found a hang: {"id": ...}: every node dumps its stacks
    hang/<id>/<k>      node k's answer: per rank, where its main thread is (vigil.py)
    hang/<id>/verdict  elastic: {"line": ..., "leave": [k, ...]}: the stalled nodes leave
"""

from __future__ import annotations

import json

from ..contract.config import Config
from ..job.watch import JobWatch
from ..running.log import Log
from ..running.outcome import Outcome
from ..store.transport import JobStore, read_json
from .progress import RankProgress
from .vigil import Decider, Vigil


class HangKeys:
    def __init__(self, store: JobStore):
        self.store = store

    def publish_progress(self, node: int, ranks: list[dict]) -> None:
        self.store.set(f"node/{node}/progress", json.dumps(ranks))

    def progress(self, node: int) -> list[dict]:
        return read_json(self.store, f"node/{node}/progress") or []

    def announce_hang(self, incident: dict) -> None:
        self.store.set("job/hang", json.dumps(incident))

    def hang(self) -> dict | None:
        return read_json(self.store, "job/hang")

    def report_stacks(self, incident: str, node: int, report: dict) -> None:
        self.store.set(f"hang/{incident}/{node}", json.dumps(report))

    def stacks(self, incident: str, node: int) -> dict | None:
        return read_json(self.store, f"hang/{incident}/{node}")

    def announce_verdict(self, incident: str, verdict: dict) -> None:
        self.store.set(f"hang/{incident}/verdict", json.dumps(verdict))

    def verdict(self, incident: str) -> dict | None:
        return read_json(self.store, f"hang/{incident}/verdict")


class HangProtocol:
    """This node's part: a worker reports and answers; the master decides."""

    def __init__(self, store: JobStore, config: Config, node_rank: int, log: Log, vigil: Vigil):
        self.keys, self.config, self.rank, self.log, self.vigil = HangKeys(store), config, node_rank, log, vigil
        self.decider = Decider(config, log, vigil, "master") if node_rank == 0 else None
        self._verdicts: set[str] = set()

    def check(self, watch: JobWatch) -> Outcome | None:
        return self._judge(watch) if self.decider else self._report()

    def _report(self) -> Outcome | None:
        """A worker: publish its ranks' progress; answer a hang with their stacks; leave an
        elastic job when the master says its ranks stalled."""
        self.keys.publish_progress(self.rank, [r.to_dict() for r in self.vigil.ranks()])
        hang = self.keys.hang()
        if hang is None:
            return None
        if hang["id"] not in self.vigil.answered:
            self.keys.report_stacks(hang["id"], self.rank, self.vigil.answer(hang["id"]))
        if self.config.elastic and hang["id"] not in self._verdicts:
            verdict = self.keys.verdict(hang["id"])
            if verdict is not None:
                self._verdicts.add(hang["id"])
                if self.rank in verdict["leave"]:
                    return Outcome.left_hung(verdict["line"])
                self.log.say(f"hang: {verdict['line']}")
        return None

    def _judge(self, watch: JobWatch) -> Outcome | None:
        """The master: stragglers and status; a hang's incident, from its start to its line."""
        workers = watch.live_workers()
        decider = self.decider
        if decider.incident is None:
            ranks = self.vigil.ranks() + [RankProgress.from_dict(d) for k in workers for d in self.keys.progress(k)]
            ages = {k: a for k in [0, *workers] if (a := watch.heartbeats.age(k)) is not None}
            ages[0] = 0.0
            past = decider.observe(ranks, ages)
            if past:
                incident = decider.begin(ranks)
                self.keys.announce_hang({"id": incident.id})
                self.log.say(f"no progress from {', '.join(r.name for r in past)} for HANG_TIMEOUT="
                             f"{self.config.hang_timeout}s: every node dumps its ranks' stacks")
            return None
        incident = decider.incident
        for k in workers:
            if k not in incident.reports and (report := self.keys.stacks(incident.id, k)) is not None:
                incident.reports[k] = report
        concluded = decider.conclude([0, *workers])
        if concluded is None:
            return None
        line, stalled = concluded
        if self.config.elastic and stalled and 0 not in stalled:
            self.keys.announce_verdict(incident.id, {"line": line, "leave": list(stalled)})
            self.log.say(f"hang: {line}; node(s) {', '.join(map(str, stalled))} leave, and the job goes on "
                         f"without them")
            return None
        return Outcome.hung(line)

    def show_status(self) -> None:
        if self.decider:
            self.decider.show_status()
            return
        for r in self.vigil.ranks():
            self.log.say(f"status: {r.name} pid {r.pid}: {r.steps} step(s), idle {r.idle_s:.0f}s "
                         f"(the master has the whole job's view)")
