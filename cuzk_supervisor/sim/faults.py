"""Fault switches: parsing ``KIND[:ARG][,KEY=VALUE]...`` and deciding when one is due (pure).

Carrying a fault out (cutting connections, exiting, ...) is ``chaos.py``'s job. A fault is
looked at only at *checkpoints* (``Point``: docs/simulator.md, "When a fault fires"); each kind
listens to some of them (``POINTS``).

The GPUs' faults (``gpu-lost``, ``xid``, ``throttle``, ``corrupt``, ``gpu-crash``, ``stuck``)
are described in ``gpufaults.py``; ``gpu-fault`` is an older name of ``gpu-lost`` (one
condition: the daemon's status, the fake NVML and the GPU steps all see the GPU lost).

The triggers ``after_proofs``, ``after_s`` and ``at_partition`` must all hold; ``times``
caps how often a fault fires (0 = every time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Point = Literal[
    "start", "timer", "partition", "finishing", "completed", "memory", "bind", "call", "gpu"
]

_PROCESS_POINTS: frozenset[Point] = frozenset({"start", "timer", "partition", "completed"})
# Which checkpoints each kind listens to.
POINTS: dict[str, frozenset[Point]] = {
    # Nobody is connected at start, so a bare `drop` waits for the first partition.
    "drop": frozenset({"timer", "partition", "completed"}),
    # A frozen path: as `drop`, but the connections stay open and go silent.
    "freeze": frozenset({"timer", "partition", "completed"}),
    # The server-side deadline (tonic's) fires ARG seconds before the client's own.
    "cancel-early": _PROCESS_POINTS,
    # One call answered CANCELLED "Timeout expired", as a server deadline that fired would.
    "cancel": frozenset({"call"}),
    "hang": _PROCESS_POINTS,
    "exit": _PROCESS_POINTS,
    "flood": _PROCESS_POINTS,
    "ignore-sigterm": _PROCESS_POINTS,
    "fork-grandchild": _PROCESS_POINTS,
    "oom": frozenset({"memory"}),
    "fail": frozenset({"partition", "finishing"}),
    "never-ready": frozenset({"bind"}),
    "addr-in-use": frozenset({"bind"}),
    # The GPUs' condition (gpufaults.py): kept in --gpu-dir, so it outlives the daemon.
    "gpu-lost": _PROCESS_POINTS,
    "xid": _PROCESS_POINTS,
    "throttle": _PROCESS_POINTS,
    "corrupt": _PROCESS_POINTS,
    "gpu-crash": _PROCESS_POINTS,
    # One partition's GPU step never ends.
    "stuck": frozenset({"gpu"}),
}
_ARG_REQUIRED = {
    "exit", "oom", "flood", "fork-grandchild", "freeze", "cancel-early", "cancel",
    "gpu-lost", "xid", "throttle", "corrupt", "gpu-crash",
}  # fmt: skip
_INDEX_ARG = {"exit", "flood", "gpu-lost", "corrupt", "gpu-crash"}
_AT_GPU_ARG = {"xid", "throttle"}  # NUMBER or NUMBER@GPU
# What ``cancel:CALL`` can cut: ``submit-before`` ends SubmitProof before the job is enqueued
# (the upload did not land), ``submit-after`` once it is (the answer is lost).
CANCEL_CALLS = ("submit-before", "submit-after", "await", "prove", "status", "metrics")
_NO_ARG = {"drop", "hang", "never-ready", "addr-in-use", "ignore-sigterm", "stuck"}
ALIASES = {"gpu-fault": "gpu-lost"}
"""Older names, each the same fault as the one it names (the spec's ``text`` keeps the name)."""
_TRIGGERS = ("after_proofs", "after_s", "at_partition", "times", "once")
DEFAULT_FAIL_MESSAGE = "simulated proving failure"


class FaultSpecError(ValueError):
    """A fault switch that does not parse; the message says which and why."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: str
    arg: str | None = None
    after_proofs: int | None = None
    after_s: float | None = None
    at_partition: int | None = None
    times: int = 1
    text: str = ""
    once: str | None = None
    """A marker file: the fault fires only if it does not exist, and creates it when it fires,
    so it fires once across restarts of the daemon (a one-off crash, not a crash loop)."""

    @property
    def call(self) -> str:
        """The call a ``cancel`` fault cuts: ``submit`` for both SubmitProof variants."""
        return "submit" if (self.arg or "").startswith("submit-") else self.arg or ""

    @property
    def number(self) -> float:
        """The numeric ARG (exit code, GiB limit, lines/s, seconds)."""
        return float(self.arg or 0)

    @property
    def message(self) -> str:
        return self.arg or DEFAULT_FAIL_MESSAGE


@dataclass(frozen=True, slots=True)
class Checkpoint:
    point: Point
    proofs_completed: int = 0
    elapsed_s: float = 0.0
    partition: int | None = None
    memory_gib: float = 0.0
    call: str | None = None
    """At ``call``: which RPC (``submit``, ``await``, ``prove``, ``status``, ``metrics``)."""


def _number(kind: str, key: str, text: str, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise FaultSpecError(f"fault {kind!r}: {key}={text!r} is not a number") from None
    if value < 0 or not math.isfinite(value):
        raise FaultSpecError(f"fault {kind!r}: {key} must be >= 0")
    return value


def parse_fault(text: str) -> FaultSpec:
    """One switch. Segments after a comma that are not ``trigger=value`` belong to the ARG,
    so ``fail:disk full, retry later`` keeps its comma."""
    raw = text.strip()
    segments = raw.split(",")
    head, options = [segments[0]], []
    for seg in segments[1:]:
        key = seg.split("=", 1)[0].strip()
        if "=" in seg and key in _TRIGGERS:
            options.append(seg)
        elif options:
            raise FaultSpecError(f"fault {raw!r}: unknown option {seg.strip()!r}")
        else:
            head.append(seg)
    kind, sep, arg = ",".join(head).partition(":")
    kind = ALIASES.get(kind.strip(), kind.strip())
    if kind not in POINTS:
        raise FaultSpecError(f"unknown fault kind {kind!r} (known: {', '.join(sorted(POINTS))})")
    arg_value: str | None = arg.strip() if sep else None
    if kind in _ARG_REQUIRED:
        if not arg_value:
            raise FaultSpecError(f"fault {kind!r} needs an argument ({kind}:VALUE)")
        if kind in _AT_GPU_ARG:
            number, _, gpu = arg_value.partition("@")
            _number(kind, "argument", number, integer=kind == "xid")
            if gpu:
                _number(kind, "GPU", gpu, integer=True)
        elif kind != "cancel":
            _number(kind, "argument", arg_value, integer=kind in _INDEX_ARG)
    if kind == "cancel" and arg_value not in CANCEL_CALLS:
        raise FaultSpecError(f"fault 'cancel' needs one of {', '.join(CANCEL_CALLS)} (cancel:CALL)")
    if kind in _NO_ARG and arg_value:
        raise FaultSpecError(f"fault {kind!r} takes no argument")
    fields: dict[str, float] = {}
    once: str | None = None
    for opt in options:
        key, value = (s.strip() for s in opt.split("=", 1))
        if key == "once":
            if not value.startswith("/"):
                raise FaultSpecError(f"fault {kind!r}: once= needs an absolute path")
            once = value
            continue
        fields[key] = _number(kind, key, value, integer=key != "after_s")
    return FaultSpec(
        kind=kind,
        arg=arg_value,
        after_proofs=int(fields["after_proofs"]) if "after_proofs" in fields else None,
        after_s=fields.get("after_s"),
        at_partition=int(fields["at_partition"]) if "at_partition" in fields else None,
        times=int(fields.get("times", 1)),
        once=once,
        text=raw,
    )


def parse_faults(flags: list[str], env: str | None) -> list[FaultSpec]:
    """All switches: each ``--fault`` flag, then ``CUZK_SIM_FAULTS`` split on ``;``."""
    texts = [*flags, *(env.split(";") if env else [])]
    return [parse_fault(t) for t in texts if t.strip()]


def is_due(spec: FaultSpec, fired: int, cp: Checkpoint) -> bool:
    """Whether ``spec``, having fired ``fired`` times, fires at checkpoint ``cp``."""
    if spec.times and fired >= spec.times:
        return False
    if cp.point not in POINTS[spec.kind]:
        return False
    if spec.kind == "cancel" and cp.call != spec.call:
        return False
    if spec.at_partition is not None:
        if cp.partition != spec.at_partition:
            return False
    elif spec.kind == "fail" and cp.point == "partition":
        return False  # without at_partition, a failure is decided when the proof ends
    if spec.after_proofs is not None and cp.proofs_completed < spec.after_proofs:
        return False
    if spec.after_s is not None and cp.elapsed_s < spec.after_s:
        return False
    return not (spec.kind == "oom" and cp.memory_gib <= spec.number)
