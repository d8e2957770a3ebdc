"""The supervisor's HTTP endpoint: Prometheus `/metrics` and a readiness probe `/ready`.

    GET /ready    200 "cache 'txmeta' ready"          when wait_ready would return now
                  503 "cache 'txmeta' not ready ...: <why>"  otherwise (the reason
                  wait_ready would give: no live supervisor, waiting for the broker,
                  partitions not assigned or not caught up, ...); 503 too when the
                  cache does not exist
    GET anything else: the Prometheus exposition (prometheus-client's WSGI app)

For a load balancer's health check or a Kubernetes readinessProbe (httpGet /ready):
a machine whose replica is not whole, or behind, takes no traffic. The readiness is
read from the segment at request time (control.wait_ready with timeout 0), no state
of its own.
"""

from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

PATH = "/ready"


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # a probe every second must not fill the log
        pass


def app(collector, metrics_app):
    """WSGI app: /ready from `collector.readiness()`, the rest to `metrics_app`."""

    def serve(environ, start_response):
        if environ.get("PATH_INFO") == PATH:
            ok, why = collector.readiness()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")])
            return [(why + "\n").encode()]
        return metrics_app(environ, start_response)

    return serve


def start(collector, registry, host: str, port: int):
    """Serve /metrics and /ready on host:port from a daemon thread; returns (server, thread)."""
    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(host, port, app(collector, make_wsgi_app(registry)), Server, handler_class=_Quiet)
    t = threading.Thread(target=httpd.serve_forever, name="shmcache-metrics", daemon=True)
    t.start()
    return httpd, t
