"""The supervisor's HTTP endpoint (consumer/supervisor/http_endpoint.py) against clients that do not play
along (issue 39 item 10): every connection got a thread with no timeout (300 unfinished
requests held 302 threads, for ever), and /ready answered any method. Now at most
MAX_CONNECTIONS connections at once, each closed REQUEST_S after its accept if its request
is not read whole by then however slowly its client sends, and only GET and HEAD are
answered. And (issue 53, item 6) a probe is answered while other clients hold idle
connections and reopen them as they close: 16 of them took every place, and 0 of 75 probes
were answered in 15 s. The endpoint is served by this test's process (MetricsServer), so
its threads are counted here; the idle clients are a process of their own."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

import shmcache
from shmcache.consumer.supervisor import http_endpoint
from shmcache.consumer.supervisor.metrics import MetricsServer

from shmtest.waits import poll_until


@pytest.fixture
def server():
    name = f"t-http-{uuid.uuid4().hex[:10]}"
    shmcache.create(name, memory="40MiB").close()
    srv = MetricsServer(name, 0)
    try:
        yield srv
    finally:
        srv.close()
        shmcache.destroy(name)


def _request(port: int, method: str, path: str = "/ready") -> tuple[int, dict, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request(method, path)
        resp = c.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        c.close()


def _closed_by_server(s: socket.socket, timeout: float) -> bool:
    """Wait (in recv, up to `timeout`) for the server to close `s`: True if it did."""
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_held_connections_are_bounded_in_number_and_time(server):
    """300 clients each send half a request and wait. The endpoint holds at most
    MAX_CONNECTIONS of them (a thread each), each new one in the place of the oldest, closes
    the held ones REQUEST_S after their accept, and then answers a probe again."""
    base = threading.active_count()
    socks: list[socket.socket] = []
    closed: set[int] = set()

    def count_closed() -> int:
        for i, s in enumerate(socks):
            if i not in closed and _closed_by_server(s, 0.001):
                closed.add(i)
        return len(closed)

    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"GET /ready HTTP/1.1\r\nHost: x\r\n")  # never the blank line that ends it
            socks.append(s)
        t0 = time.monotonic()
        poll_until(lambda: count_closed() >= len(socks) - http_endpoint.MAX_CONNECTIONS, 30,
               lambda: f"the connections over the limit to be closed ({len(closed)} of {len(socks)}; "
                       f"{threading.active_count() - base} threads)")
        poll_until(lambda: threading.active_count() - base <= http_endpoint.MAX_CONNECTIONS, 10,
                   lambda: f"at most MAX_CONNECTIONS threads ({threading.active_count() - base})")
        poll_until(lambda: count_closed() == len(socks), http_endpoint.CONNECTION_S + 10, "the held connections to be cut")
        assert time.monotonic() - t0 < http_endpoint.CONNECTION_S + 10
        poll_until(lambda: threading.active_count() <= base, 30, "the connections' threads to end")
        status, _, body = _request(server.port, "GET")
        assert status == 503 and b"no live supervisor" in body
    finally:
        for s in socks:
            s.close()


def test_a_client_that_sends_slowly_is_cut_off_in_time(server):
    """A byte every 0.2 s keeps each read under any per-read timeout: only a bound on
    the whole connection cuts it off."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    t0 = time.monotonic()
    cut = False
    try:
        for ch in (b"GET /ready HTTP/1.1\r\nX-Slow: " + b"a" * 200):
            try:
                s.sendall(bytes([ch]))
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            if _closed_by_server(s, 0.2):  # the client's pace: a byte every 0.2 s, unless closed meanwhile
                cut = True
                break
        took = time.monotonic() - t0
    finally:
        s.close()
    assert cut and took < http_endpoint.CONNECTION_S + 5, f"cut={cut} after {took:.1f} s"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH"])
def test_only_get_and_head_are_answered(server, method):
    for path in ("/ready", "/metrics"):
        status, headers, body = _request(server.port, method, path)
        assert status == 405 and headers["Allow"] == "GET, HEAD", (status, headers, body)
    status, headers, body = _request(server.port, "HEAD")
    assert status == 503 and body == b"" and int(headers["Content-Length"]) > 0
    assert _request(server.port, "GET", "/metrics")[0] == 200


# K idle clients, each sending the first line of a request and no more, reopened as the server closes
# them, until stdin closes; prints how many connections it made
_IDLE_CLIENTS = r"""
import selectors, socket, sys, threading
port, k = int(sys.argv[1]), int(sys.argv[2])
sel, made, stop = selectors.DefaultSelector(), 0, threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
def connect():
    global made
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /ready HTTP/1.1\r\n")
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
    made += 1
for _ in range(k):
    connect()
print("held", flush=True)
while not stop.is_set():
    for key, _ in sel.select(0.1):
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        if not data:
            sel.unregister(key.fileobj)
            key.fileobj.close()
            connect()
print(made, flush=True)
"""


@pytest.mark.parametrize("idle", [http_endpoint.MAX_CONNECTIONS, 2 * http_endpoint.MAX_CONNECTIONS])
def test_a_probe_is_answered_while_idle_connections_are_held_and_reopened(server, idle):
    """`idle` clients (every place; twice as many) hold connections
    with a request never finished and open a new one as each is closed. A probe, which sends
    its request at once, is answered every time, never closed in their stead."""
    clients = subprocess.Popen([sys.executable, "-c", _IDLE_CLIENTS, str(server.port), str(idle)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert clients.stdout.readline().strip() == "held"
        took = []
        for _ in range(20):
            t0 = time.monotonic()
            status, _, body = _request(server.port, "GET")  # a connection and request as a kubelet's
            took.append(time.monotonic() - t0)
            assert status == 503 and b"no live supervisor" in body, (status, body)
        clients.stdin.close()
        made = int(clients.stdout.readline())
        assert clients.wait(30) == 0
    finally:
        if clients.poll() is None:
            clients.kill()
            clients.wait()
    assert made > idle, "the idle clients' connections were never closed: the test did not hold the places"
    print(f"{idle} idle clients ({made:,} connections): 20 probes answered, slowest {max(took):.2f} s")
