"""Incident I4 end to end with the kernel's real OOM killer: the supervisor runs inside a memory
cgroup with a hard limit, the simulated daemon (its child, so inside too) really allocates its
scaled memory, and the supervisor finds its own cgroup from /proc/self/cgroup like in a
container. One more test takes the same path with the simulator's own OOM switch, no cgroup.

Sizes (real MiB) at ``--memory-scale 4`` (4 real MiB per simulated GiB), PCE cached:

    idle daemon: SRS 44 + PCE 26 simulated GiB      = 280 MiB  + baseline ≈ 330 MiB
    each active partition: 15 simulated GiB         =  60 MiB
    10 active (every single proof at >= 10 workers) = 880 MiB  + baseline ≈ 930 MiB
    11 active (bench, 2 proofs at once, 11 workers) = 940 MiB  + baseline ≈ 990 MiB
    12 active (bench at 12 workers)                 = 1000 MiB + baseline ≈ 1050 MiB

"baseline" is the anonymous memory of the supervisor and the daemon's interpreter, ≈ 50 MiB
together (measured: the shared libraries' pages are charged to whoever read them first, outside
this cgroup). The limit, 960 MiB, sits half a partition between 10 and 11 active: every single
proof plateaus for one partition time (~2 s at time scale 25) 97 % full, which the supervisor's
critical level (< 5 % headroom) must see, and a benchmark at 11 or 12 workers goes over it,
which the kernel answers with SIGKILL. The override (``workers`` 12) is two workers too many,
so the supervisor has to step down more than once before the kernel would act.

``warmup_workers`` = ``workers`` so the warmup proof is already the 10-active plateau (no slow
5-round warmup at 2 workers), and the PCE cache an earlier run would have left is put in place
(the first proof would otherwise extract it, slower and with less memory).
"""

from __future__ import annotations

import re
import signal
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cgrouphelpers import MIB, MemoryCgroup, cgroups_writable
from daemonhelpers import Supervisor, processes_mentioning
from lifecyclehelpers import lifecycle_env, reports
from managerhelpers import ManagerProcess
from pacehelpers import scaled
from simhelpers import poll_until

from cuzk_supervisor import exitcodes
from cuzk_supervisor.sim.daemon import model
from cuzk_supervisor.sim.daemon.residency import pce_cache_path

pytestmark = pytest.mark.slow

MEMORY_SCALE = 4  # real MiB per simulated GiB


def time_scale() -> float:
    """Simulated seconds per real second: one partition time ≈ 2 s (longer on a slow machine)."""
    return scaled(25)


BASELINE_MIB = 50
WORKERS = 12
IDLE_MIB = (model.SRS_GIB["porep-32g"] + model.PCE_GIB) * MEMORY_SCALE + BASELINE_MIB


def plateau_mib(active: int) -> float:
    """The cgroup's expected working set with ``active`` partitions synthesizing."""
    return IDLE_MIB + active * model.PARTITION_GIB * MEMORY_SCALE


# Half a partition above 10 active, half a partition below 11 active (≈ 30 MiB each way).
LIMIT_MIB = round((plateau_mib(10) + plateau_mib(11)) / 2)
SLOTS_RE = re.compile(r"cuzk engine started.*?synthesis_slots=(\d+)")


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ManagerProcess]:
    mgr = ManagerProcess.start(tmp_path / "manager.db", "--check-interval", "1")
    yield mgr
    mgr.kill()


def _cgroup(limit_mib: int) -> Iterator[MemoryCgroup]:
    writable, why = cgroups_writable()
    if not writable:
        pytest.skip(f"needs a writable memory cgroup: {why}")
    cgroup = MemoryCgroup.create("oom-e2e", limit_bytes=limit_mib * MIB)
    try:
        yield cgroup
    finally:
        cgroup.remove()


@pytest.fixture
def memory_cgroup() -> Iterator[MemoryCgroup]:
    yield from _cgroup(LIMIT_MIB)


