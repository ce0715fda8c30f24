"""disttrain/teardown.py: at exit, a PyTorch process waits until no C++ holder of what
torch's backward stashed in thread-local state is left (a Gloo worker still dropping a
finished work would otherwise release it during finalization and abort the process)."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")


def _run(code: str) -> subprocess.CompletedProcess:
    prelude = ("import torch\n"
               "from disttrain import teardown\n"
               "teardown.install()\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120)


def test_backward_is_wrapped_and_leaves_nothing_held():
    done = _run("x = torch.ones(3, requires_grad=True)\n"
                "(x * 2).sum().backward()\n"
                "assert getattr(torch._C._stash_obj_in_tls, '_disttrain', False)\n"
                "print('held', teardown.wait_for_holders(0.5), 'grad', x.grad.tolist())\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "held 0 grad [2.0, 2.0, 2.0]\n"


def test_an_object_a_cxx_thread_local_still_holds_is_waited_for_until_it_is_released():
    """torch's own thread-local map is the C++ holder here: while it holds the stashed
    object the wait runs to its limit and reports it; once torch drops it, nothing is left."""
    done = _run("import contextvars, time\n"
                "torch._C._stash_obj_in_tls('probe', contextvars.copy_context())\n"
                "t = time.monotonic(); left = teardown.wait_for_holders(0.3)\n"
                "print('while held', left, round(time.monotonic() - t, 1))\n"
                "torch._C._remove_obj_from_tls('probe')\n"
                "print('after release', teardown.wait_for_holders(0.3))\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "while held 1 0.3\nafter release 0\n"
