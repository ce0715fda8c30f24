"""Judging progress: which ranks hang, what the dump says about them, who straggles. Pure.

A rank hangs once it has gone HANG_TIMEOUT seconds without a step or any other progress
(disttrain/progress.py), counted from its first one. When some do, every rank's stack is
dumped and `diagnose` writes the one line: the ranks that are not waiting in a collective
(in the user's code, or silent) are the ones that stalled; the others wait for them. When
every rank waits in a collective, no rank is to blame: the network or a peer is.

A straggler is a rank whose own work per step (PyTorch: the time from its step's end to
its next backward pass; elsewhere its step time) stays above STRAGGLER_FACTOR times the
median of the other ranks' for STRAGGLER_WINDOW seconds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .progress import RankProgress
from .stacks import Where


def key(rank: RankProgress) -> tuple[int, int]:
    return (rank.node, rank.pid)


def named(rank: RankProgress) -> str:
    return f"{rank.name} (node {rank.node} on {rank.host})"


def past_timeout(ranks: list[RankProgress], timeout_s: float, quiet_s: float | None = None) -> list[RankProgress]:
    """The ranks without progress for longer than timeout_s; `quiet_s`: seconds since the
    last incident (progress older than that is not counted again)."""
    if timeout_s <= 0:
        return []
    return [r for r in ranks if min(r.idle_s, quiet_s if quiet_s is not None else r.idle_s) > timeout_s]


@dataclass(frozen=True)
class Diagnosis:
    line: str
    stalled_nodes: tuple[int, ...]        # the nodes of the ranks that stalled (not waiting in a collective)
    every_rank_waits: bool


def _steps(ranks: list[RankProgress]) -> str:
    low, high = min(r.steps for r in ranks), max(r.steps for r in ranks)
    return f"step {low}" if low == high else f"steps {low}-{high}"


def _names(ranks: list[RankProgress]) -> str:
    if len(ranks) == 1:
        return named(ranks[0])
    nodes = sorted({r.node for r in ranks})
    where = f"node {nodes[0]}" if len(nodes) == 1 else "nodes " + ", ".join(map(str, nodes))
    return "ranks " + ", ".join(r.name.removeprefix("rank ") for r in ranks) + f" ({where})"


def diagnose(ranks: list[RankProgress], wheres: dict[tuple[int, int], Where | None], timeout_s: float,
             silent_nodes: tuple[int, ...] = (), stacks_at: str = "") -> Diagnosis:
    """The line for a hang: `wheres` has each rank's Where (None: its process gave no stack);
    `silent_nodes`: nodes that sent no stacks at all."""
    idle = max(r.idle_s for r in ranks) if ranks else timeout_s
    stalled = [r for r in ranks if (w := wheres.get(key(r))) is None or w.collective is None]
    waiting = [r for r in ranks if r not in stalled]
    parts: list[str] = []
    if ranks and not stalled and not silent_nodes:
        groups = sorted({wheres[key(r)].describe() for r in waiting})
        head = (f"every rank ({len(ranks)}) has made no progress for {idle:.0f}s (HANG_TIMEOUT={timeout_s:g}) "
                f"after {_steps(ranks)}, all waiting in a collective: {'; '.join(groups)}; the network or a "
                f"peer outside these ranks is stuck, not one rank")
        parts.append(head)
    else:
        parts.append(f"no progress for {idle:.0f}s (HANG_TIMEOUT={timeout_s:g})")
        for r in stalled:
            w = wheres.get(key(r))
            doing = w.describe() if w else "gave no stack (its process did not answer)"
            parts.append(f"{named(r)} stalled after step {r.steps}: it {doing}")
        by_where: dict[str, list[RankProgress]] = {}
        for r in waiting:
            by_where.setdefault(wheres[key(r)].describe(), []).append(r)
        for text, group in sorted(by_where.items()):
            verb = "waits" if len(group) == 1 else "wait"
            parts.append(f"{_names(group)} {text.replace('waits', verb, 1)} after {_steps(group)}")
        for node in silent_nodes:
            parts.append(f"node {node} sent no stacks")
    if stacks_at:
        parts.append(f"stacks: {stacks_at}")
    nodes = tuple(sorted({r.node for r in stalled} | set(silent_nodes)))
    return Diagnosis(line="; ".join(parts), stalled_nodes=nodes, every_rank_waits=bool(ranks) and not nodes)


def own_work(rank: RankProgress, everyone_has_compute: bool) -> float | None:
    return rank.compute_time if everyone_has_compute else rank.step_time


class Stragglers:
    """Remembers since when each rank has been behind; says a line when the set changes."""

    def __init__(self, factor: float, window_s: float):
        self.factor, self.window_s = factor, window_s
        self._behind_since: dict[tuple[int, int], float] = {}
        self._reported: tuple[tuple[int, int], ...] = ()
        self.behind: str | None = None           # who is behind now, as the last line said (None: nobody)

    def observe(self, ranks: list[RankProgress], now: float) -> str | None:
        if self.factor <= 0:
            return None
        compute = all(r.compute_time is not None for r in ranks)
        figures = {key(r): own_work(r, compute) for r in ranks}
        behind, medians = [], {}
        for r in ranks:
            figure = figures[key(r)]
            others = [f for k, f in figures.items() if k != key(r) and f is not None]
            median = medians[key(r)] = statistics.median(others) if others else None
            if median and figure is not None and figure > self.factor * median:
                since = self._behind_since.setdefault(key(r), now)
                if now - since >= self.window_s:
                    behind.append((r, figure))
            else:
                self._behind_since.pop(key(r), None)
        reported = tuple(key(r) for r, _ in behind)
        if reported == self._reported:
            return None
        was = self._reported
        self._reported = reported
        what = "its own work (forward and data) per step" if compute else "per step"
        if not behind:
            self.behind = None
            return f"straggler: none now ({len(was)} rank(s) caught up)"
        self.behind = "; ".join(
            f"{named(r)} takes {figure:.3f}s {what}, {figure / medians[key(r)]:.1f}x the others' median "
            f"{medians[key(r)]:.3f}s, for {now - self._behind_since[key(r)]:.0f}s" for r, figure in behind)
        return f"straggler: {self.behind}"