class UsageRecorder:
    """Polls the cgroup's usage every few ms, for the failure messages: what the memory did."""

    def __init__(self, cgroup: MemoryCgroup) -> None:
        self.cgroup = cgroup
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.samples.append((time.monotonic(), self.cgroup.usage()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def levels(self) -> str:
        """The plateaus (usage held for >= 0.3 s), in MiB, in order."""
        found: list[int] = []
        start = 0
        for i in range(1, len(self.samples) + 1):
            if i == len(self.samples) or abs(self.samples[i][1] - self.samples[start][1]) > 8 * MIB:
                if self.samples and self.samples[i - 1][0] - self.samples[start][0] >= 0.3:
                    level = self.samples[start][1] // MIB
                    if not found or found[-1] != level:
                        found.append(level)
                start = i
        peak = self.cgroup.peak()
        return (
            f"limit {LIMIT_MIB} MiB, plateaus {found} MiB, peak "
            f"{peak // MIB if peak else '?'} MiB (expected: idle ≈ {IDLE_MIB:.0f}, 10 active ≈ "
            f"{plateau_mib(10):.0f}, 11 ≈ {plateau_mib(11):.0f}, 12 ≈ {plateau_mib(12):.0f})"
        )


def _settings(tmp_path: Path, manager_url: str, **overrides: Any) -> dict[str, str]:
    # The PCE cache an earlier run would have left.
    params = tmp_path / "params"
    params.mkdir(exist_ok=True)
    pce_cache_path(params).write_text('{"circuit_id": "porep-32g", "simulated_gib": 26.0}\n')
    settings: dict[str, Any] = {
        "workers": WORKERS,
        "warmup_workers": WORKERS,
        "bench_count": 2,
        "bench_precision": 0,  # the batch of 2 (issue 32: an imprecise rate goes on past it)
        "bench_concurrency": 2,
        "exit_after_run": "true",
    }
    settings.update(overrides)
    return lifecycle_env(
        tmp_path,
        manager_url,
        time_scale=time_scale(),
        memory_scale=MEMORY_SCALE,
        **settings,
    )


def _slots_per_start(tmp_path: Path) -> list[int]:
    """The worker count each daemon start really ran with, from the daemon's own log."""
    log = tmp_path / "log" / "cuzk.log"
    return [int(n) for n in SLOTS_RE.findall(log.read_text())] if log.exists() else []


def _rendered_workers(tmp_path: Path) -> int:
    """``partition_workers`` in the daemon config the supervisor rendered last."""
    config = tomllib.loads((tmp_path / "run" / "cuzk.toml").read_text())
    return int(config["synthesis"]["partition_workers"])


def _is_memory_critical(event: dict[str, Any]) -> bool:
    return str(event.get("cause", "")).startswith("memory critical")


def _after(events: list[dict[str, Any]], first: dict[str, Any]) -> list[dict[str, Any]]:
    return events[events.index(first) + 1 :]


# --- the kernel's OOM killer --------------------------------------------------------------


@pytest.mark.cgroup
def test_where_8_of_12_fit_it_steps_down_to_what_fits_before_the_kernel_kills(
    tmp_path, manager, memory_cgroup
):
    env = _settings(tmp_path, manager.url, proactive_oom="true")
    usage = UsageRecorder(memory_cgroup)
    run = Supervisor([], prefix=memory_cgroup.prefix(), command="run", env=env)
    try:
        code = run.wait(75)
    finally:
        run.kill()
        usage.stop()
    memory = usage.levels()
    kills = [e for e in run.named("daemon.exited") if e["exit_kind"] == "oom_killed"]
    assert memory_cgroup.oom_kills() == 0, f"the kernel acted first: {kills}; {memory}"
    assert code == exitcodes.OK, f"{run.named('lifecycle.failed')}; {memory}"

    # The supervisor found its own cgroup (nothing pointed it there) and watched its limit.
    criticals = run.named("memory.risk_critical")
    assert criticals, memory
    assert {e["cgroup_limit"] for e in criticals} == {LIMIT_MIB * MIB}
    # 12 workers is too many: it stepped down because memory was critical, never because the
    # kernel had killed, and a step with a measurement went to what it said fits, not one worker
    # at a time. 8 of the 12 (810 MiB, 84%) keep the watch at ok, 9 (870 MiB, 91%) hold at warn,
    # 10 (930 MiB) are critical. The fit aims at ok (20% headroom): 7 or 8, also from a sample
    # taken on the ramp (the trend fired first: the active partitions not all allocated, ~15% low
    # per partition, which alone said 9), since the fit then plans with the partitions' plateau
    # figure (core.memfit.plateau_per_partition), not the low reading. On a loaded machine the
    # trend can fire first while the daemon says no partition is active (the warmup's PCE
    # extraction): nothing to measure, so that step is one worker (memory.no_fit), and the
    # next one, measured, goes to the fit.
    steps = run.named("plan.step_down")
    decided = [e for e in run.events if e.get("event") in ("memory.fit", "memory.no_fit")]
    fits = [(e["workers"], e["reason"]) for e in decided if e["event"] == "memory.fit"]
    why = f"{decided}; {steps}; {criticals}; {memory}"
    assert 1 <= len(steps) <= 3, why
    assert len(decided) == len(steps), why
    assert all(_is_memory_critical(step) for step in steps), steps
    running = WORKERS
    for step, decision in zip(steps, decided, strict=True):
        if decision["event"] == "memory.fit":
            assert step["full_workers"] == min(decision["workers"], running - 1), why
        else:
            assert decision.get("active_partitions") == 0, why  # the daemon said so
            assert step["full_workers"] == running - 1, why
        running = step["full_workers"]
    final = steps[-1]["full_workers"]
    assert fits, "no measured step"
    # Every critical level was acted on: none came after the last step down (with proactive_oom
    # on, no proof runs on at a critical level), and the plan it finished with fits: at most 10
    # workers, the most this limit holds in a benchmark.
    # A critical level sampled while the daemon's tree is empty (daemon_rss 0: the old daemon
    # gone, its memory still charged to the cgroup while the kernel frees it, the new one not
    # yet known) has no proof running on it and no daemon to step down: CI saw one such sample
    # during a relaunch once in eight full runs, and the lifecycle went on with no kill.
    unanswered = [
        e
        for e in _after(run.events, steps[-1])
        if e.get("event") == "memory.risk_critical" and e.get("daemon_rss") != 0
    ]
    assert unanswered == [], f"critical memory left unanswered: {unanswered}; {memory}"
    assert final in (7, 8), f"{fits}; {steps}; {memory}"
    assert plateau_mib(final) < 0.95 * LIMIT_MIB  # what it ended on holds below critical
    (result,) = run.named("bench.result")
    assert result["workers"] == final
    # Each daemon really ran with the plan of its time: 12, then each step's count.
    assert _slots_per_start(tmp_path) == [WORKERS, *(s["full_workers"] for s in steps)]
    assert _rendered_workers(tmp_path) == final
    (bench,) = reports(manager, "/bench-done")
    assert bench["json"]["rate"] > 0
    assert processes_mentioning(str(tmp_path / "run")) == []


@pytest.mark.cgroup
def test_kernel_oom_kill_is_recognised_from_the_cgroup_counter_and_the_next_attempt_steps_down(
    tmp_path, manager, memory_cgroup
):
    env = _settings(tmp_path, manager.url, proactive_oom="false")
    usage = UsageRecorder(memory_cgroup)
    run = Supervisor([], prefix=memory_cgroup.prefix(), command="run", env=env)

    def unrequested_exit() -> list[dict[str, Any] | None]:
        found: list[dict[str, Any] | None] = [
            e for e in run.named("daemon.exited") if e["exit_kind"] != "clean"
        ]
        return found or ([None] if run.proc.poll() is not None else [])

    try:
        exited, *_ = poll_until(unrequested_exit, 60, what="the daemon's first unrequested exit")
        assert exited is not None, f"the supervisor exited first; {usage.levels()}"
        # The next attempt: a daemon started (and ready) after the step down.
        poll_until(
            lambda: len(run.named("daemon.ready")) >= 2 and len(_slots_per_start(tmp_path)) >= 2,
            30,
            what="the next daemon",
        )
        supervisor_alive = run.proc.poll() is None
        run.signal(signal.SIGTERM)
        run.wait(30)
    finally:
        run.kill()
        usage.stop()
    memory = usage.levels()
    # The kernel killed the daemon, the biggest process, and not the supervisor: the cgroup's
    # counter went up by one, the daemon died of SIGKILL and the supervisor lived on.
    assert memory_cgroup.oom_kills() == 1, memory
    assert exited["exit_kind"] == "oom_killed", f"{exited}; {memory}"
    assert exited["exit_signal"] == signal.SIGKILL
    assert exited["cgroup_oom_kills"] == 1
    assert "cgroup oom_kill counter +1" in exited["exit_reason"]
    assert exited["pid"] == run.named("daemon.spawned")[0]["pid"] != run.proc.pid
    assert supervisor_alive
    # It saw the critical level coming (every single proof plateaus at it) and did not act.
    assert run.named("memory.critical_ignored"), memory
    # The exit was classified from the counter, then the plan stepped down to 11 workers and
    # the next daemon really ran with 11.
    step, *_ = run.named("plan.step_down")
    assert step["cause"].startswith("daemon OOM-killed"), step
    assert step["full_workers"] == WORKERS - 1
    assert run.events.index(exited) < run.events.index(step)
    assert _slots_per_start(tmp_path)[:2] == [WORKERS, WORKERS - 1]
    assert _rendered_workers(tmp_path) == WORKERS - 1
    assert processes_mentioning(str(tmp_path / "run")) == []


# --- the same path through the simulator's OOM switch (no cgroup needed) --------------------


def test_simulated_oom_at_three_workers_steps_down_and_completes_at_two(tmp_path, manager):
    # A cgroup-like folder: the sim bumps oom_kill in its memory.events, the supervisor reads it.
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    # SRS 44 + PCE 26 + 3 partitions × 15 = 115 simulated GiB > 105 >= 100 at 2 workers; the
    # warmup at 2 workers peaks at 84 (PCE extraction).
    env = lifecycle_env(
        tmp_path, manager.url, workers=3, warmup_workers=2, exit_after_run="true", bench_count=2,
        sim_faults=("oom:105,times=0",), sim_args=("--cgroup-dir", str(cgroup)),
        cgroup_root=cgroup,
    )  # fmt: skip
    run = Supervisor([], command="run", env=env)
    try:
        code = run.wait(60)
    finally:
        run.kill()
    assert code == exitcodes.OK, run.named("lifecycle.failed")
    (exited,) = [e for e in run.named("daemon.exited") if e["exit_kind"] != "clean"]
    assert exited["exit_kind"] == "oom_killed"
    assert exited["cgroup_oom_kills"] == 1
    assert "oom_kill 1" in (cgroup / "memory.events").read_text()
    (step,) = run.named("plan.step_down")
    assert step["cause"].startswith("daemon OOM-killed")
    assert step["full_workers"] == 2
    assert run.events.index(exited) < run.events.index(step)
    (result,) = run.named("bench.result")
    assert result["workers"] == 2
    # Warmup at 2, full at 3 (killed), then 2 for warmup, settle and bench. The keeper restarts
    # a killed daemon after its backoff (0.1-0.2 s here) with the plan it had; where the step
    # down comes later (a loaded machine), that one start at 3 is replaced (stepdown.relaunch).
    starts = _slots_per_start(tmp_path)
    assert starts[:2] == [2, 3]
    assert starts[2:] in ([2], [3, 2]), starts
    (bench,) = reports(manager, "/bench-done")
    assert bench["json"]["rate"] > 0
