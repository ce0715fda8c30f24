"""The job store's own costs on a node, measured in a fresh interpreter."""

import json
import subprocess
import sys

from testing.ports import free_port

CONNECT_AND_COUNT = """
import gc, json, sys, time
from entrypoint.store.tcp import TcpJobStore
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
store = TcpJobStore("127.0.0.1", int(sys.argv[1]), "t", serve=True, timeout_s=10, op_timeout_s=5)
store.connect(deadline=time.monotonic() + 10)      # imports torch: the first thing a node does
print(json.dumps({"full": len(full), "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def test_connecting_imports_torch_without_a_full_collection_and_freezes_it_out_of_the_collectors_way():
    """Each full collection with torch loaded walks its ~170k objects (up to 0.1 s of CPU);
    two or three came during the import, at every node's start, one more with JOB_SECRET's
    imports before it."""
    done = subprocess.run([sys.executable, "-c", CONNECT_AND_COUNT, str(free_port())], capture_output=True,
                          text=True, timeout=120, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["full"] == 0
    assert found["enabled"]                       # the collector runs again for everything after
    assert found["frozen"] > 100_000
