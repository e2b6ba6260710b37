"""The simulated manager's listening socket, which can refuse connections for a while.

Refusing is real: the listening socket is closed and the port is held by a socket that is bound
but not listening, so the kernel answers a connect with RST (ECONNREFUSED) and no other process
can take the port meanwhile. Connections already open (a client's keep-alive pool) are shut
down too, so nothing is answered during the window, as when a real manager restarts.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

POLL_INTERVAL = 0.05  # how quickly serve_forever notices a shutdown request


class ManagerHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server that knows its open connections (to drop them when refusing)
    and stays quiet about clients that went away."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    # As Go's listener: the kernel's own limit (somaxconn), not socketserver's 5, so a fleet
    # connecting in the same second is queued, not dropped into SYN retransmits.
    request_queue_size = 4096

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        app: Any,
        family: socket.AddressFamily = socket.AF_INET,
    ) -> None:
        self.address_family = family
        super().__init__(address, handler, bind_and_activate=False)
        self.socket.close()  # Listener puts its own socket in place
        self.app = app
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def drop_connections(self, keep: socket.socket | None = None) -> int:
        """Shut down every open connection but ``keep``; their handlers see EOF or EPIPE."""
        with self._conns_lock:
            victims = [c for c in self._conns if c is not keep]
        for conn in victims:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        return len(victims)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # the client left, or we dropped it while refusing
            return
        super().handle_error(request, client_address)


class Listener:
    """Owns the port: listen, refuse for a while, listen again, stop. Thread-safe."""

    def __init__(
        self, server: ManagerHTTPServer, host: str, port: int, say: Callable[[str], None]
    ) -> None:
        self.server = server
        self.host = host
        self.port = port
        self._say = say
        self._cond = threading.Condition()
        self._listening = False
        self._stopped = False
        self._announced = False
        self._refuse_until = 0.0
        self._serve_thread: threading.Thread | None = None
        self._timer = threading.Thread(target=self._run_timer, name="listener-timer", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def listening(self) -> bool:
        with self._cond:
            return self._listening

    def start(self, refuse_for: float = 0.0) -> None:
        """Bind the port (OSError if taken); listen now, or after ``refuse_for`` seconds."""
        with self._cond:
            self._reserve()
            if refuse_for > 0:
                self._refuse_until = time.monotonic() + refuse_for
                self._say(f"sim-manager refusing connections on {self.url} for {refuse_for:g}s")
            else:
                self._open()
        self._timer.start()

    def refuse(self, seconds: float, keep: socket.socket | None = None) -> None:
        """From now, refuse connections for ``seconds`` (extending a window already running);
        every open connection but ``keep`` (the one asking) is shut down. Returns once new
        connections are refused."""
        with self._cond:
            if self._stopped:
                return
            self._refuse_until = max(self._refuse_until, time.monotonic() + seconds)
            if self._listening:
                self._close(keep)
                self._say(f"sim-manager refusing connections for {seconds:g}s")
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            if self._stopped:
                return
            self._stopped = True
            if self._listening:
                self._close(None)
            self.server.socket.close()
            self._cond.notify_all()
        if self._timer.is_alive():
            self._timer.join(timeout=5)

    # --- under self._cond ----------------------------------------------------------------
    def _reserve(self) -> None:
        """Hold the port with a bound, not listening socket: connects are refused."""
        sock = socket.socket(self.server.address_family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except BaseException:
            sock.close()
            raise
        self.port = int(sock.getsockname()[1])
        self.server.socket = sock
        self.server.server_address = sock.getsockname()

    def _open(self) -> None:
        self.server.socket.listen(self.server.request_queue_size)
        self._serve_thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL},
            name="accept",
            daemon=True,
        )
        self._serve_thread.start()
        self._listening = True
        if not self._announced:
            self._announced = True
            self._say(f"sim-manager listening on {self.url}")
        else:
            self._say(f"sim-manager accepting connections again on {self.url}")

    def _close(self, keep: socket.socket | None) -> None:
        self.server.shutdown()  # returns once serve_forever has left its loop
        if self._serve_thread is not None:
            self._serve_thread.join()
            self._serve_thread = None
        self.server.socket.close()  # the backlog's unaccepted connections are reset
        self._listening = False
        if not self._stopped:
            self._reserve()
        self.server.drop_connections(keep)

    def _run_timer(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._listening:
                    self._cond.wait()
                    continue
                remaining = self._refuse_until - time.monotonic()
                if remaining <= 0:
                    self._open()
                else:
                    self._cond.wait(remaining)
