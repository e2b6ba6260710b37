"""What a failed call to the proving daemon means: the errors the proving client raises and
the classifiers of a call's outcome (cut by a deadline, refused before anything was sent,
cancelled by our own process, nothing received).

The rules they serve are in :mod:`cuzk_supervisor.adapters.proving.client`.
"""

from __future__ import annotations

import grpc

from cuzk_supervisor.address import Address

# grpc-core's message when a call failed because the channel could not connect: nothing was sent.
_CONNECT_FAILURE_MARK = "failed to connect to all addresses"
# grpc-core's message for a call our own process cancelled (not the server).
_LOCAL_CANCEL_MARK = "Locally cancelled"


class ProvingError(Exception):
    """Base of the errors the proving client raises (results of proofs are values, not errors)."""


class DaemonNotReady(ProvingError):
    """The daemon did not answer GetStatus within the startup deadline."""

    def __init__(self, address: Address, waited_s: float, calls: int, last_error: str) -> None:
        self.address = address
        self.waited_s = waited_s
        self.calls = calls
        self.last_error = last_error
        super().__init__(
            f"daemon at {address} not ready after {waited_s:.1f} s "
            f"({calls} GetStatus calls); last error: {last_error}"
        )


class DaemonCallError(ProvingError):
    """A short call (GetStatus, GetMetrics) failed."""

    def __init__(self, method: str, address: Address, code: grpc.StatusCode, details: str) -> None:
        self.method = method
        self.address = address
        self.code = code
        self.details = details
        super().__init__(f"{method} to {address} failed: {code.name}: {details}")


class ServerTimedOut(Exception):
    """AwaitProof answered with status TIMEOUT (a server that honours timeout_ms): await again."""


class OutOfBudget(Exception):
    """No budget is left for another call."""


def code_of(exc: BaseException) -> grpc.StatusCode | None:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    if isinstance(exc, ServerTimedOut):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return None


def describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, ServerTimedOut):
        return "AwaitProof answered TIMEOUT"
    return f"{type(exc).__name__}: {exc}"


def is_connect_failure(exc: BaseException) -> bool:
    """True when a call failed because the channel could not connect: the server got nothing.
    grpc-core reports a refused connection or a missing unix socket as UNAVAILABLE with "failed
    to connect to all addresses"; a connection dropped *during* a call (or a server aborting with
    UNAVAILABLE) has other details: the request may have arrived."""
    return (
        isinstance(exc, grpc.aio.AioRpcError)
        and exc.code() == grpc.StatusCode.UNAVAILABLE
        and _CONNECT_FAILURE_MARK in (exc.details() or "")
    )


def is_own_cancel(exc: BaseException) -> bool:
    """True for a CANCELLED our own process caused (grpc-core's "Locally cancelled ...")."""
    return (
        isinstance(exc, grpc.aio.AioRpcError)
        and exc.code() == grpc.StatusCode.CANCELLED
        and _LOCAL_CANCEL_MARK in (exc.details() or "")
    )


CUT_CODES: frozenset[grpc.StatusCode] = frozenset(
    {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
"""A call cut by a deadline: ours (DEADLINE_EXCEEDED) or the server's (tonic: CANCELLED
"Timeout expired"; grpc-go: CANCELLED "Stream removed")."""


def is_cut(exc: BaseException) -> bool:
    """A call cut by a deadline, whoever cut it; never one our own code cancelled."""
    return code_of(exc) in CUT_CODES and not is_own_cancel(exc)


def received_nothing(exc: BaseException) -> bool:
    """The call ended without a word from the server: our own deadline fired."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
