"""The HTTP endpoint: ``/metrics`` only (Prometheus text or OpenMetrics, as prometheus_client
negotiates with the scraper), no write path, HTTP/1.1 with keep-alive and a thread per
connection (a scraper reuses its connection, as Prometheus does: a scrape then costs one parsed
request and one cached answer, benchmarks/cases/export/metrics_scrape.py), 127.0.0.1 unless
asked otherwise, TLS when given a certificate and key.

Binding happens when the endpoint is made, so a port in use, an address this machine does not
have or a certificate that does not load is an ``EndpointError`` (one sentence) before anything
is served; ``serve(collector)`` then starts answering.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import gzip
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from probes.records.errors import MemtopError

DEFAULT_BIND = "127.0.0.1"
PATH = "/metrics"


class EndpointError(MemtopError, ValueError):
    """The endpoint cannot be served as asked (bad input: exit 2)."""


CACHE_S = 0.05  # one rendering answers every scrape within this (the sources' own interval)
IDLE_S = 120.0  # a kept-alive connection with no request for this long is closed


class Rendering:
    """The exposition text of ``registry``, rendered at most once per ``max_age_s`` for each
    (format, compression, names) a scraper asks for: the values change no faster (the recorder
    publishes rows every 50 ms, the folder collector reads files as often), and rendering is
    most of a scrape's cost (~1 ms: 100 scrapes a second would take a tenth of a core, in the
    training process for the in-process endpoint)."""

    def __init__(self, registry: CollectorRegistry, max_age_s: float = CACHE_S) -> None:
        self.registry, self.max_age_s = registry, max_age_s
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, bool, tuple[str, ...]],
                          tuple[float, list[tuple[str, str]], bytes]] = {}

    def answer(self, accept: str, accept_encoding: str, query: str) \
            -> tuple[list[tuple[str, str]], bytes]:
        """(headers, body) for one scrape: Prometheus text or OpenMetrics as ``accept`` asks
        (prometheus_client's negotiation), gzip when accepted, ``name[]=`` filters honoured."""
        encoder, content_type = choose_encoder(accept)
        gz = "gzip" in accept_encoding.lower()
        names = tuple(parse_qs(query).get("name[]", ()))
        key = (content_type, gz, names)
        with self._lock:
            hit = self._cache.get(key)
            if hit is None or time.monotonic() - hit[0] > self.max_age_s:
                body = encoder(_Only(self.registry, names) if names else self.registry)
                headers = [("Content-Type", content_type)]
                if gz:
                    body = gzip.compress(body, compresslevel=1)
                    headers.append(("Content-Encoding", "gzip"))
                if len(self._cache) > 16:  # scrapers that vary their headers: no growth
                    self._cache.clear()
                hit = self._cache[key] = (time.monotonic(), headers, body)
        return hit[1], hit[2]


class _Only:
    """The registry's samples named in ``names`` (``?name[]=memtop_steps_total``): memtop's
    collectors describe nothing up front, so prometheus_client's restricted registry, which
    filters by the names collectors describe, would answer nothing."""

    def __init__(self, registry: CollectorRegistry, names: tuple[str, ...]) -> None:
        self.registry, self.names = registry, set(names)

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            samples = [s for s in family.samples if s.name in self.names]
            if samples:
                kept = copy.copy(family)
                kept.samples = samples
                yield kept


class _Handler(BaseHTTPRequestHandler):
    """GET/HEAD /metrics over HTTP/1.1 with keep-alive (a scraper's connection is reused, as
    Prometheus reuses it: no connection and thread per scrape); 404 for any other path, 405
    for any other method; nothing logged (scrapes come every few seconds from every
    Prometheus)."""

    protocol_version = "HTTP/1.1"
    server_version = "memtop"
    timeout = IDLE_S
    disable_nagle_algorithm = True  # an answer is one write; a kept connection never waits
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._metrics(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._metrics(head=True)

    def _refuse(self) -> None:
        self._send(405, [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")],
                   b"memtop serves GET /metrics only\n", head=False)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse  # noqa: N815

    def _metrics(self, head: bool) -> None:
        path, _, query = self.path.partition("?")
        if path != PATH:
            self._send(404, [("Content-Type", "text/plain")], b"memtop serves /metrics only\n",
                       head)
            return
        try:
            headers, body = self.server.rendering.answer(
                self.headers.get("Accept", ""), self.headers.get("Accept-Encoding", ""), query)
        except Exception as exc:  # a collector's bug: the scraper is told, the run goes on
            self._send(500, [("Content-Type", "text/plain")],
                       f"memtop could not render its metrics: {type(exc).__name__}: {exc}\n"
                       .encode(), head)
            return
        self._send(200, headers, body, head)

    def _send(self, code: int, headers: list[tuple[str, str]], body: bytes,
              head: bool) -> None:
        # the head and the body in one write: two small writes on a kept connection wait for
        # the peer's delayed ACK (~40 ms a scrape)
        lines = [f"{self.protocol_version} {code} {self.responses[code][0]}",
                 f"Server: {self.version_string()}", f"Date: {self.date_time_string()}",
                 *(f"{name}: {value}" for name, value in headers),
                 f"Content-Length: {len(body)}"]
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
                         + (b"" if head else body))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Not logged."""


class _Server(ThreadingHTTPServer):
    """A thread per connection; ``close_connections`` ends the kept-alive ones (a closed
    endpoint answers no more scrapes, however its scrapers held on)."""

    daemon_threads = True
    rendering: Rendering

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.discard(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper that hung up mid-request (reset, broken pipe, timeout): nothing to report,
        and socketserver's traceback would land in the training's terminal."""

    def close_connections(self) -> None:
        with self._open_lock:
            conns = list(self._open)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


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

        class Server(_Server):
            address_family = family

        self.registry = CollectorRegistry(auto_describe=False)
        try:
            self.httpd = Server((sockaddr[0], port), _Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise EndpointError(f"port {port} is already in use on {bind}; pick another "
                                    "port") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise EndpointError(f"cannot bind {bind}: this machine has no such "
                                    "address") from None
            raise EndpointError(f"cannot serve on {bind}:{port}: "
                                f"{exc.strerror or exc}") from None
        self.httpd.rendering = Rendering(self.registry)
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
        self.httpd.close_connections()
        with contextlib.suppress(OSError):
            self.httpd.server_close()
        close = getattr(self.collector, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> MetricsEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
