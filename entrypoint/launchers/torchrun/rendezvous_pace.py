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

torch's own loop and state holder are kept; only the wait and the cache's age change, on
the handler this process made (the delay is module-wide: one agent per process).
"""

from __future__ import annotations

READS_PER_S = 200.0
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
