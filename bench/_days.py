"""The figures of ``bench/run_days.py``: the supervisor's RSS, open descriptors and threads,
sampled over days of run-phase ticks, judged after a warm-up (pure: samples in, rows out).

Growth is the **floor** of the last window against the floor of the first (the least value
seen in each): a daemon restart opens descriptors and threads for a moment and lets them go,
a sawtooth whose floor stays put; a leak raises the floor. The RSS target is DESIGN principle
14's, 2 MiB over four days of ticks, scaled to the simulated days actually measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from _harness import Row, at_most, info

MIB = 1 << 20
DAY_S = 86_400.0
RSS_GROWTH_MIB_PER_4_DAYS = 2.0
"""docs/architecture.md, rule 11: at most 2 MiB of RSS growth over four days of the run phase's
ticks."""


@dataclass(frozen=True)
class Sample:
    t: float  # wall seconds from the start of sampling
    rss: int  # bytes
    fds: int
    threads: int


@dataclass(frozen=True)
class Windows:
    """Where the samples are judged: after ``warm_s``, a first and a last window of
    ``window_s`` each (wall seconds from the start of sampling)."""

    warm_s: float
    window_s: float
    end_s: float

    @property
    def first(self) -> tuple[float, float]:
        return self.warm_s, self.warm_s + self.window_s

    @property
    def last(self) -> tuple[float, float]:
        return self.end_s - self.window_s, self.end_s


def windows_for(duration_s: float) -> Windows:
    """A warm-up of a tenth of the run (5 s at least: the first restarts, the first of every
    tick), then windows of a tenth of it (5 s at least)."""
    warm = max(5.0, duration_s / 10)
    window = max(5.0, duration_s / 10)
    return Windows(warm, window, duration_s)


def _in(samples: Sequence[Sample], span: tuple[float, float]) -> list[Sample]:
    return [s for s in samples if span[0] <= s.t <= span[1]]


def slope_per_s(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(x, y)`` points (0 for fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


@dataclass(frozen=True)
class Judged:
    """One quantity over the run: floors of the first and last windows, its most after the
    warm-up, and its least-squares slope per simulated day."""

    first: float
    last: float
    high: float
    per_day: float

    @property
    def growth(self) -> float:
        return self.last - self.first


def judge(samples: Sequence[Sample], win: Windows, cadence: float, pick: str) -> Judged | None:
    """``pick`` names a field of :class:`Sample`; None where a window holds no sample."""
    first, last = _in(samples, win.first), _in(samples, win.last)
    after = [s for s in samples if s.t >= win.warm_s]
    if not first or not last:
        return None
    values = [float(getattr(s, pick)) for s in after]
    slope = slope_per_s([(s.t * cadence, float(getattr(s, pick))) for s in after])
    return Judged(
        first=min(float(getattr(s, pick)) for s in first),
        last=min(float(getattr(s, pick)) for s in last),
        high=max(values),
        per_day=slope * DAY_S,
    )


def rss_target_mib(win: Windows, cadence: float) -> float:
    """2 MiB for four simulated days, in proportion to the days between the two windows."""
    days = (win.last[1] - win.first[0]) * cadence / DAY_S
    return RSS_GROWTH_MIB_PER_4_DAYS * days / 4


def rows(samples: Sequence[Sample], win: Windows, cadence: float, restarts: int) -> list[Row]:
    days = win.end_s * cadence / DAY_S
    span = f"{days:.2f} simulated days"
    out = [info(f"days of run-phase ticks simulated ({win.end_s:.0f} s at {cadence:g}x)", days,
                "days"),
           info("daemon restarts (SIGKILL by the bench, the supervisor restarts it)", restarts,
                "restarts")]  # fmt: skip
    rss = judge(samples, win, cadence, "rss")
    fds = judge(samples, win, cadence, "fds")
    threads = judge(samples, win, cadence, "threads")
    if rss is None or fds is None or threads is None:
        return [*out, Row("run days [NOT MEASURED: a window without samples]", None, "", "",
                          False)]  # fmt: skip
    target = rss_target_mib(win, cadence)
    out += [
        info("RSS, floor of the first window after warm-up", rss.first / MIB, "MiB"),
        info("RSS, floor of the last window", rss.last / MIB, "MiB"),
        at_most(f"RSS growth, last window's floor - first's ({span}; target 2 MiB / 4 days, "
                "scaled)", rss.growth / MIB, "MiB", round(target, 3)),
        info("RSS slope after warm-up (least squares)", rss.per_day / MIB, "MiB/day"),
        info("RSS max after warm-up", rss.high / MIB, "MiB"),
        info("open fds, floor of the first window", fds.first, "fds"),
        at_most(f"open fds growth, last window's floor - first's ({span})", fds.growth, "fds", 0),
        info("open fds, most after warm-up (the sawtooth's top)", fds.high, "fds"),
        info("threads, floor of the first window", threads.first, "threads"),
        at_most(f"threads growth, last window's floor - first's ({span})", threads.growth,
                "threads", 0),
        info("threads, most after warm-up", threads.high, "threads"),
    ]  # fmt: skip
    return out
