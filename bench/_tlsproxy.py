"""A TLS-terminating proxy for ``bench/fleet.py``, in its own process: what a fleet behind a TLS
front costs in connections and bytes, handshakes included.

    python bench/_tlsproxy.py --upstream 127.0.0.1:PORT --cert PEM

prints ``tlsproxy https://127.0.0.1:P control http://127.0.0.1:C`` once it listens. Two hops,
both in this process, so that the bytes on the wire are counted as they are:

- a **relay** on ``P``: plain TCP, each client connection piped to the terminator; it counts
  every byte each way and cuts the stream into *turns* (a turn ends when the other side
  speaks): a TLS handshake is a few turns, then each HTTP exchange is one turn of the client
  and one of the server (HTTP/1.1 without pipelining). ``bench/_fleetfigures.py`` gives the
  last two turns per request to each request and the handshake to the connection's first;
- a **terminator**: TLS with ``--cert``, each connection piped, in plain text, to its own
  connection to ``--upstream`` (the simulated manager), kept open as long as the client's.

Connections stay open until the client closes them (no idle timeout): a new connection is the
client's choice. ``GET /stats`` on the control port answers every connection seen, in the
order they were accepted: ``[{"port", "turns": [[side, bytes], ...]}]``, side 0 the client's,
1 the server's. ``GET /outage/on`` is the manager's host gone: the relay stops listening (a
connect is refused) and every open connection is cut (reset); ``GET /outage/off`` listens
again on the same port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import sys
from dataclasses import dataclass, field

CHUNK = 64 * 1024


@dataclass
class Seen:
    port: int
    turns: list[list[int]] = field(default_factory=list)

    def add(self, side: int, size: int) -> None:
        if self.turns and self.turns[-1][0] == side:
            self.turns[-1][1] += size
        else:
            self.turns.append([side, size])


class Proxy:
    def __init__(self, upstream: tuple[str, int], cert: str) -> None:
        self.upstream = upstream
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert)
        self.seen: list[Seen] = []
        self.terminator_port = 0
        self.relay_port = 0
        self.relay_server: asyncio.Server | None = None
        self.clients: set[asyncio.StreamWriter] = set()

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        seen = Seen(int(peer[1]) if peer else 0)
        self.seen.append(seen)
        try:
            inner_r, inner_w = await asyncio.open_connection("127.0.0.1", self.terminator_port)
        except OSError:
            writer.close()
            return
        self.clients.add(writer)
        try:
            await _both(reader, inner_w, inner_r, writer, seen)
        finally:
            self.clients.discard(writer)

    async def outage(self, on: bool) -> None:
        if on and self.relay_server is not None:
            self.relay_server.close()
            self.relay_server = None
            for writer in list(self.clients):
                writer.transport.abort()
        elif not on and self.relay_server is None:
            self.relay_server = await asyncio.start_server(
                self.relay, "127.0.0.1", self.relay_port, backlog=4096
            )

    async def terminate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        await _both(reader, up_w, up_r, writer, None)

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            asked = await reader.readuntil(b"\r\n\r\n")
            target = asked.split(b" ", 2)[1] if asked.count(b" ") >= 2 else b""
            if target in (b"/outage/on", b"/outage/off"):
                await self.outage(target == b"/outage/on")
                body = json.dumps({"outage": self.relay_server is None}).encode()
            else:
                body = json.dumps([{"port": s.port, "turns": s.turns} for s in self.seen]).encode()
            head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
        writer.close()

    async def serve(self) -> None:
        terminator = await asyncio.start_server(
            self.terminate, "127.0.0.1", 0, ssl=self.context, backlog=4096
        )
        self.terminator_port = terminator.sockets[0].getsockname()[1]
        relay = await asyncio.start_server(self.relay, "127.0.0.1", 0, backlog=4096)
        self.relay_server = relay
        control = await asyncio.start_server(self.control, "127.0.0.1", 0)
        port = self.relay_port = relay.sockets[0].getsockname()[1]
        cport = control.sockets[0].getsockname()[1]
        print(f"tlsproxy https://127.0.0.1:{port} control http://127.0.0.1:{cport}", flush=True)
        async with terminator, control:
            await asyncio.Event().wait()


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen | None, side: int
) -> None:
    try:
        while data := await reader.read(CHUNK):
            if seen is not None:
                seen.add(side, len(data))
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


async def _both(
    client_r: asyncio.StreamReader,
    inner_w: asyncio.StreamWriter,
    inner_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    seen: Seen | None,
) -> None:
    try:
        await asyncio.gather(_pipe(client_r, inner_w, seen, 0), _pipe(inner_r, client_w, seen, 1))
    finally:
        for writer in (inner_w, client_w):
            writer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="host:port of the manager")
    parser.add_argument("--cert", required=True, help="PEM holding the certificate and its key")
    parser.add_argument("marker", nargs="?", help="ignored: names the run (leftovers are found)")
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    proxy = Proxy((host, int(port)), args.cert)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(proxy.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
