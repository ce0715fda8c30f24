"""SIGTERM and SIGINT, recorded rather than acted on: whatever runs (joining, supervising,
waiting for the others) looks at `received` and ends in its own way. SIGUSR1 asks for the
job's status (disttrain/status.py) in the log: the supervision loop shows it."""

from __future__ import annotations

import signal
import time


class Signals:
    def __init__(self):
        self.received: int | None = None
        self.received_at: float | None = None      # time.monotonic() of the first one
        self.status_asked = False

    def install(self) -> "Signals":
        def record(signum, _frame):
            self.received = signum
            if self.received_at is None:
                self.received_at = time.monotonic()
        signal.signal(signal.SIGTERM, record)
        signal.signal(signal.SIGINT, record)

        def ask_status(_signum, _frame):
            self.status_asked = True
        signal.signal(signal.SIGUSR1, ask_status)
        return self

    def take_status_request(self) -> bool:
        asked, self.status_asked = self.status_asked, False
        return asked
