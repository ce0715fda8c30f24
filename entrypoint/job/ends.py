"""How the job ends, in the job store (finish.py and watch.py decide what it means). Keys:

    node/<k>/exit    node k's Outcome (JSON), when its processes are done
    job/abort        the Outcome that ends the job on every node (the first reason wins)
    job/done         the master saw every node finish; workers may leave
    node/<k>/left    worker k saw job/done and exits now (the master exits after it)
"""

from __future__ import annotations

from ..running.outcome import Outcome
from ..store.transport import JobStore, StoreGone, read


class Ends:
    def __init__(self, store: JobStore):
        self.store = store

    def set_exit(self, rank: int, outcome: Outcome) -> None:
        self.store.set(f"node/{rank}/exit", outcome.to_json())

    def exit(self, rank: int) -> Outcome | None:
        return read(self.store, f"node/{rank}/exit", Outcome.from_json)

    def abort(self, outcome: Outcome) -> None:
        """Record why the job ends (the first reason wins). Quiet when the store is gone
        (or was never reached): the others then find out by themselves."""
        try:
            self.store.compare_set("job/abort", "", outcome.aborting().to_json())
        except StoreGone:
            pass

    def aborted(self) -> Outcome | None:
        return read(self.store, "job/abort", Outcome.from_json)

    def mark_done(self) -> None:
        self.store.set("job/done", "1")

    def done(self) -> bool:
        return self.store.has("job/done")

    def leave(self, rank: int) -> None:
        """A worker saw job/done and exits now (the master waits for this before it does)."""
        self.store.set(f"node/{rank}/left", "1")

    def has_left(self, rank: int) -> bool:
        return self.store.has(f"node/{rank}/left")
