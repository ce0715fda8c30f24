"""A PyTorch process ends without one of torch's C++ threads touching Python after the
interpreter has begun to finalize.

torch 2.13's backward stashes a copy of the caller's contextvars.Context in C++
thread-local state (torch.autograd.graph._engine_run_backward, `_stash_obj_in_tls`), and
every Gloo collective issued during a backward (DDP's gradient allreduces) keeps a
snapshot of that state until one of Gloo's worker threads drops the finished work. The
worker completes the work first, which lets the script go on, and drops it a moment later.
If it is descheduled in between and the script ends meanwhile (a rank with nothing to save
reaches its last line within microseconds), it drops the last reference to the Context
during the interpreter's finalization: it takes the GIL, CPython ends the thread
(pthread_exit), and the C++ unwind ends in std::terminate: 'terminate called without an
active exception', SIGABRT, exit 134. That was 3 runs of 40 of a plain DDP script (two
ranks, `destroy_process_group()` at the end) on 2 cores: `destroy_process_group` does not
join Gloo's workers while DDP still holds the group. The core's stacks: a Gloo worker in
~AsyncWork -> ~ThreadLocalState -> SafePyObject decref -> take_gil -> pthread_exit, the
main thread in Py_FinalizeEx.

`install()` (the image's per-interpreter line, disttrain.pth) wraps that stash: each
object stashed is also held here, and at exit (atexit, while other threads can still take
the GIL) the process waits, the GIL released, until no C++ holder of any of them is left
(its reference count is down to ours), at most EXIT_WAIT_S. Nothing of Python's is then
left for a C++ thread to release after finalization. Objects whose holders are gone are
dropped at each stash, so the list stays as short as the works in flight.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time

from .hooks import after_import

EXIT_WAIT_S = 2.0          # a work still running at exit (a collective the script left) is not waited for longer
POLL_S = 0.001
MODULE = "torch.autograd.graph"

_held: list = []
_lock = threading.Lock()


def _counts(held: list) -> list[int]:
    return [sys.getrefcount(obj) for obj in held]


_OURS = _counts([object()])[0]      # an object only `held` refers to, counted the same way


def _prune() -> int:
    """Drop what no one else holds any more; how many are still held elsewhere."""
    with _lock:
        _held[:] = [obj for obj, n in zip(_held, _counts(_held)) if n > _OURS]
        return len(_held)


def wait_for_holders(limit_s: float = EXIT_WAIT_S) -> int:
    """Wait, the GIL released, until no C++ holder of a stashed object is left; what is
    still held after `limit_s`."""
    deadline = time.monotonic() + limit_s
    while (left := _prune()) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return left


def _patch(graph_module) -> None:
    import torch

    original = torch._C._stash_obj_in_tls
    if getattr(original, "_disttrain", False):
        return

    def stash(key, obj):
        original(key, obj)
        _prune()
        with _lock:
            _held.append(obj)

    stash._disttrain = True
    torch._C._stash_obj_in_tls = stash
    atexit.register(wait_for_holders)


def install() -> None:
    after_import(MODULE, _patch)
