"""SIGTERM and SIGINT, recorded rather than acted on: whatever runs (joining, supervising,
waiting for the others) looks at `received` and ends in its own way."""

from __future__ import annotations

import signal


class Signals:
    def __init__(self):
        self.received: int | None = None

    def install(self) -> "Signals":
        def record(signum, _frame):
            self.received = signum
        signal.signal(signal.SIGTERM, record)
        signal.signal(signal.SIGINT, record)
        return self
