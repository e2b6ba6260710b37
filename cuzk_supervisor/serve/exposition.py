"""The Prometheus text exposition format (version 0.0.4), for our own few metric families.

What ``serve.metrics`` needs and nothing more: gauges, counters and one histogram, with or
without labels, each family rendered as ``# HELP``, ``# TYPE`` and its samples. The output is
byte for byte what prometheus_client's ``generate_latest`` wrote for the same families (the
library ``/metrics`` was made with before; tests/test_metrics.py compares the two, and parses
ours with its parser): a counter's name gets ``_total``, label names are sorted in each sample,
label values and help texts are escaped the same way, floats are written as Go writes them
(``floatToGoString``), a histogram's buckets are cumulative and end with ``+Inf``, then
``_count`` and ``_sum``. No ``_created`` series. About 300 KiB less resident memory than the
library (and its ``wsgiref``, ``http.server`` and ``urllib.request``), which the supervisor
would hold for the days it runs.

Each update is a dict lookup and a float store; rendering happens only when ``/metrics`` is
scraped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

Labels = tuple[str, ...]


def go_float(value: float) -> str:
    """A float as Go's ``strconv.FormatFloat(f, 'g', -1, 64)`` writes it, the way
    prometheus_client's ``floatToGoString`` does (``1.0``, ``1.7e+09``, ``NaN``, ``+Inf``)."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    # Go switches to exponents sooner than Python (only positive values matter here).
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _sample(name: str, labels: Sequence[tuple[str, str]], value: float) -> str:
    if not labels:
        return f"{name} {go_float(value)}\n"
    pairs = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels))
    return f"{name}{{{pairs}}} {go_float(value)}\n"


class Family:
    """One metric family: its name, help, type, label names and a value per label set."""

    kind = "untyped"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: list[Family] | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[Labels, Child] = {}
        if not self.labelnames:
            self._children[()] = self._child()
        if registry is not None:
            registry.append(self)  # rendered in the order registered

    def _child(self) -> Child:
        return Child()

    @property
    def exposed_name(self) -> str:
        return self.name

    def labels(self, *values: str, **named: str) -> Child:
        """The series of these label values (made at first use), as prometheus_client's."""
        if named:
            values = tuple(named[n] for n in self.labelnames)
        key = tuple(str(v) for v in values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected")
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._child()
        return child

    def remove(self, *values: str) -> None:
        self._children.pop(tuple(str(v) for v in values), None)

    def clear(self) -> None:
        self._children.clear()

    # The unlabelled family is its own one series.
    def set(self, value: float) -> None:
        self._children[()].set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._children[()].inc(amount)

    def render(self) -> str:
        name = self.exposed_name
        head = f"# HELP {name} {_escape_help(self.documentation)}\n# TYPE {name} {self.kind}\n"
        return head + "".join(self._samples(name))

    def _samples(self, name: str) -> Iterator[str]:
        for key, child in self._children.items():
            yield _sample(name, tuple(zip(self.labelnames, key, strict=True)), child.value)


class Child:
    """One series' value."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Gauge(Family):
    kind = "gauge"


class Counter(Family):
    kind = "counter"

    @property
    def exposed_name(self) -> str:
        return self.name + "_total"


class HistogramChild(Child):
    """Counts per bucket (not cumulative: made so when rendered) and the sum."""

    __slots__ = ("bounds", "count", "counts")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        super().__init__()
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.count = 0.0

    def observe(self, amount: float) -> None:
        self.value += amount
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if amount <= bound:
                self.counts[i] += 1
                break


class Histogram(Family):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        *,
        buckets: Sequence[float],
        registry: list[Family] | None = None,
    ) -> None:
        self.bounds = (*(float(b) for b in buckets), math.inf)
        super().__init__(name, documentation, registry=registry)

    def _child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def observe(self, amount: float) -> None:
        child = self._children[()]
        assert isinstance(child, HistogramChild)
        child.observe(amount)

    def _samples(self, name: str) -> Iterator[str]:
        child = self._children[()]
        assert isinstance(child, HistogramChild)
        total = 0.0
        for bound, count in zip(child.bounds, child.counts, strict=True):
            total += count
            yield _sample(f"{name}_bucket", (("le", go_float(bound)),), total)
        yield _sample(f"{name}_count", (), child.count)
        yield _sample(f"{name}_sum", (), child.value)


def render(families: Sequence[Family]) -> bytes:
    """The exposition of ``families``, in their order."""
    return "".join(family.render() for family in families).encode("utf-8")
