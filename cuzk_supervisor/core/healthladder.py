"""What a health assessment leads to: the escalation ladder (issue 34). Pure.

Three steps, each taken only where the one below does not do:

1. **say**: every change of the findings is said once (the ``setup`` tab, the terminal, the
   metrics); nothing is said while they stay the same, and "healthy again" when they clear;
2. **restart** the daemon, for a finding a restart can clear (a stuck partition on a live GPU, a
   first uncorrectable ECC error, proofs failing in a daemon life that was never restarted for
   it): once per episode, at most ``restart_limit`` times within ``restart_window_s``;
3. **tell** the manager, for ``broken`` that a restart cannot clear or did not (a GPU lost, the
   daemon crash-looping, proofs still failing after a restart; or a restart no longer allowed):
   the reason first, then ``/bench-done`` with the rate the machine now delivers (0 for a lost
   GPU or a daemon that crash-loops), which the manager holds to ``min_rate`` and, below it,
   kills and destroys the instance. A rate the manager would pass is not sent (it would only
   move the record back to ``bench_done``): the finding is said instead. Told once.

``top`` caps the ladder (``health_ladder``): ``say`` only says, ``restart`` never tells.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cuzk_supervisor.core.health import CRASH_LOOP, GPU_LOST, Assessment, Finding, Level
from cuzk_supervisor.core.healthrules import duration

STEPS = ("say", "restart", "tell")


@dataclass(frozen=True, slots=True)
class LadderPolicy:
    top: str = "tell"
    """The highest step taken (``say``, ``restart`` or ``tell``)."""
    restart_limit: int = 3
    restart_window_s: float = 86_400.0

    def allows(self, step: str) -> bool:
        return STEPS.index(step) <= STEPS.index(self.top)


@dataclass(frozen=True, slots=True)
class Say:
    level: Level
    text: str


@dataclass(frozen=True, slots=True)
class Restart:
    reason: str
    finding: Finding


@dataclass(frozen=True, slots=True)
class Tell:
    reason: str
    rate: float
    finding: Finding


Action = Say | Restart | Tell


@dataclass(frozen=True, slots=True)
class LadderState:
    said: frozenset[tuple[str, int, int, float]] = frozenset()
    """The keys of the findings last said (none: healthy)."""
    restarts: tuple[float, ...] = ()
    """When the ladder restarted the daemon (within the window)."""
    episodes: frozenset[tuple[str, int, float, int]] = frozenset()
    """(kind, GPU, since, level) of the findings already acted on or said as withheld."""
    told: str = ""


def _episode(finding: Finding) -> tuple[str, int, float, int]:
    """What was acted on: one finding from its ``since``, at one level (a degraded one that
    turns broken is acted on again)."""
    return (finding.kind, -1 if finding.gpu is None else finding.gpu, finding.since,
            int(finding.level))  # fmt: skip


def delivered_rate(finding: Finding, now: float, rate_time_scale: float) -> float:
    """Proofs per hour (on the bench's clock) the machine delivered since the finding's latest
    evidence; 0 for a lost GPU and a crash-looping daemon (nothing it proves from now on counts)."""
    if finding.kind in (GPU_LOST, CRASH_LOOP) or not finding.completed_since:
        return 0.0
    elapsed = max(now - max(finding.latest, finding.since), 1e-9)
    return finding.completed_since / elapsed * 3600.0 / max(rate_time_scale, 1e-9)


def climb(
    policy: LadderPolicy,
    state: LadderState,
    assessment: Assessment,
    *,
    min_rate: float,
    rate_time_scale: float = 1.0,
    judged: bool = True,
) -> tuple[LadderState, tuple[Action, ...]]:
    """The actions this assessment calls for, given what was done before. ``min_rate``: the
    manager's (proofs per hour); ``judged``: a manager judges a rate (not a local run)."""
    if state.told:
        return state, ()
    now = assessment.at
    actions: list[Action] = []
    keys = frozenset(f.key for f in assessment.findings)
    if keys != state.said:
        if assessment.findings:
            actions.append(Say(assessment.level, assessment.reason))
        elif state.said:
            actions.append(Say(Level.HEALTHY, "healthy again: nothing found"))
    restarts = tuple(t for t in state.restarts if now - t < policy.restart_window_s)
    # An episode ends with its finding (one that comes back begins a new one, a new since).
    current = {_episode(f) for f in assessment.findings}
    episodes = {e for e in state.episodes if e in current}
    told = ""
    can_restart = policy.allows("restart") and len(restarts) < policy.restart_limit
    for finding in sorted(assessment.findings, key=lambda f: (-f.level, f.since)):
        episode = _episode(finding)
        if episode in episodes:
            continue
        if finding.restart_helps and can_restart:
            episodes.add(episode)
            restarts = (*restarts, now)
            actions.append(Restart(f"restarting the daemon: {finding.reason}", finding))
            can_restart = False  # one restart at a time: see what it did first
            continue
        if finding.level < Level.BROKEN:
            if finding.restart_helps and policy.allows("restart"):
                episodes.add(episode)
                left = f"{len(restarts)} restarts within {duration(policy.restart_window_s)}"
                said = f"{finding.level.word}, not restarted ({left}): {finding.reason}"
                actions.append(Say(finding.level, said))
            continue
        episodes.add(episode)
        rate = delivered_rate(finding, now, rate_time_scale)
        if not policy.allows("tell") or not judged:
            why = "the ladder stops before telling the manager" if judged else "no manager"
            actions.append(Say(finding.level, f"broken, not told ({why}): {finding.reason}"))
        elif rate >= min_rate:
            actions.append(Say(finding.level, f"broken, not told: it still delivers "
                                              f"{rate:.1f} proofs/hour, at least min_rate "
                                              f"{min_rate:g}: {finding.reason}"))  # fmt: skip
        else:
            told = (
                f"broken: {finding.reason}; the machine now delivers {rate:.1f} proofs/hour, "
                f"below min_rate {min_rate:g}: /bench-done with that rate ends the instance"
            )
            actions.append(Tell(told, rate, finding))
            break
    new = replace(state, said=keys, restarts=restarts, episodes=frozenset(episodes), told=told)
    return new, tuple(actions)
