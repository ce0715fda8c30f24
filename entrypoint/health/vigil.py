"""Hangs and stragglers, found while a node's processes run, without touching the script.

Every node has a Vigil over its own ranks (progress.py: the files its processes write) and
answers a hang with their stacks. The node that decides (the master, or the one node of a
local job) has a Decider: once a second it looks at every rank of the job, logs stragglers
(hangs.py), writes the status (disttrain/status.py), and when a rank goes HANG_TIMEOUT seconds without
progress it runs an incident:

1. it announces the incident (job/hang) and dumps its own ranks' stacks; every other node,
   at its next check, dumps its ranks' stacks (into its log, and into
   CHECKPOINT_DIR/diagnostics/<incident>/node<k>.txt) and answers where each rank is;
2. once every node has answered (or STACKS_WAIT_S passed) it writes the one line
   (hangs.diagnose) and ends the job: Outcome.hung, exit 124 on every node; an elastic job
   instead tells the stalled worker nodes to leave, and goes on without them.

JobWatch (watch.py) runs this for multi-node jobs; LocalWatch here for one node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..contract.config import Config
from ..running import rank_lines
from ..running.log import Log
from ..running.outcome import Outcome
from .hangs import Stragglers, diagnose, named, past_timeout
from .progress import ProgressFolder, RankProgress
from .stacks import Where, shown, where
from disttrain import status as job_status
DIAGNOSTICS = "diagnostics"
STACKS_WAIT_S = 10.0         # how long the decider waits for the other nodes' stacks (Python, then native)


def library_roots() -> tuple[str, ...]:
    """Where code that is not the user's lives: the standard library, site-packages, the image's own."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    app = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # above entrypoint/
    roots |= {os.path.join(app, "entrypoint"), os.path.join(app, "disttrain")}
    return tuple(sorted(r.rstrip("/") + "/" for r in roots))


NATIVE_TIMEOUT_S = 5.0          # py-spy, per process (they run side by side)


def native_stacks(pids: list[int]) -> dict[int, tuple[str, str]]:
    """Each process's native and Python frames from py-spy, where the image has it and the
    container lets it attach (ptrace and process_vm_readv: Docker's default profile allows
    both on kernels >= 4.8; elsewhere --cap-add SYS_PTRACE): pid -> (the dump, or '', and
    why not). Empty without py-spy."""
    spy = shutil.which("py-spy")
    if not spy or not pids:
        return {}

    def dump(pid: int) -> tuple[str, str]:
        try:
            run = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                                 timeout=NATIVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "", f"py-spy did not finish within {NATIVE_TIMEOUT_S:g}s"
        if run.returncode == 0:
            return run.stdout, ""
        why = (run.stderr.strip().splitlines() or ["py-spy failed"])[-1]
        if "permit" in why.lower() or "ptrace" in why.lower():
            why += (" (the container must allow ptrace and process_vm_readv, for example --cap-add SYS_PTRACE; "
                    "the Python stacks need nothing)")
        return "", why

    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        return dict(zip(pids, pool.map(dump, pids)))


def incident_id() -> str:
    return time.strftime("hang-%Y%m%dT%H%M%SZ", time.gmtime())


class Vigil:
    """This node's ranks: their progress, and their stacks when the job hangs."""

    def __init__(self, config: Config, node: int, log: Log, folder: ProgressFolder):
        self.config, self.node, self.log, self.folder = config, node, log, folder
        self.folder.node = node
        self.answered: set[str] = set()

    def ranks(self) -> list[RankProgress]:
        return self.folder.read()

    def diagnostics_dir(self, incident: str) -> str:
        return os.path.join(self.config.checkpoint_dir, DIAGNOSTICS, incident)

    def answer(self, incident: str) -> dict:
        """Dump every rank's stack into the log and the diagnostics folder; where each is."""
        self.answered.add(incident)
        ranks = self.ranks()
        dumps = self.folder.dump_stacks([r.pid for r in ranks])
        roots = library_roots()
        report, text = {"ranks": []}, []
        for r in ranks:
            dump = dumps.get(r.pid, "")
            place = where(dump, roots) if dump.strip() else None
            lines = shown(dump) or ["(no stack: the process did not answer)"]
            head = f"stack of {named(r)}, pid {r.pid}, {r.steps} step(s), idle {r.idle_s:.0f}s:"
            own = rank_lines.prefix(r.name)
            for line in [head, *lines]:
                self.log.line(own + line)
            text += [head, *lines, ""]
            report["ranks"].append({"progress": r.to_dict(), "where": place.to_dict() if place else None})
        native = native_stacks([r.pid for r in ranks])
        for r in ranks:
            dump, note = native.get(r.pid, ("", ""))
            text += [f"native stack of {named(r)}, pid {r.pid} (py-spy dump --native):", dump, ""] if dump else []
        notes = sorted({note for _, note in native.values() if note})
        folder = self.diagnostics_dir(incident)
        path = os.path.join(folder, f"node{self.node}.txt")
        if native and any(dump for dump, _ in native.values()):
            self.log.say(f"native stacks (py-spy) of this node's ranks: in {path}")
        for note in notes:
            self.log.say(f"no native stacks: {note}")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(path, "w") as f:
                f.write("\n".join(text) + "\n")
        except OSError as exc:
            self.log.say(f"could not write the stacks under CHECKPOINT_DIR={self.config.checkpoint_dir}: "
                         f"{exc.strerror or exc}; they are in this log")
        return report


