"""The master's side of Horovod's rendezvous behind JOB_SECRET, in a process of its own (as
on a master node): Horovod's HTTP server on loopback and a Gate on the port given. Prints
the server's loopback port, then serves until killed. Usage: gated_rendezvous.py PORT SECRET"""
import sys
import time

from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

from entrypoint.launchers.horovod.rendezvous_server import HorovodRendezvous
from entrypoint.security.secret import Identity
from entrypoint.security.tunnel import Gated

port, secret = int(sys.argv[1]), sys.argv[2].encode()
slots = get_host_assignments([HostInfo("node0", 1)], 1)
gated = Gated(HorovodRendezvous.serving(slots, 0, "127.0.0.1"), port, Identity.derive(secret).server_context(),
              lambda line: None)
print(gated.local_port, flush=True)
while True:
    time.sleep(60)
