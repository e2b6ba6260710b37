"""One manager's requests: each call tried again on what is transient, under the manager's one
shared backoff, with its counts, its away warnings and its weather episodes.

- An attempt's answer is read by :func:`cuzk_supervisor.adapters.manager.answers.read_answer`:
  the manager's answer, its final word (InstanceGone, ManagerRejected: raised at once), or
  weather (retried). No answer at all (refused, timed out, dropped) is retried too.
- The one :class:`SharedBackoff` paces every call (see the client's rules). A call ends when it
  is answered or its stop (or the caller's ``stop_s``) has run out: :class:`ManagerUnavailable`,
  its work kept by the caller.
- ``once``: one attempt at most, and none while the backoff holds requests back (the log push).
- Time is the injected ``clock`` (waits are the event loop's): the fleet benchmark drives
  these through virtual time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from cuzk_supervisor.adapters.manager.answers import read_answer
from cuzk_supervisor.adapters.manager.away import AwayWarnings, WeatherLines
from cuzk_supervisor.adapters.manager.values import (
    BadAnswer,
    InstanceGone,
    ManagerRejected,
    ManagerRetry,
    ManagerTimeouts,
    ManagerUnavailable,
    Weather,
    describe_failure,
    is_transient,
)
from cuzk_supervisor.adapters.manager.wire import HttpAnswer, HttpRequest, Transport
from cuzk_supervisor.core.backoff import SharedBackoff

__all__ = ["Attempts", "Check"]

Check = Callable[[HttpAnswer], object]
"""Raises BadAnswer when a 2xx is not the API's answer."""


class Attempts:
    def __init__(
        self,
        transport: Transport,
        url: str | None,
        timeouts: ManagerTimeouts,
        retry: ManagerRetry,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        rng: random.Random,
        weather_s: float,
    ) -> None:
        self.transport = transport
        self.timeouts = timeouts
        self.retry = retry
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng
        self.backoff = SharedBackoff(retry.backoff_base_s, retry.backoff_max_s,
                                     retry.retry_after_max_s)  # fmt: skip
        self.away = AwayWarnings(url, every_s=retry.warn_every_s, clock=clock)
        self.weather = WeatherLines(url, weather_s, clock)
        self._probe = asyncio.Lock()  # while failing: one request at a time
        self.requests = 0

    async def call(
        self,
        call: str,
        request: HttpRequest,
        *,
        path: str,
        uuid: str | None = None,
        stop_s: float | None = None,
        check: Check | None = None,
        once: bool = False,
    ) -> HttpAnswer:
        """``request`` until the manager answers it; the 2xx answer, or raise InstanceGone,
        ManagerRejected or ManagerUnavailable."""
        clock = self._clock
        policy = self.retry.policy(call)
        started = clock()
        budget = policy.stop_s if stop_s is None else min(policy.stop_s, stop_s)
        deadline = started + max(budget, 0.0)
        attempts = 0
        last: BaseException | None = None
        while True:
            now = clock()
            wait = self.backoff.wait_s(now)
            if wait > 0:
                if once:
                    reason = f"held back by the shared backoff for {wait:.1f}s more"
                    raise ManagerUnavailable(call, 0, reason)
                # Not before the shared backoff (or a Retry-After) says: even a new call waits.
                # Past the call's stop, the stop is used up first: never a busy retry loop.
                await asyncio.sleep(min(wait, max(deadline - now, 0.0)))
                after = clock()
                if after >= deadline and (attempts or self.backoff.wait_s(after) > 0):
                    break
                continue
            probing = self.backoff.failing
            if probing:
                # The manager is failing: one request at a time finds out whether it is back.
                try:
                    async with asyncio.timeout(max(deadline - clock(), 0.001)):
                        await self._probe.acquire()
                except TimeoutError:
                    break
                if self.backoff.wait_s(clock()) > 0:
                    self._probe.release()  # another call's probe failed meanwhile
                    continue
            attempts += 1
            try:
                answer = await self._once(call, request, path, uuid, check, deadline)
            except (InstanceGone, ManagerRejected):
                self._answered(call)  # the manager's own word
                raise
            except Exception as exc:
                if not is_transient(exc):
                    raise
                last = exc
                self._failed(call, attempts, exc)
                if once or clock() + self.backoff.wait_s(clock()) >= deadline:
                    break
                continue
            finally:
                if probing:
                    self._probe.release()
            self._answered(call)
            return answer
        reason = "the manager's backoff outlasted this call's stop"
        if last is not None:
            reason = describe_failure(last)
        self.away.gave_up(call, attempts, clock() - started, reason)
        raise ManagerUnavailable(call, attempts, reason, weather=isinstance(last, Weather),
                                 bad_answer=_answers_for_it(last))  # fmt: skip

    async def _once(
        self,
        call: str,
        request: HttpRequest,
        path: str,
        uuid: str | None,
        check: Check | None,
        deadline: float,
    ) -> HttpAnswer:
        """One request; weather or no answer raises (Weather, BadAnswer, TransportError)."""
        self.requests += 1
        # The caller's deadline also cuts the attempt itself, not only the retrying.
        limits = self.timeouts.limits(deadline - self._clock())
        answer = await self.transport.send(request, limits)
        answer = read_answer(call, path, uuid, answer, self._wall())
        if check is not None:
            check(answer)  # a 2xx that is not the API's answer is weather (BadAnswer)
        return answer

    def _failed(self, call: str, attempt: int, exc: BaseException) -> None:
        after = exc.retry_after_s if isinstance(exc, Weather) else None
        pause = self.backoff.failed(self._clock(), self._rng.random(), after)
        if isinstance(exc, Weather):
            self.weather.seen(exc.status, exc.described)
        self.away.failed(call, attempt, describe_failure(exc), pause, retry_after=after is not None)

    def _answered(self, call: str) -> None:
        self.backoff.answered()
        self.away.answered(call)
        self.weather.check()


def _answers_for_it(exc: BaseException | None) -> bool:
    """Something in front of the manager answers for it (see ``ManagerUnavailable``)."""
    if isinstance(exc, BadAnswer):
        return True
    return isinstance(exc, Weather) and 400 <= exc.status < 500 and exc.status not in (408, 429)
