"""The public listener: bytes proxied to the gRPC server on a private abstract unix socket.

Owning the listening socket is what lets the ``drop`` fault cut client connections at the
transport level (clients see UNAVAILABLE / connection reset, not a polite gRPC status), the
``freeze`` fault silence them (open, but nothing read or written: a frozen path), and the
"ready" line come before the bind, as the real daemon's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import struct
from dataclasses import dataclass, field

from cuzk_supervisor.address import Address

CHUNK = 256 * 1024


def private_target(tag: str) -> tuple[str, str]:
    """(grpc target, asyncio path) of an abstract unix socket: no file to clean up."""
    name = f"cuzk-sim-{os.getpid()}-{tag}"
    return f"unix-abstract:{name}", f"\0{name}"


def remove_stale_socket(path: str) -> None:
    """The real daemon removes a leftover socket file at start (and never at exit)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)


@dataclass(slots=True)
class CallRules:
    """How the server treats a call's own deadline (tonic's rules; docs/daemon.md "Transport
    behaviour"): a call still running when the client's ``grpc-timeout`` expires is answered
    ``CANCELLED`` "Timeout expired". ``deadline_lead_s`` makes that answer come that many real
    seconds *before* the client's deadline (the ``cancel-early`` fault), so the race between
    the two timers is decided in tests instead of left to chance."""

    deadline_lead_s: float = 0.0


@dataclass(eq=False, slots=True)
class _Pair:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    frozen: bool = False
    never: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def freeze(self) -> None:
        """Stop reading both sides at once; the pumps stop writing. For good: the connection
        stays open and silent (no FIN, no RST) until the process ends or ``drop`` resets it."""
        if self.frozen:
            return
        self.frozen = True
        for writer in (self.client, self.upstream):
            transport = writer.transport  # typed as writing only; a socket's reads too
            with contextlib.suppress(RuntimeError):
                if isinstance(transport, asyncio.ReadTransport):
                    transport.pause_reading()


class Proxy:
    def __init__(self, upstream_path: str) -> None:
        self._upstream = upstream_path
        self._conns: set[_Pair] = set()
        self._freeze_until = 0.0
        self.server: asyncio.Server | None = None

    async def listen(self, address: Address) -> None:
        """Bind ``address``; raises OSError (e.g. EADDRINUSE) as a real bind would."""
        if address.path is not None:
            remove_stale_socket(str(address.path))
            self.server = await asyncio.start_unix_server(self._serve, path=str(address.path))
        else:
            self.server = await asyncio.start_server(self._serve, address.host, address.port)

    def drop_all(self) -> int:
        """Reset every proxied connection at once; returns how many there were."""
        conns = list(self._conns)
        self._conns.clear()
        for pair in conns:
            client, upstream = pair.client, pair.upstream
            sock = client.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                # SO_LINGER 0: close with RST, as a crashed peer would.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.transport.abort()
            upstream.transport.abort()
        return len(conns)

    def freeze_all(self, window_s: float) -> int:
        """Freeze every connection now and every one accepted in the next ``window_s`` seconds
        (a stopped peer or a dead path); later connections work. Returns how many froze now."""
        loop = asyncio.get_running_loop()
        self._freeze_until = max(self._freeze_until, loop.time() + window_s)
        for pair in self._conns:
            pair.freeze()
        return len(self._conns)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self._upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(writer, up_writer)
        self._conns.add(pair)
        if asyncio.get_running_loop().time() < self._freeze_until:
            pair.freeze()
        try:
            await asyncio.gather(_pump(reader, up_writer, pair), _pump(up_reader, writer, pair))
        finally:
            self._conns.discard(pair)
            writer.transport.abort()
            up_writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pair: _Pair) -> None:
    """Copy until EOF, then close the far side gracefully (flushing what is buffered).
    A frozen pair's pump keeps what it read and waits for ever."""
    try:
        while data := await reader.read(CHUNK):
            if pair.frozen:
                await asyncio.shield(pair.never)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
