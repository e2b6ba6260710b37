"""The run phase's health policy: what the supervisor saw, judged ``healthy``, ``degraded`` or
``broken`` (issue 34). Pure: :func:`assess` takes the policy, the memory of earlier observations
(:class:`HealthState`) and one :class:`~cuzk_supervisor.core.healthevidence.Observation`, and
returns the new memory and an :class:`Assessment`. No clock: every time is the observation's.

Each rule is one function over its own slice of the memory (:mod:`.healthrules`); a finding
names what (``kind``), since when, in words, and whether a restart of the daemon can help. No
demand is never trouble: a rule that needs work to judge (a stuck partition, failing proofs,
throttled clocks) only counts what the daemon was given to do, and an idle machine with nothing
queued stays healthy. What follows from a finding is the ladder's (:mod:`.healthladder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum

from cuzk_supervisor.core import healthgpu
from cuzk_supervisor.core import healthrules as rules
from cuzk_supervisor.core.healthevidence import Observation
from cuzk_supervisor.core.healthpolicy import HealthPolicy


class Level(IntEnum):
    HEALTHY = 0
    DEGRADED = 1
    BROKEN = 2

    @property
    def word(self) -> str:
        return self.name.lower()


GPU_LOST, ECC, PAGES_RETIRED = rules.GPU_LOST, rules.ECC, rules.PAGES_RETIRED
PROOFS_FAILING, STUCK, THROTTLED = rules.PROOFS_FAILING, rules.STUCK, rules.THROTTLED
DAEMON_EXITS = "daemon-exits"
CRASH_LOOP = "crash-loop"
KINDS = (GPU_LOST, ECC, PAGES_RETIRED, PROOFS_FAILING, STUCK, THROTTLED, DAEMON_EXITS, CRASH_LOOP)


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    level: Level
    since: float
    reason: str
    restart_helps: bool = False
    """A restart of the daemon may clear it (a stuck partition on a live GPU, a first ECC
    error, proofs failing before any restart)."""
    gpu: int | None = None
    latest: float = 0.0
    """When its latest evidence came (``since`` for a condition that lasts): what the machine
    delivers now is counted from there."""
    completed_since: int | None = None
    """Proofs completed since ``latest`` (what the machine delivered since); None: unknown."""

    @property
    def key(self) -> tuple[str, int, int, float]:
        """Its episode (what, where, since) and level: a change of any is said."""
        return (self.kind, int(self.level), -1 if self.gpu is None else self.gpu, self.since)

    def words(self) -> str:
        return f"{self.level.word}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Assessment:
    at: float
    findings: tuple[Finding, ...] = ()

    @property
    def level(self) -> Level:
        return max((f.level for f in self.findings), default=Level.HEALTHY)

    @property
    def reason(self) -> str:
        """The findings in words, the worst first ("" when healthy)."""
        ordered = sorted(self.findings, key=lambda f: (-f.level, f.since))
        return "; ".join(f.words() for f in ordered)

    def worst(self) -> Finding | None:
        return min(self.findings, key=lambda f: (-f.level, f.since), default=None)


@dataclass(frozen=True, slots=True)
class HealthState:
    """What the policy remembers between observations."""

    life: rules.Life = field(default_factory=rules.Life)
    proofs: rules.ProofStreak = field(default_factory=rules.ProofStreak)
    gpus: healthgpu.GpuMemory = field(default_factory=healthgpu.GpuMemory)
    partitions: rules.PartitionMemory = field(default_factory=rules.PartitionMemory)
    exits: tuple[float, ...] = ()
    exits_seen: int | None = None

    @classmethod
    def seeded(cls, gpu_stage_s: tuple[float, ...]) -> HealthState:
        """A fresh memory that already knows the GPU stage's times measured in the bench."""
        memory = rules.PartitionMemory(reference=tuple(gpu_stage_s[-rules.REFERENCE_SAMPLES :]))
        return cls(partitions=memory)


def assess(
    policy: HealthPolicy, state: HealthState, obs: Observation
) -> tuple[HealthState, Assessment]:
    """One observation judged; returns the memory to give the next call."""
    life, counts = rules.count_proofs(state.life, obs)
    proofs, failing = rules.proofs_failing(policy, state.proofs, life, counts, obs.at)
    partitions, stuck = rules.stuck_partitions(policy, state.partitions, obs, counts.failed)
    busy = rules.busy_gpus(obs.daemon, partitions.tainted)
    gpus, gpu_findings = healthgpu.gpu_conditions(policy, state.gpus, obs, life.number, busy)
    exits, exits_seen, exit_finding = _exits(policy, state, obs)
    raw = [*failing, *gpu_findings, *stuck, *exit_finding]
    if obs.crash_loop:
        raw.append(rules.RawFinding(CRASH_LOOP, 2, obs.at, f"the daemon crash-loops: "
                                    f"{obs.crash_loop}"))  # fmt: skip
    lost = {f.gpu for f in raw if f.kind == GPU_LOST}
    findings = tuple(
        Finding(
            kind=f.kind,
            level=Level(f.level),
            since=f.since,
            reason=f.reason,
            # A partition stuck on a GPU that is gone is that GPU's loss, not a hang to clear.
            restart_helps=f.restart_helps and not (f.kind == STUCK and f.gpu in lost),
            gpu=f.gpu,
            latest=f.since if f.latest is None else f.latest,
            completed_since=life.completed_since(f.since if f.latest is None else f.latest),
        )
        for f in raw
    )
    new = replace(state, life=life, proofs=proofs, gpus=gpus, partitions=partitions, exits=exits,
                  exits_seen=exits_seen)  # fmt: skip
    return new, Assessment(obs.at, findings)


def _exits(
    policy: HealthPolicy, state: HealthState, obs: Observation
) -> tuple[tuple[float, ...], int, list[rules.RawFinding]]:
    """The daemon's exits (crashes, kills) stamped when first seen; too many in the window is
    degraded (each was followed by a restart: the keeper's)."""
    seen = state.exits_seen if state.exits_seen is not None else obs.daemon_exits
    new = max(0, obs.daemon_exits - seen)
    stamps = (*state.exits, *([obs.at] * new))
    recent = tuple(t for t in stamps if obs.at - t < policy.exit_window_s)
    found: list[rules.RawFinding] = []
    if policy.daemon_exits > 0 and len(recent) >= policy.daemon_exits:
        window = rules.duration(policy.exit_window_s)
        found.append(rules.RawFinding(
            DAEMON_EXITS, 1, recent[0],
            f"the daemon exited {len(recent)} times within {window} (each restarted)",
        ))  # fmt: skip
    return recent, obs.daemon_exits, found