@dataclass
class Incident:
    id: str
    started: float
    ranks: list[RankProgress]                      # every rank of the job when it began
    reports: dict[int, dict] = field(default_factory=dict)


class Decider:
    """On the master (or the one node): judges the whole job's progress once a second."""

    def __init__(self, config: Config, log: Log, vigil: Vigil, role: str):
        self.config, self.log, self.vigil, self.role = config, log, vigil, role
        self.stragglers = Stragglers(config.straggler_factor, config.straggler_window)
        self.status_path = job_status.default_path()
        self._last_incident: float | None = None
        self.incident: Incident | None = None

    def observe(self, ranks: list[RankProgress], heartbeat_ages: dict[int, float]) -> list[RankProgress]:
        """Stragglers and the status; returns the ranks past HANG_TIMEOUT (none during an incident)."""
        now = time.monotonic()
        line = self.stragglers.observe(ranks, now)
        if line:
            self.log.say(line)
        job_status.write(self.status_path, self.snapshot(ranks, heartbeat_ages))
        if self.incident is not None:
            return []
        quiet = None if self._last_incident is None else now - self._last_incident
        return past_timeout(ranks, self.config.hang_timeout, quiet)

    def snapshot(self, ranks, heartbeat_ages) -> dict:
        return job_status.snapshot(self.role, self.vigil.node, ranks, heartbeat_ages, self.stragglers.behind,
                                   self.config.hang_timeout)

    def show_status(self) -> None:
        current = job_status.read(self.status_path)
        for line in job_status.table(current) if current else ["status: nothing yet"]:
            self.log.say(line)

    def begin(self, ranks: list[RankProgress]) -> Incident:
        self.incident = Incident(incident_id(), time.monotonic(), ranks)
        self.incident.reports[self.vigil.node] = self.vigil.answer(self.incident.id)
        return self.incident

    def conclude(self, expected_nodes: list[int]) -> tuple[str, tuple[int, ...]] | None:
        """The diagnosis once every expected node answered or the wait is over, else None."""
        inc = self.incident
        missing = [k for k in expected_nodes if k not in inc.reports]
        if missing and time.monotonic() - inc.started < STACKS_WAIT_S:
            return None
        wheres: dict[tuple[int, int], Where | None] = {}
        ranks: list[RankProgress] = []
        for node in sorted(inc.reports):
            for entry in inc.reports[node]["ranks"]:
                r = RankProgress.from_dict(entry["progress"])
                ranks.append(r)
                wheres[(r.node, r.pid)] = Where.from_dict(entry["where"]) if entry["where"] else None
        ranks += [r for r in inc.ranks if r.node in missing]
        diagnosis = diagnose(ranks, wheres, self.config.hang_timeout, silent_nodes=tuple(missing),
                             stacks_at=self.vigil.diagnostics_dir(inc.id))
        self.incident, self._last_incident = None, time.monotonic()
        return diagnosis.line, diagnosis.stalled_nodes


class LocalWatch:
    """One node: no job store; the node decides about its own ranks."""
    has_peers = False

    def __init__(self, config: Config, log: Log, folder: ProgressFolder):
        self.vigil = Vigil(config, 0, log, folder)
        self.decider = Decider(config, log, self.vigil, "local")

    def check(self) -> Outcome | None:
        past = self.decider.observe(self.vigil.ranks(), {})
        if not past:
            return None
        self.decider.begin(self.vigil.ranks())
        line, _ = self.decider.conclude([0])
        return Outcome.hung(line)

    def stopping(self, signum: int) -> Outcome:
        return Outcome.stopped(signum)

    def cause_of(self, failure: Outcome) -> Outcome:
        return failure                   # no other node to have caused it

    def show_status(self) -> None:
        self.decider.show_status()
