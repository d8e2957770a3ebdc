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

`refuse_produce` arms a refusal: the first Produce request of such a client is held, not
sent on; when that client's next Produce request arrives on the same connection, the
gate answers the held one itself as a broker answers a partition it does not lead yet
(NOT_LEADER_OR_FOLLOWER, every partition in it) and sends the next one on to the broker.
That is what a freshly created topic's leader does to a producer for a moment, made to
happen on demand with a second request of the same partition in flight. With
`answer=False` the held request is dropped instead, never answered: a request lost on
the way, which a producer with acks=0 never hears of.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

PRODUCE = 0
NOT_LEADER_OR_FOLLOWER = 6
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
        self._refuse: str | None = None  # client prefix whose first Produce request is refused (refuse_produce)
        self._answer = True  # the refusal is answered (NOT_LEADER_OR_FOLLOWER), or the request dropped
        self.refused = threading.Event()  # that request is held, waiting for the client's next Produce request
        self.refused_partitions: list[tuple[str, int]] = []  # (topic, partition) the refusal named
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

    def refuse_produce(self, client_prefix: str, answer: bool = True) -> None:
        with self._lock:
            self._refuse, self._answer = client_prefix, answer
            self.refused.clear()
            self.refused_partitions = []

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
            to_client = threading.Lock()  # the broker's responses and the gate's own answers, whole frames each
            threading.Thread(target=self._requests, args=(client, server, conn_open, to_client), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, conn_open, to_client), daemon=True).start()

    def _pump(self, src, dst, conn_open, to_client) -> None:
        """Responses, one whole frame at a time, as they come, while the gate is open."""
        buf = b""
        try:
            while data := src.recv(65536):
                buf += data
                self.open.wait()
                conn_open.wait()
                n = _whole_frames(buf)
                with to_client:
                    dst.sendall(buf[:n])
                buf = buf[n:]
        except OSError:
            pass
        self._shut(src, dst)

    def _requests(self, src, dst, conn_open, to_client) -> None:
        """Requests, one whole frame at a time, each looked at before it goes."""
        buf = b""
        held = None  # a refused Produce request, answered when its client's next one comes
        try:
            while data := src.recv(65536):
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                    n = 4 + struct.unpack_from(">i", buf)[0]
                    frame, buf = buf[:n], buf[n:]
                    if self._to_refuse(frame):
                        held = frame
                        self.refused.set()
                        continue
                    if held is not None and struct.unpack_from(">h", frame, 4)[0] == PRODUCE:
                        refusal = self._refusal(held)
                        if self._answer:
                            with to_client:
                                src.sendall(refusal)
                        held = None
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

    def _to_refuse(self, frame: bytes) -> bool:
        api_key = struct.unpack_from(">h", frame, 4)[0]
        n = struct.unpack_from(">h", frame, 12)[0]
        client_id = frame[14:14 + n].decode(errors="replace") if n > 0 else ""
        with self._lock:
            if api_key == PRODUCE and self._refuse is not None and client_id.startswith(self._refuse):
                self._refuse = None
                return True
        return False

    def _refusal(self, frame: bytes) -> bytes:
        """The response a broker gives Produce request `frame` (a flexible version, 9 and up)
        when it leads none of its partitions: NOT_LEADER_OR_FOLLOWER for each."""
        version, corr = struct.unpack_from(">hi", frame, 6)
        if version < 9:
            raise AssertionError(f"Produce v{version}: the gate answers only the flexible versions (9 and up)")
        r = _Reader(frame, 14 + max(0, struct.unpack_from(">h", frame, 12)[0]))
        r.tags()  # request header v2
        r.compact_bytes()  # transactional_id
        r.skip(2 + 4)  # acks, timeout_ms
        topics = []
        for _ in range(r.varint() - 1):
            name = r.compact_bytes()
            parts = []
            for _ in range(r.varint() - 1):
                parts.append(struct.unpack(">i", r.skip(4))[0])
                r.compact_bytes()  # records
                r.tags()
            r.tags()
            topics.append((name, parts))
            self.refused_partitions += [(name.decode(), p) for p in parts]
        body = _uvarint(len(topics) + 1)
        for name, parts in topics:
            body += _uvarint(len(name) + 1) + name + _uvarint(len(parts) + 1)
            for p in parts:
                # index, error, base_offset, log_append_time_ms, log_start_offset, record_errors (empty),
                # error_message (null), tagged fields
                body += struct.pack(">ihqqq", p, NOT_LEADER_OR_FOLLOWER, -1, -1, -1) + b"\x01\x00\x00"
            body += b"\x00"
        body += struct.pack(">i", 0) + b"\x00"  # throttle_time_ms, tagged fields
        payload = struct.pack(">i", corr) + b"\x00" + body  # response header v1: correlation id, tagged fields
        return struct.pack(">i", len(payload)) + payload

    def _shut(self, *socks) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _whole_frames(buf: bytes) -> int:
    """How many bytes at the start of `buf` are whole size-prefixed frames."""
    at = 0
    while len(buf) - at >= 4 and len(buf) - at >= 4 + struct.unpack_from(">i", buf, at)[0]:
        at += 4 + struct.unpack_from(">i", buf, at)[0]
    return at


def _uvarint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


class _Reader:
    """Reads the Kafka protocol's flexible-version fields from `buf` at `at`."""

    def __init__(self, buf: bytes, at: int):
        self.buf, self.at = buf, at

    def skip(self, n: int) -> bytes:
        self.at += n
        return self.buf[self.at - n:self.at]

    def varint(self) -> int:
        n = shift = 0
        while True:
            b = self.buf[self.at]
            self.at += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    def compact_bytes(self) -> bytes:
        n = self.varint()
        return self.skip(n - 1) if n else b""

    def tags(self) -> None:
        for _ in range(self.varint()):
            self.varint()
            self.skip(self.varint())
