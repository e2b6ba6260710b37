"""The public listener: bytes proxied to the gRPC server on a private abstract unix socket.

Owning the listening socket is what lets the ``drop`` fault cut client connections at the
transport level (clients see UNAVAILABLE / connection reset, not a polite gRPC status), and
what lets the "ready" line come before the bind, as the real daemon's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import struct

from supervisor.address import Address

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


class Proxy:
    def __init__(self, upstream_path: str) -> None:
        self._upstream = upstream_path
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
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
        for client, upstream in conns:
            sock = client.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                # SO_LINGER 0: close with RST, as a crashed peer would.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.transport.abort()
            upstream.transport.abort()
        return len(conns)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self._upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._conns.add(pair)
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            self._conns.discard(pair)
            writer.transport.abort()
            up_writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then close the far side gracefully (flushing what is buffered)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
