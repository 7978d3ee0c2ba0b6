"""The HTTP endpoint: ``/metrics`` only (Prometheus text or OpenMetrics, as prometheus_client
negotiates with the scraper), no write path, a thread per request (prometheus_client's
ThreadingWSGIServer), 127.0.0.1 unless asked otherwise, TLS when given a certificate and key.

Binding happens when the endpoint is made, so a port in use, an address this machine does not
have or a certificate that does not load is an ``EndpointError`` (one sentence) before anything
is served; ``serve(collector)`` then starts answering.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from probes.records.errors import MemtopError

DEFAULT_BIND = "127.0.0.1"
PATH = "/metrics"


class EndpointError(MemtopError, ValueError):
    """The endpoint cannot be served as asked (bad input: exit 2)."""


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Scrapes come every few seconds from every Prometheus: not logged."""


def _only_metrics(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """``app`` on GET/HEAD /metrics; 404 for any other path, 405 for any other method."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"memtop serves /metrics only\n"]
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        return app(environ, start_response)

    return serve


CACHE_S = 0.05  # one rendering answers every scrape within this (the sources' own interval)


def _cached(app: Callable[..., Iterable[bytes]], max_age_s: float = CACHE_S
            ) -> Callable[..., Iterable[bytes]]:
    """``app``'s answer reused for the scrapes that ask the same (format, compression, query)
    within ``max_age_s``: the values change no faster (the recorder publishes rows every 50 ms,
    the folder collector reads files as often), and rendering the text is most of a scrape's
    cost (~1 ms; 100 scrapes a second would take a tenth of a core, in the training process
    for the in-process endpoint)."""
    lock = threading.Lock()
    cache: dict[tuple[str, str, str], tuple[float, str, list[tuple[str, str]], bytes]] = {}

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        key = (environ.get("HTTP_ACCEPT", ""), environ.get("HTTP_ACCEPT_ENCODING", ""),
               environ.get("QUERY_STRING", ""))
        with lock:
            hit = cache.get(key)
            if hit is None or time.monotonic() - hit[0] > max_age_s:
                answer: dict[str, Any] = {}

                def keep(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
                    answer["status"], answer["headers"] = status, headers

                body = b"".join(app(environ, keep))
                hit = (time.monotonic(), answer["status"], answer["headers"], body)
                if len(cache) > 16:  # scrapers that vary their headers: no growth
                    cache.clear()
                cache[key] = hit
        start_response(hit[1], hit[2])
        return [hit[3]]

    return serve


def check_port(port: Any) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise EndpointError(f"port must be between 0 and 65535 (0: a free one), got {port!r}")
    return port


def _tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise EndpointError("TLS needs both a certificate and its key (--tls-cert and "
                            "--tls-key)")
    for what, path in (("certificate", cert), ("key", key)):
        if not Path(path).is_file():
            raise EndpointError(f"TLS {what} {path} does not exist")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise EndpointError(f"cannot load the TLS certificate {cert} with key {key}: "
                            f"{getattr(exc, 'reason', None) or exc}") from None
    return context


class MetricsEndpoint:
    """An HTTP server bound to ``bind:port``, serving the collector handed to ``serve``."""

    def __init__(self, port: int, bind: str = DEFAULT_BIND, tls_cert: str | None = None,
                 tls_key: str | None = None) -> None:
        check_port(port)
        context = _tls_context(tls_cert, tls_key)
        try:
            infos = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except (socket.gaierror, UnicodeError, ValueError) as exc:
            raise EndpointError(f"cannot bind {bind!r}: not an address or a name this machine "
                                f"resolves ({getattr(exc, 'strerror', None) or exc})") from None
        family, _, _, _, sockaddr = infos[0]

        class Server(ThreadingWSGIServer):
            address_family = family

        self.registry = CollectorRegistry(auto_describe=False)
        try:
            app = _only_metrics(_cached(make_wsgi_app(self.registry)))
            self.httpd = make_server(sockaddr[0], port, app, Server, handler_class=_QuietHandler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise EndpointError(f"port {port} is already in use on {bind}; pick another "
                                    "port") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise EndpointError(f"cannot bind {bind}: this machine has no such "
                                    "address") from None
            raise EndpointError(f"cannot serve on {bind}:{port}: "
                                f"{exc.strerror or exc}") from None
        if context is not None:
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.bind = bind
        self.port = self.httpd.server_address[1]  # the one chosen when 0 was asked
        self.scheme = "https" if context is not None else "http"
        self._thread: threading.Thread | None = None
        self.collector: Collector | None = None

    @property
    def url(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{self.scheme}://{host}:{self.port}{PATH}"

    def serve(self, collector: Collector) -> MetricsEndpoint:
        """Answer scrapes from ``collector`` on a daemon thread (the server's own)."""
        self.registry.register(collector)
        self.collector = collector
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="memtop-metrics",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop answering and free the port; safe to call twice."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self.httpd.shutdown()
            thread.join(5.0)
        with contextlib.suppress(OSError):
            self.httpd.server_close()
        close = getattr(self.collector, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> MetricsEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
