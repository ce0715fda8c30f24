"""MXNet's parameter-server KVStore (dist_sync) across processes: a scheduler, a server and
two workers on this machine. Each worker pushes [rank + 1] * 4 and pulls the sum.

Without DMLC_ROLE it starts the four processes itself (MXNet runs a scheduler's or a
server's loop when imported with that role) and exits with the first failure.
"""
import os
import socket
import subprocess
import sys

role = os.environ.get("DMLC_ROLE")
if role is None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "DMLC_NODE_HOST": "127.0.0.1"}
    roles = ["scheduler", "server", "worker", "worker"]
    procs = [subprocess.Popen([sys.executable, __file__], env={**env, "DMLC_ROLE": r}) for r in roles]
    codes = [p.wait(timeout=240) for p in procs]
    sys.exit(next((c for c in codes if c), 0))

import mxnet as mx  # noqa: E402  (a scheduler or server never returns from this import)

kv = mx.kv.create("dist_sync")
kv.init(0, mx.nd.zeros((4,)))
kv.push(0, mx.nd.full((4,), float(kv.rank + 1)))
out = mx.nd.zeros((4,))
kv.pull(0, out=out)
print(f"RESULT kvstore rank={kv.rank} size={kv.num_workers} sum={out.asnumpy().tolist()}", flush=True)
