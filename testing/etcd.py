"""A real etcd v3 cluster on loopback for tests: Debian's `etcd-server` (3.4), one process a
member, each on its own client and peer port; members can be stopped and started again."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from .ports import free_port


def etcd_binary() -> str | None:
    return shutil.which("etcd")


class EtcdCluster:
    def __init__(self, folder: Path, members: int = 3):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.names = [f"m{i}" for i in range(members)]
        self.client = {n: free_port() for n in self.names}
        self.peer = {n: free_port() for n in self.names}
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{self.client[n]}" for n in self.names]

    def start(self, name: str | None = None) -> "EtcdCluster":
        """Every member (or one stopped member again), then wait until the cluster answers."""
        cluster = ",".join(f"{n}=http://127.0.0.1:{self.peer[n]}" for n in self.names)
        for n in [name] if name else self.names:
            log = open(self.folder / f"{n}.log", "ab")
            self.procs[n] = subprocess.Popen(
                ["etcd", "--name", n, "--data-dir", str(self.folder / n),
                 "--listen-client-urls", f"http://127.0.0.1:{self.client[n]}",
                 "--advertise-client-urls", f"http://127.0.0.1:{self.client[n]}",
                 "--listen-peer-urls", f"http://127.0.0.1:{self.peer[n]}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer[n]}",
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--heartbeat-interval", "50", "--election-timeout", "500"],
                stdout=log, stderr=subprocess.STDOUT)
        self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for url in self.endpoints:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=1) as r:
                        if b'"true"' in r.read():
                            return
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"etcd at {self.endpoints} not healthy after {timeout}s; see {self.folder}/*.log")

    def leader(self) -> str:
        """The name of the member that leads now."""
        import json
        for name in self.procs:
            url = f"http://127.0.0.1:{self.client[name]}/v3/maintenance/status"
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=2) as r:
                    status = json.loads(r.read())
            except OSError:
                continue
            if status.get("leader") == status["header"]["member_id"]:
                return name
        raise RuntimeError("no member leads")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
