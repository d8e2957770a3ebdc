"""The supervisor's HTTP endpoint: Prometheus `/metrics` and a readiness probe `/ready`.

    GET /ready    200 "cache 'txmeta' ready"          when wait_ready would return now
                  503 "cache 'txmeta' not ready ...: <why>"  otherwise (the reason
                  wait_ready would give: no live supervisor, waiting for the broker,
                  partitions not assigned or not caught up, ...); 503 too when the
                  cache does not exist
    GET anything else: the Prometheus exposition (prometheus-client's WSGI app)
    HEAD: the same headers, no body; any other method: 405 (Allow: GET, HEAD)

Bounded, since anyone who reaches the port may connect: at most MAX_CONNECTIONS at once
(one thread each; one more is closed at once, unanswered), each closed CONNECTION_S after
it was accepted, however slowly its client sends or reads (else one that holds a
connection open holds a thread for ever).

For a load balancer's health check or a Kubernetes readinessProbe (httpGet /ready):
a machine whose replica is not whole, or behind, takes no traffic. The readiness is
read from the segment at request time (control.wait_ready with timeout 0), no state
of its own.
"""

from __future__ import annotations

import socket
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, make_server

PATH = "/ready"


MAX_CONNECTIONS = 16  # a scraper and a probe or two need a few; the rest are refused
CONNECTION_S = 5.0  # a request is read, answered and written within this, or its connection is closed
METHODS = ("GET", "HEAD")


class _Quiet(WSGIRequestHandler):
    timeout = CONNECTION_S  # each read and write on the connection (the server's sweep bounds the whole)

    def log_message(self, *args) -> None:  # a probe every second must not fill the log
        pass


def app(collector, metrics_app):
    """WSGI app: /ready from `collector.readiness()`, the rest to `metrics_app`; GET and
    HEAD only."""

    def serve(environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in METHODS:
            body = f"method {method} not allowed: GET or HEAD\n".encode()
            start_response("405 Method Not Allowed", [("Allow", ", ".join(METHODS)), *_plain(body)])
            return [body]
        if environ.get("PATH_INFO") == PATH:
            ok, why = collector.readiness()
            body = (why + "\n").encode()
            start_response("200 OK" if ok else "503 Service Unavailable", _plain(body))
            out = [body]
        else:
            out = metrics_app(environ, start_response)
        return [] if method == "HEAD" else out

    return serve


def _plain(body: bytes) -> list[tuple[str, str]]:
    return [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store"),
            ("Content-Length", str(len(body)))]


def start(collector, registry, host: str, port: int):
    """Serve /metrics and /ready on host:port from a daemon thread; returns (server, thread)."""
    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        """A thread a connection, at most MAX_CONNECTIONS of them, each shut down by the
        serving loop's sweep (service_actions, every poll) CONNECTION_S after its accept."""

        address_family = family
        request_queue_size = 128  # connections the kernel queues for accept (socketserver's 5 made a burst wait 1 s)

        def server_activate(self) -> None:
            self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
            self._open: dict = {}  # connection socket -> the monotonic time it is shut down at
            self._lock = threading.Lock()
            super().server_activate()

        def verify_request(self, request, client_address) -> bool:
            if not self._slots.acquire(blocking=False):
                return False  # closed unanswered (shutdown_request)
            with self._lock:
                self._open[request] = time.monotonic() + CONNECTION_S
            return True

        def shutdown_request(self, request) -> None:
            with self._lock:
                mine = self._open.pop(request, None) is not None
            try:
                super().shutdown_request(request)
            finally:
                if mine:
                    self._slots.release()

        def service_actions(self) -> None:
            now = time.monotonic()
            with self._lock:
                late = [r for r, at in self._open.items() if at <= now]
            for r in late:  # its thread's read or write returns at once, and the thread ends
                try:
                    r.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        def handle_error(self, request, client_address) -> None:
            pass  # a client gone, cut off or timed out: nothing to report (wsgiref prints tracebacks)

    httpd = make_server(host, port, app(collector, make_wsgi_app(registry)), Server, handler_class=_Quiet)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.25}, name="shmcache-metrics",
                         daemon=True)
    t.start()
    return httpd, t
