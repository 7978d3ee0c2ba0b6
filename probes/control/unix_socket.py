"""A live run's request socket: a unix domain socket in its run folder, mode 0600, never TCP.

Protocol: the client connects, sends one JSON object on one line, and reads one JSON object back.
``{"request": "profile"}`` (any of probes.control.requests.REQUESTS, optionally with "at_step",
"source", "reason") is answered ``{"ok": true, ...}`` at once and acted on at the next step boundary
(or at "at_step"); what it did shows up as the usual event rows in metrics.jsonl, so every viewer
sees it. ``{"request": "ping"}`` answers the run's pid, rank, step and state. Bad JSON or an unknown
request gets ``{"ok": false, "error": "..."}``.

A socket file left behind by a dead run refuses connections: a client reports "not live" at
once, never hangs. Paths longer than AF_UNIX allows (~107 bytes) are reached through
/proc/self/fd/N/<name>, with N an open descriptor of the run folder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from probes.control.requests import REQUESTS, Request, RunControl

MAX_REQUEST_BYTES = 4096
_SUN_PATH_MAX = 100  # conservative: Linux allows 107 bytes + NUL


class NotLive(OSError):
    """No live run answers on this socket (none, a stale file, or no answer in time)."""


@contextlib.contextmanager
def _short_path(path: Path) -> Iterator[str]:
    """A path to ``path`` short enough for AF_UNIX."""
    if len(os.fsencode(str(path))) <= _SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def request(path: Path, payload: dict[str, Any], timeout_s: float = 3.0) -> dict[str, Any]:
    """Send one request and return the answer; NotLive when no live run is listening."""
    path = Path(path)
    if not path.exists():
        raise NotLive(errno.ENOENT, f"no control socket at {path}: the run is not live")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        with _short_path(path) as target:
            sock.connect(target)
        sock.sendall(json.dumps(payload).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n") and len(data) < 1 << 20:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionRefusedError, FileNotFoundError) as exc:
        raise NotLive(exc.errno or errno.ECONNREFUSED,
                      f"{path} is left from a run that is no longer live") from None
    except TimeoutError:
        raise NotLive(errno.ETIMEDOUT, f"the run at {path} did not answer in {timeout_s:g} s") \
            from None
    except OSError as exc:
        raise NotLive(exc.errno or errno.EIO, f"cannot reach the run at {path}: "
                                              f"{exc.strerror or exc}") from None
    finally:
        sock.close()
    try:
        answer = json.loads(data)
    except ValueError:
        raise NotLive(errno.EPROTO, f"the run at {path} sent no readable answer") from None
    if not isinstance(answer, dict):
        raise NotLive(errno.EPROTO, f"the run at {path} sent no readable answer")
    return answer


def parse_request(line: bytes) -> Request | str:
    """A request line -> Request, or the error sentence to answer with ("ping" -> "ping")."""
    try:
        payload = json.loads(line)
    except (ValueError, RecursionError):
        return "bad JSON: send one JSON object per line, e.g. {\"request\": \"profile\"}"
    if not isinstance(payload, dict) or not isinstance(payload.get("request"), str):
        return "a request is a JSON object with a \"request\" field"
    kind = payload["request"]
    if kind == "ping":
        return "ping"
    if kind not in REQUESTS:
        return f"unknown request {kind!r}; use one of ping, {', '.join(REQUESTS)}"
    source = payload.get("source", "viewer")
    reason = payload.get("reason")
    if not isinstance(source, str) or (reason is not None and not isinstance(reason, str)):
        return "source and reason must be strings"
    try:
        return Request(kind, payload.get("at_step"), source[:64],
                       reason[:200] if reason else None)
    except ValueError as exc:
        return str(exc)


class ControlServer:
    """Listens on the run's socket in a daemon thread (never on the step path).

    ``status()`` gives the ping answer; ``refuse(request)`` returns a sentence when this run
    cannot do it (e.g. no leak demo outside memtop's own trainer), else None.
    """

    def __init__(self, path: Path, control: RunControl, status: Callable[[], dict[str, Any]],
                 refuse: Callable[[Request], str | None] = lambda r: None) -> None:
        self.path = Path(path)
        self.control = control
        self.status = status
        self.refuse = refuse
        self.error: str | None = None
        self.requests = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def start(self) -> bool:
        """Bind and listen; False (with ``error`` set) when the socket cannot be made."""
        try:
            self._sock = self._bind()
        except OSError as exc:
            self.error = f"no control socket: {exc.strerror or exc}"
            return False
        self._thread = threading.Thread(target=self._serve, name="memtop-control", daemon=True)
        self._thread.start()
        return True

    def _bind(self) -> socket.socket:
        """Bind in a private (0700) folder, chmod 0600, then move into place: the socket is
        never reachable with looser permissions, whatever the umask."""
        if self.path.exists():
            try:
                request(self.path, {"request": "ping"}, timeout_s=1.0)
                raise OSError(errno.EADDRINUSE, f"a live run already listens on {self.path}")
            except NotLive:
                self.path.unlink()  # stale: left by a run that died
        private = Path(tempfile.mkdtemp(prefix=".sock-", dir=self.path.parent))
        tmp = private / self.path.name
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with _short_path(tmp) as target:
                sock.bind(target)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
            sock.listen(8)
            sock.settimeout(0.25)
        except BaseException:
            sock.close()
            raise
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
            with contextlib.suppress(OSError):
                private.rmdir()
        return sock

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._closed.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):
                    self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\n" not in data and len(data) <= MAX_REQUEST_BYTES:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            reply: dict[str, Any] = {"ok": False, "error": "request too long"}
        else:
            reply = self.handle(data.split(b"\n", 1)[0])
        conn.sendall(json.dumps(reply, default=str).encode() + b"\n")

    def handle(self, line: bytes) -> dict[str, Any]:
        """One request line -> the answer (the request is queued when accepted)."""
        parsed = parse_request(line)
        if parsed == "ping":
            return {"ok": True, "request": "ping", **self.status()}
        if isinstance(parsed, str):
            return {"ok": False, "error": parsed}
        refusal = self.refuse(parsed)
        if refusal:
            return {"ok": False, "request": parsed.kind, "error": refusal}
        self.requests += 1
        self.control.submit(parsed)
        status = self.status()
        return {"ok": True, "request": parsed.kind, "at_step": parsed.at_step,
                "step": status.get("step"), "pid": status.get("pid"), "rank": status.get("rank")}

    def close(self, wait_s: float = 2.0) -> None:
        """Stop listening and remove the socket file (a finished run is not live)."""
        self._closed.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        if self._thread is not None and wait_s > 0:
            self._thread.join(timeout=wait_s)
        with contextlib.suppress(OSError):
            self.path.unlink()
