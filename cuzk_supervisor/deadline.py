"""A deadline on one awaitable that a cancel always gets through.

``asyncio.wait_for`` on Python 3.11 swallows a cancel that arrives while the awaited thing is
finishing (it returns the result instead: gh-86296), so a loop built on it can ignore the
cancel meant to stop it and hang its caller's shutdown; it was seen as a bench that never ended
after its last proof, its status sampler still looping. ``asyncio.timeout`` counts cancels
(``Task.uncancel``) and does not lose them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """``await awaitable``, raising TimeoutError after ``timeout_s`` (None: no deadline)."""
    async with asyncio.timeout(timeout_s):
        return await awaitable
