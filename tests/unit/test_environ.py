"""The secret kept out of the environments a training process can read (security/environ.py)."""

import subprocess
import sys

from entrypoint.security.environ import without_secret
from tests.conftest import ROOT

SCRUB = """
import os
from entrypoint.security.environ import scrub_environ_block
os.environ.pop("JOB_SECRET")
before = open("/proc/self/environ", "rb").read()
done = scrub_environ_block("JOB_SECRET")
after = open("/proc/self/environ", "rb").read()
print(done, b"3f9a1c7e5b2d8f4a" in before, b"3f9a1c7e5b2d8f4a" in after, b"NOT_JOB_SECRET=3f9a1c7e" in after,
      b"OTHER=kept" in after, len(before) == len(after))
"""


def test_the_variables_and_the_files_path_are_left_out():
    env = {"JOB_SECRET": "x", "JOB_SECRET_FILE": "/run/secrets/s", "RUN_ID": "r", "PATH": "/bin"}
    assert without_secret(env) == {"RUN_ID": "r", "PATH": "/bin"}


def test_the_value_is_gone_from_proc_environ_and_nothing_else_moves():
    """os.environ.pop leaves /proc/self/environ as it was; the scrub blanks the value there
    (only the variable's own: another whose value or name merely contains it stays)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JOB_SECRET": "3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e",
           "OTHER": "kept", "NOT_JOB_SECRET": "3f9a1c7e"}
    out = subprocess.run([sys.executable, "-c", SCRUB], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True", "False", "True", "True", "True"], out.stdout + out.stderr
