"""The entrypoint's output: its own lines ('entrypoint: ...') and its processes' lines,
written whole from several threads (one pump per process, the main loop).

A node of a fixed-size job of several nodes holds back each rank's Python traceback, and
the C++ error lines before it (`hold_tracebacks`): when a node is lost, the ranks of every
other node fail in their collective with a traceback of their framework's (18 lines for
torchrun's Gloo, 60 and more for TensorFlow and Horovod) before the entrypoint can tell
that the lost node, not the rank, was the cause. Once it knows (`divert`), a consequence's traceback goes to a
file in the diagnostics folder and its line names the file; a rank's own failure's goes
to the console (`release`), as does anything held longer than HOLD_S (a rank that printed
a traceback and went on). A hold is per rank and per stream where the lines say theirs
(torch's agent tails each rank's stdout and stderr apart, and may read a line the rank
printed before its traceback after it): the rank's other stream goes on to the console.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import TextIO

HOLD_S = 10.0
# What starts a hold: a Python traceback, and the error lines the frameworks' C++ logs
# print before it (glog/absl's 'E1204 ...' of TensorFlow and torch, Horovod's
# '[2026-12-04 16:03:00.483235: E /.../operations.cc:697] ...').
FAILING = re.compile(r"Traceback \(most recent call last\):|[EF]\d{4} |\[\d{4}-\d\d-\d\d [\d:. ]+: [EF] ")
_PREFIX = re.compile(r"^\[[^\]\s]+\]: ")        # rank_lines' prefix: '[rank3]: ', '[torchrun]: '


class Log:
    def __init__(self, out: TextIO | None = None, err: TextIO | None = None):
        self.out = out or sys.stdout
        self.err = err or (sys.stderr if out is None else out)
        self._lock = threading.Lock()
        self._diagnostics: str | None = None     # holding tracebacks: where diverted ones go
        self._node = 0
        self._held: dict[tuple[str, str], tuple[float, list[str]]] = {}     # (prefix, stream) -> (since, lines)

    def say(self, text: str, error: bool = False) -> None:
        self._write(self.err if error else self.out, f"entrypoint: {text}\n")

    def line(self, text: str, stream: str = "") -> None:
        """One line of a process's; `stream` ("out", "err") where its stdout and stderr come
        apart, "" where they come merged."""
        text = text if text.endswith("\n") else text + "\n"
        with self._lock:
            if self._diagnostics is not None and (found := _PREFIX.match(text)) is not None:
                own = found.group(0), stream
                if own not in self._held and FAILING.match(text, found.end()):
                    self._held[own] = (time.monotonic(), [])
                    timer = threading.Timer(HOLD_S, self._expire, [own])
                    timer.daemon = True
                    timer.start()
                if own in self._held:
                    self._held[own][1].append(text)
                    return
            self.out.write(text)
            self.out.flush()

    # ----------------------------------------------------------------- held tracebacks
    def hold_tracebacks(self, diagnostics: str, node: int) -> None:
        """From now on, hold each rank's traceback (and that rank's lines after it) until
        `release` or `divert`; diverted ones go to a file of node `node`'s under `diagnostics`."""
        self._diagnostics, self._node = diagnostics, node

    def release(self) -> None:
        """Every held line to the console, in the order each rank printed them."""
        with self._lock:
            held, self._held = self._held, {}
            self._flush(held)

    def divert(self) -> str | None:
        """Every held line into DIAGNOSTICS/lost-<time>/node<k>.txt (they are the consequence
        of another node's end); that file's path, or None when nothing was held. Where it
        cannot be written, the lines go to the console."""
        with self._lock:
            held, self._held = self._held, {}
            if not held or self._diagnostics is None:
                return None
            folder = os.path.join(self._diagnostics, time.strftime("lost-%Y%m%d-%H%M%S"))
            path = os.path.join(folder, f"node{self._node}.txt")
            try:
                os.makedirs(folder, exist_ok=True)
                with open(path, "a") as f:
                    f.writelines(line for _, lines in held.values() for line in lines)
            except OSError:
                self._flush(held)
                return None
            return path

    def _expire(self, own: tuple[str, str]) -> None:
        with self._lock:
            found = self._held.pop(own, None)
            if found is not None:
                self._flush({own: found})

    def _flush(self, held: dict[tuple[str, str], tuple[float, list[str]]]) -> None:
        for _, lines in sorted(held.values(), key=lambda item: item[0]):
            self.out.writelines(lines)
        self.out.flush()

    def _write(self, stream: TextIO, text: str) -> None:
        with self._lock:
            stream.write(text)
            stream.flush()
