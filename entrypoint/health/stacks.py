"""Reading a stack dump: where a rank's main thread is, and whether it waits in a collective.

The dumps are faulthandler's (every thread, most recent call first). The main thread is the
one that runs a `<module>` frame (the script); the image's own progress thread is left out.
A frame is the user's unless its file lies under one of the library roots (the standard
library, site-packages, the image's own code). Pure: the roots are given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from disttrain.progress import Progress

WRITER = Progress._write_every_second.__name__       # the image's progress thread: not the rank's work

FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.IGNORECASE)

# Where a waiting rank's innermost library frames are: (path fragment, what it is waiting in).
COLLECTIVES = (
    ("/torch/distributed/", "torch.distributed.{func}"),
    ("/torch/nn/parallel/distributed.py", "DDP's {func}"),
    ("/torch/autograd/", "backward (DDP's gradient allreduce)"),
    ("/torch/_tensor.py", "backward (DDP's gradient allreduce)"),
    ("/horovod/", "Horovod's {func}"),
    ("/tensorflow/python/eager/", "a TensorFlow op ({func})"),
    ("/tensorflow/python/distribute/", "TensorFlow's {func}"),
    ("/mxnet/kvstore", "MXNet's kvstore ({func})"),
    ("/mxnet/", "MXNet ({func})"),
)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


@dataclass(frozen=True)
class Where:
    """A rank's main thread at the moment of its dump."""
    user: Frame | None               # the innermost frame of the user's code
    innermost: Frame | None
    collective: str | None           # what it waits in, when its innermost frames are a collective's

    def to_dict(self) -> dict:
        return {"user": _frame_dict(self.user), "innermost": _frame_dict(self.innermost),
                "collective": self.collective}

    @staticmethod
    def from_dict(data: dict) -> "Where":
        return Where(user=_frame(data.get("user")), innermost=_frame(data.get("innermost")),
                     collective=data.get("collective"))

    def describe(self) -> str:
        at = f" from {self.user.file}:{self.user.line}" if self.user else ""
        if self.collective:
            return f"waits in {self.collective}{at}"
        if self.user:
            return f"is at {self.user}"
        return f"is in {self.innermost}" if self.innermost else "gave no Python stack"


def _frame_dict(frame: Frame | None) -> dict | None:
    return None if frame is None else {"file": frame.file, "line": frame.line, "func": frame.func}


def _frame(data: dict | None) -> Frame | None:
    return None if not data else Frame(data["file"], int(data["line"]), data["func"])


def threads(dump: str) -> list[tuple[bool, list[Frame]]]:
    """(is the signalled thread, frames innermost first) for each thread of a dump."""
    found: list[tuple[bool, list[Frame]]] = []
    for line in dump.splitlines():
        if m := THREAD_RE.match(line.strip()):
            found.append((m.group(1).lower().startswith("current"), []))
        elif (m := FRAME_RE.match(line)) and found:
            found[-1][1].append(Frame(m.group("file"), int(m.group("line")), m.group("func")))
    return found


def main_thread(dump: str) -> list[Frame]:
    candidates = [(current, frames) for current, frames in threads(dump)
                  if frames and not any(f.func == WRITER for f in frames)]
    scripts = [frames for _, frames in candidates if any(f.func == "<module>" for f in frames)]
    if scripts:
        return scripts[0]
    return candidates[0][1] if candidates else []


def is_library(frame: Frame, library_roots: tuple[str, ...]) -> bool:
    return frame.file.startswith("<") or any(frame.file.startswith(root) for root in library_roots)


def where(dump: str, library_roots: tuple[str, ...]) -> Where:
    frames = main_thread(dump)
    user = next((f for f in frames if not is_library(f, library_roots)), None)
    library = []
    for f in frames:                         # the library frames above the user's innermost one
        if not is_library(f, library_roots):
            break
        library.append(f)
    collective = None
    for frame in library:
        for fragment, text in COLLECTIVES:
            if fragment in frame.file:
                collective = text.format(func=frame.func)
                break
        if collective:
            break
    return Where(user=user, innermost=frames[0] if frames else None, collective=collective)


def shown(dump: str) -> list[str]:
    """The dump's lines as they go to the log: every thread but the image's progress writer."""
    lines, skipping, block_start = [], False, 0
    for line in dump.splitlines():
        if THREAD_RE.match(line.strip()):
            skipping = False
            block_start = len(lines)
        if WRITER in line:
            skipping = True
            del lines[block_start:]
        if not skipping and line.strip():
            lines.append(line.rstrip())
    return lines
