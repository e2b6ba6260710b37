"""How the proving client reaches the daemon: the grpc channel arguments and the plain
connect probe that waits for something to listen.

Transport only (no RPC, no retry rule): :mod:`cuzk_supervisor.adapters.proving.client` opens its
channels with :func:`channel_options` and calls :func:`until_listening` before its first GetStatus.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from cuzk_supervisor.address import Address
from cuzk_supervisor.deadline import within

MIB = 1024 * 1024
# The daemon's own limit is 128 MiB each way; a PoRep input is ~51 MB and grpc-python's default
# receive limit is 4 MiB. Ours is higher than the server's so the server's is the one that counts.
MAX_MESSAGE_BYTES = 256 * MIB

LISTEN_PROBE_INTERVAL_S = 0.025


@dataclass(frozen=True, slots=True)
class Keepalive:
    """The client's HTTP/2 keepalive: a ping after ``time_ms`` without activity on a call,
    the connection given up ``timeout_ms`` after an unanswered ping.

    6 min is above grpc-core's 5 min floor with margin (see :func:`channel_options`).
    :meth:`scaled` divides both, so a test can check the same ratio against a server whose floor
    is divided by the same factor (the simulator's ``--keepalive-scale``) in seconds."""

    time_ms: int = 360_000
    timeout_ms: int = 20_000

    def scaled(self, factor: float) -> Keepalive:
        return Keepalive(round(self.time_ms / factor), round(self.timeout_ms / factor))


DEFAULT_KEEPALIVE = Keepalive()


async def until_listening(address: Address, budget_s: float) -> bool:
    """True once a plain connect to ``address`` succeeds; False when ``budget_s`` has passed."""
    end = time.monotonic() + max(0.0, budget_s)
    while True:
        try:
            if address.path is not None:
                connect = asyncio.open_unix_connection(str(address.path))
            else:
                connect = asyncio.open_connection(address.host, address.port)
            _, writer = await within(connect, LISTEN_PROBE_INTERVAL_S * 4)
        except (OSError, TimeoutError):
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(LISTEN_PROBE_INTERVAL_S)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True


def channel_options(keepalive: Keepalive = DEFAULT_KEEPALIVE) -> list[tuple[str, int]]:
    """grpc channel arguments for talking to the daemon (TCP or unix socket).

    Keepalive: a grpc-core server (default ``grpc.http2.min_ping_interval_without_data_ms`` of
    5 min, 2 strikes) answers pings that come more often with GOAWAY ``too_many_pings`` and drops
    every call on the connection; hyper/tonic servers also limit pings. So we ping rarely (6 min,
    above the 5 min floor with margin) and never on an idle connection (no pings without calls).
    Keepalive is only a backstop: our short per-call deadlines are what notice a dead daemon.

    Reconnect backoff: grpc-core's default grows to 120 s, so after a daemon restart the channel
    could sit in backoff long after the daemon answers; capped at 2 s. A channel of ours never
    shares its connection (``use_local_subchannel_pool``): a replaced channel must get a new
    connection, not the frozen one the old channel still holds.
    """
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.keepalive_time_ms", keepalive.time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.timeout_ms),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 2),
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]
