"""``within``: a deadline that never swallows the cancel meant to stop its caller."""

from __future__ import annotations

import asyncio

import pytest

from cuzk_supervisor.deadline import within


def test_a_cancel_arriving_as_the_awaited_thing_finishes_is_not_swallowed() -> None:
    async def main() -> None:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(within(fut, 10))
        await asyncio.sleep(0)  # the task now waits on fut
        fut.set_result(1)
        task.cancel()  # 3.11's wait_for returned 1 here and the cancel was lost
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_the_deadline_raises_timeout_and_a_prompt_answer_is_returned() -> None:
    async def main() -> None:
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with pytest.raises(TimeoutError):
            await within(never, 0.01)
        assert never.cancelled()
        assert await within(asyncio.sleep(0, "done"), 1) == "done"

    asyncio.run(main())
