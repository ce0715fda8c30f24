"""The entrypoint's output: its own lines ('entrypoint: ...') and its processes' lines,
written whole from several threads (one pump per process, the main loop)."""

from __future__ import annotations

import sys
import threading
from typing import TextIO


class Log:
    def __init__(self, out: TextIO | None = None, err: TextIO | None = None):
        self.out = out or sys.stdout
        self.err = err or (sys.stderr if out is None else out)
        self._lock = threading.Lock()

    def say(self, text: str, error: bool = False) -> None:
        self._write(self.err if error else self.out, f"entrypoint: {text}\n")

    def line(self, text: str) -> None:
        self._write(self.out, text if text.endswith("\n") else text + "\n")

    def _write(self, stream: TextIO, text: str) -> None:
        with self._lock:
            stream.write(text)
            stream.flush()
