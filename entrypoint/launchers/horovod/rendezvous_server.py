"""Horovod's own HTTP rendezvous server, on a fixed port.

horovodrun starts `RendezvousServer` on a random port and reaches the workers over SSH.
Containers have neither, so the master's entrypoint runs Horovod's server classes itself
on HOROVOD_PORT and every node starts its workers with the HOROVOD_* environment that
horovodrun would have given them (fixed.py). For elastic jobs the handler
is Horovod's elastic one, bound to its ElasticDriver (elastic_driver.py).

Like Horovod's RendezvousServer: `start(handler)`, then `init(host assignments)`, `stop()`.
"""

from __future__ import annotations

import threading


class HorovodRendezvous:
    def __init__(self, port: int, host: str = "0.0.0.0"):
        self.host, self.port = host, port
        self.httpd = None
        self.thread: threading.Thread | None = None
        self._stopping = threading.Lock()

    @staticmethod
    def serving(slots, port: int, host: str = "0.0.0.0") -> "HorovodRendezvous":
        """A fixed-size job: Horovod's host assignment (its slots), served now."""
        server = HorovodRendezvous(port, host)
        server.start()
        server.init(slots)
        return server

    def start(self, handler=None) -> int:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        class Server(RendezvousHTTPServer):
            # socketserver listens with a backlog of 5. Every Horovod worker polls this
            # server every 10 ms with a new connection while Gloo connects its full mesh;
            # past a handful of workers the backlog overflows, connections are refused,
            # and each refusal costs that worker a 500 ms retry (bench: 16 s to join 16
            # nodes with the default, see README).
            request_queue_size = 1024

        self.httpd = Server((self.host, self.port), handler or RendezvousHandler, 0)   # OSError: Job says it
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="horovod-rendezvous", daemon=True)
        self.thread.start()
        return self.port

    def init(self, host_alloc_plan) -> None:
        self.httpd.init(host_alloc_plan)

    def stop(self) -> None:
        """Once, whoever calls it: Horovod's elastic driver stops its rendezvous from the
        thread that records the last worker's state, and the job from its own."""
        with self._stopping:
            httpd, self.httpd = self.httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
