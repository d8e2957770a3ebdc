"""A TCP proxy in front of a test's own broker that stops every connection at a chosen
request, so a test can freeze the broker at exactly that moment (SIGSTOP while the
request waits at the gate), not a moment before or after.

The broker advertises the gate's port (PrivateBroker(advertised_port=gate.port)), so
every connection a client makes after its bootstrap goes through the gate. `hold_at`
arms it: the first request of one of the given API keys from a client whose client.id
starts with the given prefix stops all forwarding, both ways, on every connection
(`held` is set); `release()` lets everything through again. The request header's
client_id is a plain nullable string in every version (the Kafka protocol keeps it so).
`hold_at(..., connection_only=True)` stops only the connection that request came on (a
client's group coordinator connection, say), while its others go on; given a `suffix`,
only a client whose client.id also ends so. `slow_down` makes
a broker that answers, slowly: every request of the given API keys from such a client
waits that long before it goes on (and the requests behind it on its connection with it,
as a broker answers a connection's requests in order); given a `suffix`, only clients whose
client.id also ends so (the supervisor's look-up client is named <client.id>/look-up).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

OFFSET_FETCH = 9  # a group's committed offsets (the supervisor's look-up; a consumer's on assign)
LIST_OFFSETS = 2  # watermarks (the supervisor's look-up)
SUPERVISOR_CLIENT = "shmcache-"  # consumer/config.py RunConfig.client_id: the supervisor's clients' names start so


def _named(client_id: str, prefix: str, suffix: str) -> bool:
    """The client.id is one that hold_at or slow_down was given: that prefix, and that suffix."""
    return client_id.startswith(prefix) and client_id.endswith(suffix)


class KafkaGate:
    def __init__(self, broker_port: int):
        self.broker_port = broker_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = threading.Event()  # set: bytes flow
        self.open.set()
        self.held = threading.Event()  # the armed request arrived; everything waits
        self.request = None  # (api_key, client_id) of the request that closed the gate
        self.held_at = 0.0  # time.monotonic() it did
        self._armed: tuple[frozenset, str, bool, str] | None = None
        self._slow: tuple[frozenset, str, float, str] | None = None  # (api keys, client prefix, seconds, suffix)
        self.slowed = 0  # requests slowed down so far
        self._held_conns: list[threading.Event] = []  # connections stopped alone (connection_only)
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._closed = False
        self._closing = threading.Event()  # set at close: a slowed request waits no more
        threading.Thread(target=self._accept, daemon=True, name="kafka-gate").start()

    def hold_at(self, api_keys, client_prefix: str, connection_only: bool = False, suffix: str = "") -> None:
        with self._lock:
            self.held.clear()
            self._armed = (frozenset(api_keys), client_prefix, connection_only, suffix)

    def slow_down(self, api_keys, client_prefix: str, seconds: float, suffix: str = "") -> None:
        with self._lock:
            self._slow = (frozenset(api_keys), client_prefix, seconds, suffix)

    def release(self) -> None:
        self.open.set()
        for e in self._held_conns:
            e.set()

    def close(self) -> None:
        self._closed = True
        self._closing.set()
        self.release()
        with contextlib.suppress(OSError):
            self.listener.close()
        for s in list(self._socks):
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(("127.0.0.1", self.broker_port))
            except OSError:
                if self._closed:
                    return
                continue
            self._socks += [client, server]
            conn_open = threading.Event()  # this connection's own gate (connection_only)
            conn_open.set()
            threading.Thread(target=self._requests, args=(client, server, conn_open), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, conn_open), daemon=True).start()

    def _pump(self, src, dst, conn_open) -> None:
        """Responses, as they come, while the gate is open."""
        try:
            while data := src.recv(65536):
                self.open.wait()
                conn_open.wait()
                dst.sendall(data)
        except OSError:
            pass
        self._shut(src, dst)

    def _requests(self, src, dst, conn_open) -> None:
        """Requests, one whole frame at a time, each looked at before it goes."""
        buf = b""
        try:
            while data := src.recv(65536):
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                    n = 4 + struct.unpack_from(">i", buf)[0]
                    frame, buf = buf[:n], buf[n:]
                    if delay := self._look(frame, conn_open):
                        self._closing.wait(delay)
                    self.open.wait()
                    conn_open.wait()
                    dst.sendall(frame)
        except (OSError, struct.error):
            pass
        self._shut(src, dst)

    def _look(self, frame: bytes, conn_open: threading.Event) -> float:
        """Hold the gate if the request is the armed one; its delay in seconds if it is to be slowed."""
        api_key = struct.unpack_from(">h", frame, 4)[0]
        n = struct.unpack_from(">h", frame, 12)[0]
        client_id = frame[14:14 + n].decode(errors="replace") if n > 0 else ""
        with self._lock:
            slow = self._slow and api_key in self._slow[0] and _named(client_id, self._slow[1], self._slow[3])
            self.slowed += bool(slow)
            if self._armed and api_key in self._armed[0] and _named(client_id, self._armed[1], self._armed[3]):
                connection_only = self._armed[2]
                self._armed = None
                self.request = (api_key, client_id)
                self.held_at = time.monotonic()
                if connection_only:
                    conn_open.clear()
                    self._held_conns.append(conn_open)
                else:
                    self.open.clear()
                self.held.set()
            return self._slow[2] if slow else 0.0

    def _shut(self, *socks) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
