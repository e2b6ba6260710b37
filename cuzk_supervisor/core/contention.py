"""How partition synthesis slows as more partitions share the machine, as measured upstream
(``docs/daemon.md``: one RTX 5070 Ti, 512 GiB host): seconds per proof at 1, 2, 5, 7, 10
and 12 partition workers with the pipeline kept full.

The rate between the table's rows is interpolated linearly; past its last row the rate stays
at that row's (the table's plateau: 10 and 12 workers measured the same; docs/daemon.md says more
than ~16 is slower, with no figure). Pure numbers.
"""

from __future__ import annotations

from bisect import bisect_left

SECONDS_PER_PROOF: tuple[tuple[int, float], ...] = (
    (1, 290.0), (2, 152.0), (5, 68.4), (7, 53.3), (10, 42.5), (12, 42.5),
)  # fmt: skip
MEASURED_UP_TO = SECONDS_PER_PROOF[-1][0]
PARTITIONS = 10
"""The table's proofs: 32 GiB PoRep, 10 partitions."""


def proofs_per_hour(workers: float) -> float:
    """The table's rate with ``workers`` partitions synthesizing all the time (0 for none)."""
    if workers <= 0:
        return 0.0
    xs = [w for w, _ in SECONDS_PER_PROOF]
    rates = [3600.0 / s for _, s in SECONDS_PER_PROOF]
    if workers <= xs[0]:
        return rates[0] * workers / xs[0]
    if workers >= xs[-1]:
        return rates[-1]
    i = bisect_left(xs, workers)
    if xs[i] == workers:
        return rates[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], rates[i - 1], rates[i]
    return y0 + (y1 - y0) * (workers - x0) / (x1 - x0)


def partition_seconds(workers: float) -> float:
    """Seconds one partition takes with ``workers`` synthesizing (the table's s/proof x W / 10)."""
    rate = proofs_per_hour(workers)
    return 3600.0 / rate * max(1.0, workers) / PARTITIONS if rate > 0 else 0.0


def gain(workers: int, more: int) -> float:
    """The table's rate at ``more`` workers over its rate at ``workers``."""
    base = proofs_per_hour(workers)
    return proofs_per_hour(more) / base if base > 0 else 1.0


def plateau(workers: int) -> bool:
    """Whether more workers than ``workers`` gain under 5 % by the table (the memory bandwidth,
    not the workers, is then the limit)."""
    return gain(workers, max(workers + 2, MEASURED_UP_TO)) < 1.05
