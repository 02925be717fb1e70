"""Serving an app with uvicorn on a socket we bind ourselves: in the foreground (`llamacy serve`) or in a
background thread (tests, benchmarks). Binding first means the URL we print is the one that answers
(port 0 picks a free port) and a port in use is a one-line error, not a log dump."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from llamacy.errors import UsageError

GRACEFUL_SHUTDOWN_S = 3  # open streams get this long to finish on Ctrl-C, then they are cancelled


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)  # connections made before uvicorn runs wait in the backlog, not refused
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app: Any) -> Any:
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        server_header=False,
    )
    return uvicorn.Server(config)


def serve_forever(app: Any, sock: socket.socket) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn handles them)."""
    _server(app).run(sockets=[sock])


class ServerThread:
    """Serve `app` in a background thread on 127.0.0.1 (port 0: a free one); `url` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind(host, port)
        self.url = url_of(self.sock)
        self.server = _server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout: float = 10.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)  # uvicorn offers no event for "started"; this runs once, briefly
        if not self.server.started:
            raise RuntimeError("the server did not start")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
