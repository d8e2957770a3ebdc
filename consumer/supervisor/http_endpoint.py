"""The supervisor's HTTP endpoint: Prometheus `/metrics` and a readiness probe `/ready`.

    GET /ready    200 "cache 'txmeta' ready"          when wait_ready would return now
                  503 "cache 'txmeta' not ready ...: <why>"  otherwise (the reason
                  wait_ready would give: no live supervisor, waiting for the broker,
                  partitions not assigned or not caught up, ...); 503 too when the
                  cache does not exist
    GET /ready?max_lag=N&max_behind=S   the same, and 503 while a partition is more than N
                  messages or S seconds behind its topic (wait-ready's --max-lag and
                  --max-behind, either or both; engine/control/bound.py); 400 naming
                  the parameter for one it does not take, one given twice, or a value
                  the contract's grammar refuses
    GET anything else: the Prometheus exposition (prometheus-client's WSGI app)
    HEAD: the same headers, no body; any other method: 405 (Allow: GET, HEAD)

Bounded, since anyone who reaches the port may connect, and answering a probe all the
same while others hold connections open without finishing their requests:
- at most MAX_CONNECTIONS connections at once, a thread each;
- a connection whose request is not read whole within REQUEST_S of its accept is closed,
  and one whose answer is not written within CONNECTION_S of its accept too, however
  slowly its client sends or reads;
- when every connection is taken, a new one takes the place of the oldest that has been
  reading its request for IDLE_S or more (closed unanswered): a client that sends its
  request at once, as a kubelet or a load balancer does, is never the one closed. A probe
  is answered while idle connections are held and reopened, by any number of clients:
  it waits at most about IDLE_S for each MAX_CONNECTIONS of them that came before it.
  Only MAX_CONNECTIONS connections each being answered at once (whole requests whose
  clients do not read the answers) make a new one wait, up to REQUEST_S, then close it.

For a load balancer's health check or a Kubernetes readinessProbe (httpGet /ready, or
/ready?max_lag=10000 for one that must also be close behind): a machine whose replica is
not whole, or behind, takes no traffic. The readiness is
read from the segment at request time (control.wait_ready with timeout 0), no state
of its own.
"""

from __future__ import annotations

import socket
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, make_server

PATH = "/ready"


MAX_CONNECTIONS = 64  # a scraper and a probe or two need a few; the rest wait for a place or take an idle one's
REQUEST_S = 2.0  # a request is read whole within this of its accept, or its connection is closed
CONNECTION_S = 5.0  # a request is read, answered and written within this, or its connection is closed
IDLE_S = 0.1  # a connection reading its request this long may lose its place to a new one
METHODS = ("GET", "HEAD")


class _Quiet(WSGIRequestHandler):
    timeout = CONNECTION_S  # each read and write on the connection (the server's sweep bounds the whole)

    def parse_request(self) -> bool:
        ok = super().parse_request()  # the request line and every header: the request is read whole
        self.server.read_whole(self.connection)
        return ok

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
            try:
                max_lag, max_behind = _bound(environ.get("QUERY_STRING", ""))
            except ValueError as e:
                body = f"{e}\n".encode()
                start_response("400 Bad Request", _plain(body))
                return [] if method == "HEAD" else [body]
            ok, why = collector.readiness(max_lag, max_behind)
            body = (why + "\n").encode()
            start_response("200 OK" if ok else "503 Service Unavailable", _plain(body))
            out = [body]
        else:
            out = metrics_app(environ, start_response)
        return [] if method == "HEAD" else out

    return serve


def _bound(query: str) -> tuple[int | None, float | None]:
    """/ready's query: max_lag and max_behind, each at most once, in the contract's grammar;
    ValueError naming what is wrong."""
    from urllib.parse import parse_qs

    from shmcache.engine.control import bound

    try:
        given = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=2)
    except ValueError:
        raise ValueError(f"/ready takes max_lag=N and max_behind=S, not {query[:200]!r}") from None
    unknown = sorted(set(given) - {"max_lag", "max_behind"})
    if unknown:
        raise ValueError(f"/ready takes max_lag=N and max_behind=S, not {unknown[0][:100]!r}")
    twice = [k for k, v in given.items() if len(v) > 1]
    if twice:
        raise ValueError(f"/ready: {twice[0]} given {len(given[twice[0]])} times")
    lag, behind = given.get("max_lag"), given.get("max_behind")
    return (None if lag is None else bound.count(lag[0], "max_lag"),
            None if behind is None else bound.seconds(behind[0], "max_behind"))


def _plain(body: bytes) -> list[tuple[str, str]]:
    return [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store"),
            ("Content-Length", str(len(body)))]


class _Open:
    """A connection being served: when it was accepted, when it is shut down, and whether
    its request is still being read."""

    __slots__ = ("accepted", "deadline", "reading")

    def __init__(self, accepted: float, deadline: float):
        self.accepted, self.deadline, self.reading = accepted, deadline, True


def start(collector, registry, host: str, port: int):
    """Serve /metrics and /ready on host:port from a daemon thread; returns (server, thread)."""
    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        """A thread a connection, at most MAX_CONNECTIONS of them, each shut down by the
        serving loop's sweep (service_actions, every poll) REQUEST_S after its accept while
        its request is read, CONNECTION_S after it once it is answered; a new connection
        takes the place of the oldest idle one when all are taken."""

        address_family = family
        request_queue_size = 128  # connections the kernel queues for accept (socketserver's 5 made a burst wait 1 s)

        def server_activate(self) -> None:
            self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
            self._open: dict = {}  # connection socket -> _Open
            self._lock = threading.Lock()
            super().server_activate()

        def verify_request(self, request, client_address) -> bool:
            give_up = time.monotonic() + REQUEST_S
            while not self._slots.acquire(timeout=0.02):
                self._evict_idle()
                self.service_actions()  # the sweep goes on while this loop waits
                if time.monotonic() > give_up:
                    return False  # closed unanswered (shutdown_request)
            now = time.monotonic()
            with self._lock:
                self._open[request] = _Open(now, now + REQUEST_S)
            return True

        def read_whole(self, request) -> None:
            """request's connection has read its request: it is being answered."""
            with self._lock:
                c = self._open.get(request)
                if c is not None and c.reading:
                    c.reading, c.deadline = False, c.accepted + CONNECTION_S

        def _evict_idle(self) -> None:
            """Shut down the oldest connection that has been reading its request for IDLE_S or
            more; its thread ends and gives up its place."""
            now = time.monotonic()
            with self._lock:
                idle = [(c.accepted, r) for r, c in self._open.items() if c.reading and c.accepted <= now - IDLE_S]
                if not idle:
                    return
                _, r = min(idle, key=lambda x: x[0])
                self._open[r].reading = False  # chosen once
            try:
                r.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

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
                late = [r for r, c in self._open.items() if c.deadline <= now]
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
