"""running/log.py: a node of a multi-node job holds its ranks' tracebacks until it knows
whether they are the rank's own failure (the console) or another node's loss (a file)."""

import io
import time

from entrypoint.running import log as log_module
from entrypoint.running.log import Log

TRACE = ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "t.py", line 1', "[rank0]: RuntimeError: x"]


def held(tmp_path):
    out = io.StringIO()
    log = Log(out)
    log.hold_tracebacks(str(tmp_path / "diagnostics"), node=1)
    log.line("[rank1]: step 3")
    log.line("[rank0]: E1204 12:00:00.000 123 pair.cc:537] Read error")       # a C++ error line starts it too
    for line in TRACE:
        log.line(line)
    log.line("[rank1]: step 4")                        # another rank's lines go on
    return log, out


def test_a_consequence_goes_to_a_file_the_console_never_sees(tmp_path):
    log, out = held(tmp_path)
    assert out.getvalue() == "[rank1]: step 3\n[rank1]: step 4\n"
    path = log.divert()
    assert path.startswith(str(tmp_path / "diagnostics" / "lost-")) and path.endswith("/node1.txt")
    assert open(path).read().splitlines() == ["[rank0]: E1204 12:00:00.000 123 pair.cc:537] Read error", *TRACE]
    assert log.divert() is None and out.getvalue().count("\n") == 2


def test_a_ranks_own_failure_is_released_to_the_console_in_order(tmp_path):
    log, out = held(tmp_path)
    log.line("[rank0]: after")                         # the held rank's later lines wait behind its traceback
    log.release()
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["[rank1]: step 3", "[rank1]: step 4"] and lines[-1] == "[rank0]: after"
    assert lines[2:-1] == ["[rank0]: E1204 12:00:00.000 123 pair.cc:537] Read error", *TRACE]


def test_a_hold_nobody_settles_reaches_the_console_after_hold_s(tmp_path, monkeypatch):
    monkeypatch.setattr(log_module, "HOLD_S", 0.2)
    log, out = held(tmp_path)
    time.sleep(0.6)
    assert TRACE[-1] in out.getvalue() and log.divert() is None


def test_without_holding_every_line_goes_straight_out():
    out = io.StringIO()
    log = Log(out)
    for line in TRACE:
        log.line(line)
    assert out.getvalue().splitlines() == TRACE


def test_a_hold_keeps_to_the_stream_of_the_traceback(tmp_path):
    """torch's agent tails a rank's stdout and stderr apart: a line the rank printed before
    its traceback may come after it, from the other stream, and goes on to the console."""
    out = io.StringIO()
    log = Log(out)
    log.hold_tracebacks(str(tmp_path / "diagnostics"), node=0)
    for line in TRACE:
        log.line(line, "err")
    log.line("[rank0]: ALLREDUCED rank=0", "out")
    log.line("[rank0]: more of the traceback's stream", "err")
    assert out.getvalue() == "[rank0]: ALLREDUCED rank=0\n"
    assert open(log.divert()).read().splitlines() == [*TRACE, "[rank0]: more of the traceback's stream"]
