"""How often a waiting node looks at torch's rendezvous again: a tenth of a second for a
job of up to 20 nodes, rather than torch's fixed second.

torch's dynamic rendezvous waits for a change of its state (a node joined, a dead node's
keep-alive ran out, the last call's deadline passed, the round completed) by reading the
state again after `_delay(seconds=1)` in its operation loop, and its state holder serves a
cached copy for a second (`cache_duration`). A recovery pays that second up to three times
in a row: the survivor sees the dead node dropped, closes the round after the last call,
and every other survivor sees the round complete. A second a read also bounds the store's
load: one read a second per waiting node. Here each waiting node reads every
`pace(max_nodes)` seconds, so that every waiting node together still read at most about
READS_PER_S times a second (torch's own pace from 200 nodes up).

A node also beats BEATS times per `ELASTIC_DEAD_AFTER` rather than once a keep-alive
interval of a whole second. torch writes a heartbeat only once the last one is at least an
interval old, when its timer fires every interval: one tick in two finds it a few
milliseconds too young, so heartbeats land every one or two intervals. With an interval of
1 s and a node dropped after 2 (`ELASTIC_DEAD_AFTER=2`), a heartbeat a little late on a
busy machine got a live node dropped, and then for good: its own copy of the state no
longer names it, so it never beats again. Every node of a job did that right after its
rendezvous, so a lost node was already gone (recovery looked fast) and a joining node found
no one and formed a round alone. At a quarter of `ELASTIC_DEAD_AFTER`, a heartbeat is at
most half of it old.

A round that re-forms (after a failure, or to take in a joining node) completes as soon
as every live node is in it, rather than waiting out `ELASTIC_LAST_CALL`. The last call is
for nodes that start at about the same time: at the job's first round it stays. Later, a
node that is alive has a heartbeat in the state (the survivors of the last round beat
while they train, a joining node from the moment it waits): once each of them is a
participant, no one else is coming, and the survivors of a lost node waited that second or
two for no one. A node that starts later still joins as it would after the last call: it
waits for the next round, and the others restart to take it in.

For that, a node keeps its heartbeat when it leaves a complete round for the next one.
torch's `next_rendezvous` runs two operations, each its own compare-and-set: an exit that
removes the node from the round's participants and its heartbeat with them, then a join.
Between the two the node looked gone, and another node waiting in the re-forming round
could find itself alone and complete the round without it (a test saw it 1 run in about
10). With its heartbeat kept, the node counts as alive until it has joined; one that dies
in between ages out as any silent node does, `ELASTIC_DEAD_AFTER` later.

torch's own loop, state holder and timer are kept; only the wait, the cache's age, the
keep-alive interval and the join's last call change, on the handler this process made (the
delay and the join are module-wide: one agent per process).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

READS_PER_S = 200.0
BEATS = 4
FASTEST_S = 0.1
TORCH_S = 1.0


def pace(max_nodes: int) -> float:
    """Seconds between a waiting node's reads of the rendezvous state."""
    return min(TORCH_S, max(FASTEST_S, max_nodes / READS_PER_S))


def keep_pace(handler, max_nodes: int) -> float:
    """Make torch's DynamicRendezvousHandler `handler` wait `pace(max_nodes)` between reads.
    Returns the pace; TORCH_S (nothing changed) for a handler or a torch without these
    internals."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    holder = getattr(handler, "_state_holder", None)
    delay = getattr(dr, "_delay", None)
    if holder is None or not hasattr(holder, "_cache_duration") or delay is None:
        return TORCH_S
    every = pace(max_nodes)
    holder._cache_duration = every
    torch_delay = getattr(delay, "torch_delay", delay)

    def _delay(seconds: float | tuple[float, float]) -> None:
        """torch's one-second poll at this pace; its other delays (a join's random skew) as they are."""
        torch_delay(every if seconds == TORCH_S else seconds)

    _delay.torch_delay = torch_delay
    dr._delay = _delay
    return every


def beat_often(handler) -> float:
    """Make torch's DynamicRendezvousHandler `handler` beat BEATS times within the time after
    which a silent node is dropped (interval x attempts, kept). Returns the new interval in
    seconds; 0 (nothing changed) for a handler without these internals."""
    settings = getattr(handler, "_settings", None)
    holder = getattr(handler, "_state_holder", None)
    executor = getattr(handler, "_op_executor", None)
    if settings is None or not hasattr(settings, "keep_alive_interval") or holder is None or executor is None:
        return 0.0
    dead_after = settings.keep_alive_interval * settings.keep_alive_max_attempt
    beating = replace(settings, keep_alive_interval=dead_after / BEATS, keep_alive_max_attempt=BEATS)
    handler._settings = holder._settings = executor._settings = beating
    return beating.keep_alive_interval / timedelta(seconds=1)


def everyone_here(state, settings) -> bool:
    """Whether torch's rendezvous `state`, open and past its minimum, holds every live node
    as a participant: none waits for the next round, and every node with a heartbeat (but
    those beyond max_nodes, which no round takes) has joined this one."""
    live = set(state.last_heartbeats) - set(state.redundancy_list)
    return (not state.complete and not state.closed and state.deadline is not None and not state.wait_list
            and settings.min_nodes <= len(state.participants) <= settings.max_nodes
            and live <= set(state.participants))


def reform_at_once() -> bool:
    """Make torch's join complete a round as soon as everyone_here(), for a node that has
    been in a complete round before (the first round keeps its last call), and a node that
    leaves a complete round keep its heartbeat (alive, on its way to the next). False
    (nothing changed) for a torch without this join and executor."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    torch_join = getattr(dr, "_RendezvousJoinOp", None)
    actions = getattr(dr, "_Action", None)
    executor = getattr(dr, "_DistributedRendezvousOpExecutor", None)
    if (torch_join is None or actions is None or not hasattr(actions, "MARK_RENDEZVOUS_COMPLETE")
            or not hasattr(executor, "_remove_from_participants") or not hasattr(executor, "_keep_alive")):
        return False
    torch_join = getattr(torch_join, "torch_join", torch_join)
    torch_remove = getattr(executor._remove_from_participants, "torch_remove", executor._remove_from_participants)

    def _remove_from_participants(self) -> None:
        """torch's removal; from a complete round (torch's exit, before its join), the
        node's heartbeat stays, fresh."""
        leaving_complete_round = self._state.complete
        torch_remove(self)
        if leaving_complete_round:
            self._keep_alive()

    _remove_from_participants.torch_remove = torch_remove
    executor._remove_from_participants = _remove_from_participants
    formed: set = set()          # this process's nodes that have been in a complete round

    class ReformingJoin(torch_join):
        """torch's join; a node that waits in a re-forming round completes it once everyone_here()."""

        def __call__(self, ctx, deadline):
            action = super().__call__(ctx, deadline)
            if action is actions.FINISH:
                formed.add(ctx.node)
            elif (action is actions.SYNC and ctx.node in formed and ctx.node in ctx.state.participants
                  and everyone_here(ctx.state, ctx.settings)):
                return actions.MARK_RENDEZVOUS_COMPLETE
            return action

    ReformingJoin.torch_join = torch_join
    dr._RendezvousJoinOp = ReformingJoin
    return True
