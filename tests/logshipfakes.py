"""The log shipper's test rig: a fake ``/api/log-push`` recording each push on the loop's
clock, answers to switch it to, and ``shipped``, which runs a scenario beside a running shipper
on virtual time (``cuzk_supervisor.sim.vtime``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from cuzk_supervisor.adapters.logship.shipper import LogShipper, ShipperSettings
from cuzk_supervisor.adapters.manager.client import ManagerClient, ManagerRetry
from cuzk_supervisor.adapters.manager.wire import (
    ConnectFailed,
    FunctionTransport,
    HttpAnswer,
    HttpRequest,
)
from cuzk_supervisor.sim import vtime
from cuzk_supervisor.sim.manager.proxy import proxy_error_page

URL = "http://manager.test"
FAST = ManagerRetry(backoff_base_s=0.001, backoff_max_s=0.005)
KB = 1000.0


# --- the shipper, on virtual time -----------------------------------------------------------


class LogManager:
    """Fake ``/api/log-push``: records each push (its time on the loop's clock, source and
    lines); ``answer`` says how to answer it (default the manager's 204); ``gate`` holds every
    push until it is opened."""

    def __init__(self) -> None:  # made inside the loop that runs it
        self.pushes: list[tuple[float, str, list[str]]] = []
        self.attempts: list[float] = []
        self.answer: Callable[[HttpRequest], HttpAnswer] = lambda _: HttpAnswer(204)
        self.gate: asyncio.Event | None = None
        self.attempted = asyncio.Event()
        self.pushed = asyncio.Event()

    async def handler(self, request: HttpRequest) -> HttpAnswer:
        self.attempts.append(asyncio.get_running_loop().time())
        self.attempted.set()
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answer(request)
        headers = dict(request.headers)
        assert headers["X-Instance-UUID"] == "u-1"
        if answer.status == 204:
            lines = request.body.decode().splitlines()
            self.pushes.append((self.attempts[-1], headers["X-Log-Source"], lines))
            self.pushed.set()
        return answer

    def lines(self, source: str | None = None) -> list[str]:
        return [line for _, src, lines in self.pushes if source in (None, src) for line in lines]

    def bytes(self, source: str | None = None) -> int:
        return sum(len(line.encode()) + 1 for line in self.lines(source))


def away(_: HttpRequest) -> HttpAnswer:
    raise ConnectFailed("refused")


def nginx_404(_: HttpRequest) -> HttpAnswer:
    return HttpAnswer.of_text(404, proxy_error_page(404), "text/html", {"Server": "nginx"})


Scenario = Callable[[LogShipper, LogManager], Awaitable[Any]]


def shipped(
    scenario: Scenario, settings: ShipperSettings | None = None, uuid: str | None = "u-1",
) -> tuple[LogShipper, LogManager, Any]:  # fmt: skip
    """Run ``scenario`` beside a running shipper on virtual time; the shipper stopped after."""
    fake = LogManager()

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        client = ManagerClient(URL, retry=FAST, transport=FunctionTransport(fake.handler),
                               clock=loop.time)  # fmt: skip
        shipper = LogShipper(client, settings or ShipperSettings(), uuid=uuid)
        task = asyncio.create_task(shipper.run())
        try:
            result = await scenario(shipper, fake)
        finally:
            shipper.stop()
            if fake.gate is not None:
                fake.gate.set()
            await asyncio.wait_for(task, 60.0)
        holder.append(shipper)
        return result

    holder: list[LogShipper] = []
    result = vtime.run(main())
    return holder[0], fake, result


async def chatty(shipper: LogShipper, source: str, per_s: int, seconds: float) -> None:
    """A child writing ``per_s`` lines a second for ``seconds`` (a tenth of a second at a time)."""
    n = 0
    for _ in range(int(seconds * 10)):
        for _ in range(per_s // 10):
            n += 1
            shipper.add_line(source, f"{source} line {n:07d} " + "x" * 60)
        await asyncio.sleep(0.1)
