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


WAIT_THROUGH_THE_RELAYS = """
import json, sys, threading, time
from entrypoint.security.secret import Identity, new_secret
from entrypoint.store.tcp import TcpJobStore
identity = Identity.derive(new_secret().encode(), "wait-test")
port = int(sys.argv[1])
master = TcpJobStore("127.0.0.1", port, "t", serve=True, timeout_s=10, op_timeout_s=5, identity=identity)
master.connect(deadline=time.monotonic() + 10)
node = TcpJobStore("127.0.0.1", port, "t", serve=False, timeout_s=10, op_timeout_s=5, identity=identity)
node.connect(deadline=time.monotonic() + 10)
master.set("k", "v")
t = time.monotonic(); missing = node.wait("absent", 0.3); missed_after = time.monotonic() - t
threading.Timer(0.2, master.set, ("late", "here")).start()
t = time.monotonic(); late = node.wait("late", 5.0); late_after = time.monotonic() - t
print(json.dumps({"missing": missing, "missed_after": missed_after, "late": late, "late_after": late_after,
                  "present": node.wait("k", 0.3), "get": node.get("k"), "add": [node.add("n", 1), node.add("n", 1)],
                  "absent_get": node.get("absent")}))
node.close(); master.close()
"""


def test_a_node_waits_on_the_store_through_its_tunnel_and_reads_its_own_replies_after_a_timed_out_wait():
    """Joining waits on the store (one request, answered when the key is set) instead of
    polling through a secret's two relays. A wait that times out is cancelled, so the next
    operation still reads its own reply."""
    done = subprocess.run([sys.executable, "-c", WAIT_THROUGH_THE_RELAYS, str(free_port())], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["missing"] is False and 0.3 <= found["missed_after"] < 1.5
    assert found["late"] is True and found["late_after"] < 1.0        # woken when set, not at the timeout
    assert found["present"] is True
    assert found["get"] == "v" and found["add"] == [1, 2] and found["absent_get"] is None
    assert "Traceback" not in done.stderr and "waitForInput" not in done.stderr   # torch's C++ log stays quiet
